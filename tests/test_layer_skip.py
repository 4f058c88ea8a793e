"""Passes with sublayers left out (Target.skipping_pass), which self-speculative drafters draft with: checked against
a model with those layers removed (skipping both sublayers of a layer is the layer's absence), against each other
over every Target, and for what they leave in the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TARGET_KINDS, refusal, target_of

from specbench.decoding.target import LayerSkip
from specbench.targets.layer_skip import decoder_layers, skipped_sublayers
from specbench.targets.transformers import prune

NO_SKIP = LayerSkip(frozenset(), frozenset())


def _draft_logits(target, prompt, chain, skip):
    """Prefill ``prompt``, then skipping passes over the chain's first token and one token at a time after it, as a
    drafter runs them: the logits of every pass's rows, and the cache length after truncating back."""
    target.start(len(prompt) + len(chain) + 8)
    target.prefill(np.asarray(prompt, dtype=np.int64), False, 2)
    start = target.length
    rows = [target.skipping_pass(np.asarray(chain[:2], dtype=np.int64), skip)]
    for token in chain[2:]:
        rows.append(target.skipping_pass(np.asarray([token], dtype=np.int64), skip))
    assert target.length == start + len(chain)
    target.truncate(start)
    return torch.cat(rows).float(), target.length - start


@torch.inference_mode()
def test_skipping_every_sublayer_of_a_layer_is_the_model_without_it(tiny, prompt_ids):
    """Layer 0 of tiny-random's two kept, layer 1 skipped whole: the same logits as a copy pruned to layer 0 run on
    the same tokens; with nothing skipped, the target's own logits."""
    model = tiny.weights.module
    layers = len(decoder_layers(model))
    prompt, chain = prompt_ids[0], [5, 17, 23, 42]
    kept = [0]
    skip = LayerSkip(frozenset(range(1, layers)), frozenset(range(1, layers)))
    target = target_of("transformers", tiny)
    drafted, left = _draft_logits(target, prompt, chain, skip)
    assert left == 0
    # A real draft reads the prompt's entries as the full model wrote them, which a pruned copy cannot: compare the
    # copy with one skipping pass over the whole sequence from an empty cache.
    pruned = prune(model, kept).eval()
    target.start(16)
    first = target.skipping_pass(np.asarray(prompt + chain, dtype=np.int64), skip)
    target.truncate(0)
    expected = pruned(input_ids=torch.tensor([prompt + chain])).logits[0]
    torch.testing.assert_close(first.float(), expected.float(), rtol=1e-4, atol=1e-4)
    full, _ = _draft_logits(target, prompt, chain, NO_SKIP)
    expected_full = model(input_ids=torch.tensor([prompt + chain])).logits[0, len(prompt):]
    torch.testing.assert_close(full, expected_full.float(), rtol=1e-4, atol=1e-4)
    assert drafted.shape == full.shape and not torch.allclose(drafted, full)


@pytest.mark.parametrize("kind", [kind for kind in TARGET_KINDS if kind != "transformers"])
@torch.inference_mode()
def test_every_target_drafts_what_the_transformers_target_drafts(kind, tiny, prompt_ids):
    """Attention skipped in one layer, the MLP in another: the same logits over the reference (a full forward, the
    draft's rows skipping), the compiled target (eager over its fixed buffers) and the GPU path's stand-in."""
    skip = LayerSkip(frozenset({1}), frozenset({0}))
    prompt, chain = prompt_ids[1], [9, 31, 7, 64, 3]
    expected, _ = _draft_logits(target_of("transformers", tiny), prompt, chain, skip)
    got, left = _draft_logits(target_of(kind, tiny), prompt, chain, skip)
    assert left == 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_the_model_is_whole_again_after_a_skipping_pass_even_one_that_failed(tiny):
    model = tiny.weights.module
    layers = decoder_layers(model)
    skip = LayerSkip(frozenset({0}), frozenset({1}))
    with pytest.raises(RuntimeError, match="inside"):
        with skipped_sublayers(model, skip):
            assert "forward" in vars(layers[0].self_attn) and "forward" in vars(layers[1].mlp)
            raise RuntimeError("inside")
    assert not any("forward" in vars(sub) for layer in layers for sub in (layer.self_attn, layer.mlp))


