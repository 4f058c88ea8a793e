"""The transformers target behind the loop's Target interface: the cache keyword of every transformers release,
the attention mask kept on the device and rewritten only where a pass adds nodes, the one packed read of the
choices, and the hidden states a drafter asks for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ScriptedDrafter

from specbench.decoding.contract import Draft
from specbench.decoding.loop import Decoder
from specbench.decoding.plan import plan_verification, verification_inputs
from specbench.targets.transformers import TransformersTarget, cache_keyword
from specbench.testing import greedy_reference


def test_the_cache_goes_under_the_keyword_the_model_takes(tiny):
    class OldSignature(torch.nn.Module):  # transformers before 5.24
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return None

    class NewSignature(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None):
            return None

    assert cache_keyword(OldSignature()) == "past_key_values"
    assert cache_keyword(NewSignature()) == "cache"
    import transformers
    from packaging.version import Version

    installed = "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"
    assert cache_keyword(tiny.weights.module) == installed


def full_mask(start: int, visible: np.ndarray) -> torch.Tensor:
    size = visible.shape[0]
    mask = torch.ones((1, 1, size, start + size), dtype=torch.bool)
    mask[0, 0, :, start:] = torch.from_numpy(visible)
    return mask


def test_the_mask_on_the_device_equals_a_freshly_built_one_step_after_step(tiny):
    target = TransformersTarget(tiny.weights.module)
    rng = np.random.default_rng(0)
    for start, size in [(5, 3), (9, 6), (7, 2), (40, 12), (12, 12), (3, 1)]:
        visible = rng.random((size, size)) < 0.5
        mask = target._attention_mask(start, torch.from_numpy(visible))
        assert torch.equal(mask, full_mask(start, visible))
        target._mask[:size, start : start + size] = True  # what verify does after the pass
    assert bool(target._mask.all())


def test_choices_are_one_block_with_the_first_best_index_on_ties(tiny):
    target = TransformersTarget(tiny.weights.module)
    reads = []
    download = target._download
    target._download = lambda tensor: reads.append(tensor.shape) or download(tensor)
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, -1.0, 0.5, 3.0], [0.1, 0.2, 0.3, 0.4]])
    choices = target._choices(logits, 2)
    assert len(reads) == 1
    assert choices.argmax.tolist() == [1, 0, 3]
    assert choices.top_ids[2].tolist() == [3, 2] and choices.top_ids.dtype == np.int64
    np.testing.assert_allclose(choices.top_logits[2], [0.4, 0.3], rtol=1e-6)


class FeatureReader(ScriptedDrafter):
    hidden_state_layers = (0, 2)

    def begin(self, prompt_ids):
        super().begin(prompt_ids)
        self.features = []

    def accept(self, accepted_ids, outcome):
        self.features.append(outcome.hidden_states)


def test_a_drafter_gets_the_hidden_states_of_the_tokens_each_step_settled(each_target, tiny, prompt_ids):
    ids = prompt_ids[2]
    reference = greedy_reference(tiny.weights.module, ids, 12)
    drafter = FeatureReader(reference, length=3, mode="right")
    generation = Decoder(each_target, frozenset(), 8).generate(ids, drafter, 12)
    assert generation.token_ids == reference
    with torch.inference_mode():
        states = tiny.weights.module(input_ids=torch.tensor([ids + reference]), output_hidden_states=True).hidden_states
    expected = torch.stack([states[0][0], states[2][0]])  # [layers, positions, hidden]
    prefill, *steps = drafter.features
    torch.testing.assert_close(prefill, expected[:, : len(ids)], rtol=1e-4, atol=1e-4)
    position = len(ids)  # each step reads its root (the token the step before settled) and its accepted nodes
    for features, step in zip(steps, generation.steps[1:]):
        assert features.shape[:2] == (2, step.accepted_tokens)
        torch.testing.assert_close(features, expected[:, position : position + step.accepted_tokens], rtol=1e-4,
                                   atol=1e-4)
        position += step.accepted_tokens


def test_hidden_states_are_computed_only_when_asked(each_target, prompt_ids):
    target = each_target
    Decoder(target, frozenset(), 8).generate(prompt_ids[0], ScriptedDrafter([], 0), 3)
    assert target.hidden_states() is None
    with pytest.raises(Exception, match="layers 0..2"):
        target.request_hidden_states((3,))


def test_a_tree_pass_through_the_target_keeps_the_accepted_branch(each_target, tiny, prompt_ids):
    ids = prompt_ids[0]
    expected = greedy_reference(tiny.weights.module, ids, 4)
    target = each_target
    with torch.inference_mode():
        target.start(64)
        target.prefill(np.array(ids), False, 2)
        start = target.length
        wrong = [(token + 1) % 258 for token in expected[1:3]]
        draft = Draft(torch.tensor([*wrong, *expected[1:3]]), parents=torch.tensor([-1, 0, -1, 2]))
        plan = plan_verification(draft, expected[0], max_depth=8, max_nodes=8)
        choices = target.verify(verification_inputs(plan, start, plan.n_nodes), plan.n_nodes, 2)
        assert choices.argmax[[0, 3, 4]].tolist() == expected[1:4]
        target.keep(start, [0, 3, 4])
        assert target.length == start + 3
        after = target.verify(verification_inputs(plan_verification(Draft.empty(), expected[3], 1, 1),
                                                  target.length, 1), 1, 2)
    assert int(after.argmax[0]) == greedy_reference(tiny.weights.module, ids, 5)[4]