@torch.inference_mode()
def test_the_reference_refuses_to_verify_over_a_draft_left_in_the_cache(tiny, prompt_ids):
    from specbench.decoding.target import VerifyInputs

    target = target_of("reference", tiny)
    target.start(64)
    target.prefill(np.asarray(prompt_ids[0], dtype=np.int64), False, 2)
    target.skipping_pass(np.asarray([3, 4], dtype=np.int64), LayerSkip(frozenset({0}), frozenset()))
    inputs = VerifyInputs(np.asarray([1]), np.asarray([target.length]), np.ones((1, 1), bool), target.length)
    assert "truncate" in refusal(target.verify, inputs, 1, 2)


def test_a_skip_set_for_another_model_is_refused_in_one_line():
    skip = LayerSkip(frozenset({2, 40}), frozenset({1}))
    message = refusal(skip.checked, 32, "skip_layers.json's llama-2-13b set")
    assert "[40]" in message and "0..31" in message and "another model" in message
    everything = LayerSkip(frozenset(range(4)), frozenset(range(4)))
    assert "every one" in refusal(everything.checked, 4, "drafter.skip")
    assert skip.checked(41, "x") is skip and len(skip) == 3


def test_a_target_without_the_capability_says_so(tiny):
    from specbench.decoding.target import Target

    class Bare(Target):  # the interface's own answer, which a new Target inherits until it implements the pass
        start = release = prefill = verify = keep = truncate = synchronize = upload = length = None

    assert "cannot run a pass with layers skipped" in refusal(Target.skipping_pass, Bare(), np.asarray([1]), NO_SKIP)


@pytest.mark.parametrize("kind", TARGET_KINDS)
@torch.inference_mode()
def test_a_pass_after_part_of_the_cache_is_the_pass_on_that_part_alone(kind, tiny, prompt_ids):
    """SWIFT's scoring pass: the answer so far read again after the prompt's entries alone, on a cache that holds the
    answer too, gives the logits of a cache of the prompt alone; and the cache is as it was once truncated back."""
    skip = LayerSkip(frozenset({0}), frozenset({1}))
    prompt, answer = prompt_ids[0], [7, 8, 9, 10, 11, 12]
    alone = target_of("transformers", tiny)
    alone.start(64)
    alone.prefill(np.asarray(prompt, dtype=np.int64), False, 2)
    expected = alone.skipping_pass(np.asarray(answer, dtype=np.int64), skip)
    target = target_of(kind, tiny)
    target.start(64)
    target.prefill(np.asarray(prompt + answer[:4], dtype=np.int64), False, 2)
    length = target.length
    got = target.skipping_pass(np.asarray(answer, dtype=np.int64), skip, after=len(prompt))
    target.truncate(length)
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-4, atol=1e-4)
    after_edit = target.skipping_pass(np.asarray(answer[4:], dtype=np.int64), NO_SKIP)
    torch.testing.assert_close(after_edit.float(), tiny.weights.module(input_ids=torch.tensor([prompt + answer])).logits[
        0, -2:].float(), rtol=1e-4, atol=1e-4)


def test_a_skip_set_written_in_a_config_is_read_or_refused_in_one_line():
    from specbench.drafters.layer_skipping import skip_set_setting

    assert skip_set_setting("skip", None) is None
    assert skip_set_setting("skip", {"attention": [3, 1], "mlp": []}) == LayerSkip(frozenset({1, 3}), frozenset())
    assert "drafter.skip.mlp must be a list of layer indices" in refusal(skip_set_setting, "skip",
                                                                          {"attention": [], "mlp": [-1]})
    assert "drafter.published_skip_sets.x must be" in refusal(skip_set_setting, "published_skip_sets.x", {"attn": []})
