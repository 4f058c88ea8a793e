"""LongSpec's drafter (sail-sg/LongSpec @15e4998): the target's cache entries it reads, its layer, its beam tree, its
files and its training, each against an independent computation or the original's values restated."""

import functools
import json

import numpy as np
import pytest
import torch

from specbench import testing
from specbench.decoding.contract import Draft, StepOutcome
from specbench.drafters.longspec import TREE_SHAPE, LongSpec, checked_tree_shape
from specbench.errors import SpecbenchError
from specbench.heads import longspec_heads
from specbench.heads.longspec_heads import (
    WINDOW,
    attach_to,
    glide_config_for,
    load_longspec_head,
    new_longspec_head,
    save_longspec_head,
)
from specbench.targets.layer_keys import LayerKeysValues
from specbench.targets.transformers import forward_with_cache
from specbench.training import heads as trainer
from specbench.training import longspec as training


@functools.cache
def tiny_of_architecture(architecture: str):
    return testing.tiny_random(architecture=architecture)


def fresh_head(model, seed=0):
    head = new_longspec_head(glide_config_for(model), torch.Generator().manual_seed(seed))
    # a random layer drafts near-uniformly; larger weights make its choices depend on what it reads
    with torch.no_grad():
        for parameter in head.parameters():
            if parameter.ndim == 2:
                parameter.mul_(20)
    head.context_length = 8192
    return attach_to(head, model, torch.float32)


def drafter_with(head, model, tree_shape=TREE_SHAPE):
    drafter = LongSpec(tree_shape=tree_shape)
    drafter.head, drafter.device = head, model.device
    drafter.hidden_state_layers = (model.num_layers - 1,)
    return drafter


def last_layer_input(model, ids):
    states, _ = model.weights.hidden_states_and_logits(torch.tensor(ids), (model.num_layers - 1,))
    return states[0].float()


# ---- the target's entries -------------------------------------------------------------------------------------


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
def test_recomputed_entries_equal_the_target_cache(architecture):
    """Llama's plain projections, Qwen2's biases and Qwen3's per-head key norm: the cache's own values."""
    from transformers import DynamicCache

    model = tiny_of_architecture(architecture)
    ids = torch.arange(3, 40)
    hidden = last_layer_input(model, ids.tolist())
    recomputation = model.weights.layer_keys_values(model.num_layers - 1)
    assert isinstance(recomputation, LayerKeysValues)
    keys, values = recomputation(hidden, torch.arange(ids.numel()))
    cache = DynamicCache()
    with torch.no_grad():
        forward_with_cache(model.weights.module, cache, input_ids=ids[None])
    torch.testing.assert_close(keys, cache.layers[-1].keys[0].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values, cache.layers[-1].values[0].float(), rtol=1e-5, atol=1e-5)


# ---- the tree, against a recomputation from scratch ---------------------------------------------------------------


def reference_log_probs(head, model, context, path):
    """log-probabilities after ``path`` (tokens from the root on), the root being context[-1] at position
    len(context) - 1: the whole layer over context + path from scratch, with dense masks (no cache)."""
    tokens = torch.tensor(list(context) + list(path))
    length, root = tokens.numel(), len(context) - 1
    index = torch.arange(length)
    cos, sin = head.rotary(index[None])
    embeddings = head.embed(tokens)[None]
    keys, values = head.self_entries(embeddings, cos, sin)
    distance = index[-1] - index
    visible = ((distance >= 0) & (distance <= WINDOW))[None, None]
    target_keys, target_values = head.target_entries(last_layer_input(model, context[:-1])[None],
                                                     torch.arange(root)[None])
    out = head(embeddings[:, -1:], cos[:, -1:], sin[:, -1:], keys, values, visible, target_keys, target_values,
               torch.ones(1, 1, root, dtype=torch.bool))
    return torch.log_softmax(head.logits(out[0, 0]).float(), dim=-1)


def first_tree(drafter, model, prompt, first):
    drafter.begin(np.array(prompt))
    hidden = last_layer_input(model, prompt)[None]
    drafter.accept(np.array([first]), StepOutcome(0, Draft.empty(), np.array([first]), (), hidden_states=hidden))
    return drafter.propose(np.array(prompt + [first]))


def paths(draft):
    parents, tokens = draft.parents.tolist(), draft.token_ids.tolist()
    result = []
    for node in range(len(tokens)):
        path, at = [], node
        while at >= 0:
            path.insert(0, tokens[at])
            at = parents[at]
        result.append(path)
    return result


@torch.no_grad()
def test_the_tree_is_a_beam_over_every_parent_and_token_by_cumulative_log_probability(tiny):
    head = fresh_head(tiny)
    drafter = drafter_with(head, tiny, (3, 5, 5))
    prompt, first = [5, 17, 3, 99, 42, 8, 61, 7], 13
    context = prompt + [first]
    draft = first_tree(drafter, tiny, prompt, first)
    assert len(draft) == 3 + 5 + 5
    nodes = paths(draft)
    root = reference_log_probs(head, tiny, context, [])
    assert [path[0] for path in nodes[:3]] == root.topk(3).indices.tolist()
    score = {(): 0.0}
    for path in nodes[:3]:
        score[tuple(path)] = float(root[path[0]])
    level = nodes[:3]
    begin = 3
    for width in (5, 5):
        candidates = []
        for path in level:
            log_probs = reference_log_probs(head, tiny, context, path)
            candidates += [(score[tuple(path)] + float(value), tuple(path) + (token,))
                           for token, value in enumerate(log_probs.tolist())]
        candidates.sort(key=lambda item: -item[0])
        kept = [tuple(path) for path in nodes[begin:begin + width]]
        assert kept == [path for _, path in candidates[:width]]  # best first, as topk returns them
        for value, path in candidates[:width]:
            score[path] = value
        level = [list(path) for path in kept]
        begin += width


def test_the_published_tree_has_68_drafted_tokens_verified_with_the_root(tiny):
    # llama_glide.py:929 cand_num_per_step = [4, 16, 16, 16, 16]; acc_num_per_step [1, 5, 21, 37, 53, 69] (:932-934)
    assert TREE_SHAPE == (4, 16, 16, 16, 16)
    drafter = drafter_with(fresh_head(tiny), tiny)
    draft = first_tree(drafter, tiny, [5, 17, 3, 99, 42], 13)
    assert len(draft) == 68
    depth = [len(path) for path in paths(draft)]
    assert [depth.count(d) for d in range(1, 6)] == [4, 16, 16, 16, 16]
    assert drafter.cache.length == 6  # the tree's entries were forgotten: the prompt and the first token stay


def test_the_drafter_cache_is_settled_tokens_and_the_target_entries_the_target_cache(tiny):
    drafter = drafter_with(fresh_head(tiny), tiny, (2, 2))
    prompt = [5, 17, 3, 99, 42]
    first_tree(drafter, tiny, prompt, 13)
    assert drafter.target_cache.length == len(prompt)  # the first token is not in the target's cache yet
    hidden = last_layer_input(tiny, prompt + [13, 21])[5:][None]  # the root and one accepted node settle
    drafter.accept(np.array([21, 30]), StepOutcome(1, Draft.empty(), np.array([21, 30]), (0,), hidden_states=hidden))
    drafter.propose(np.array(prompt + [13, 21, 30]))
    assert drafter.target_cache.length == 7 and drafter.cache.length == 8
    assert drafter.cache.positions[:8].tolist() == list(range(8))


def test_window_is_512_positions_back_as_flash_attention_window_size(tiny):
    # llama_glide.py:199, 227, 262, 300: window_size=(512, -1), a query sees itself and 512 positions back
    assert WINDOW == 512
    visible = training.window_visible(torch.tensor([600]), torch.arange(601), WINDOW)[0]
    assert visible.nonzero().flatten().tolist() == list(range(88, 601))


def test_tree_shape_is_checked_in_one_line():
    assert checked_tree_shape([4, 16]) == (4, 16)
    for bad in ([], [4, 0], [4, 2.5], "4,16", [True]):
        with pytest.raises(SpecbenchError, match="tree_shape must be a non-empty list of positive integers"):
            checked_tree_shape(bad)


# ---- files ------------------------------------------------------------------------------------------------------


def test_a_saved_drafter_reads_back_as_published_ones_are_laid_out(tiny, tmp_path):
    head = fresh_head(tiny)
    save_longspec_head(head, tmp_path / "mine")
    loaded = load_longspec_head(tiny, str(tmp_path / "mine"))
    for (name, mine), (_, theirs) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(mine, theirs.float()), name
    # LongSpec's training checkpoint: the layer under draft_model., with the cross-attention's unused k/v projections
    state = {f"draft_model.{key}": value for key, value in head.state_dict().items()}
    width = head.config.num_key_value_heads * head.config.head_dim
    state["draft_model.cross_attn.k_proj.weight"] = torch.zeros(width, head.config.hidden_size)
    state["draft_model.cross_attn.v_proj.bias"] = torch.zeros(width)
    (tmp_path / "theirs").mkdir()
    torch.save(state, tmp_path / "theirs" / "draft_model_weights.pth")
    (tmp_path / "theirs" / "config.json").write_text((tmp_path / "mine" / "config.json").read_text())
    again = load_longspec_head(tiny, str(tmp_path / "theirs"))
    assert all(torch.equal(again.state_dict()[key].float(), value) for key, value in head.state_dict().items())


def test_a_drafter_for_another_target_is_refused_in_one_line(tiny, tmp_path):
    save_longspec_head(fresh_head(tiny), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["hidden_size"] *= 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecbenchError, match=r"was trained for another target \(hidden_size") as error:
        load_longspec_head(tiny, str(tmp_path))
    assert "\n" not in str(error.value)


def test_weights_that_are_not_a_longspec_layer_are_refused(tiny, tmp_path):
    save_longspec_head(fresh_head(tiny), tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    del state["mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(SpecbenchError, match="is not a LongSpec layer: missing mlp.up_proj.weight"):
        load_longspec_head(tiny, str(tmp_path))


# ---- training -----------------------------------------------------------------------------------------------------


def test_the_recipe_restates_longspec_stage_one():
    published = training.PUBLISHED["longspec"]
    # qwq_glide_8gpu_slim6b.yaml:109, 112, 118, 119, 121, 136, 161, 77; 106 x 111 x 8 GPUs
    assert (published["lr"], published["weight_decay"], published["grad_clip"], published["epochs"]) == \
        (5e-4, 0.1, 1.0, 1)
    assert (published["warmup_ratio"], published["seed"], published["betas"], published["max_length"]) == \
        (0.1, 42, (0.9, 0.95), 1024)
    assert published["batch_sequences"] == 2 * 128 * 8
    # train copy of llama_glide.py:519-526: sink randint(0, 4), offset bound min(30000, max_length - 1000), <= 1200
    assert (training.SINK_MAX, training.OFFSET_LIMIT, training.SHORT_SEQUENCE) == (4, 30000, 1200)
    assert training.METHOD_SETTINGS["longspec"] == {"anchor_offset": True, "stale_max": 4}  # randint(1, 4)
    recipe = trainer.recipe_of("longspec", {})
    assert (recipe.lr, recipe.weight_decay, recipe.grad_clip_by, recipe.schedule) == (5e-4, 0.1, "norm", "cosine")


def test_anchor_offset_keeps_the_sink_and_shifts_the_rest():
    draws = iter([2, 500])
    positions = training._positions(10, 8192, True, lambda low, high: next(draws))
    assert positions.tolist() == [0, 1] + list(range(502, 510))
    seen = []
    training._positions(10, 8192, True, lambda low, high: seen.append((low, high)) or low)
    assert seen == [(0, 4), (0, min(30000, 8192 - 1000) - 10)]
    assert training._positions(1201, 8192, True, lambda low, high: 7).tolist() == list(range(1201))
    assert training._positions(10, 8192, False, lambda low, high: 7).tolist() == list(range(10))


def test_stale_rows_see_no_target_entry_and_get_nothing_from_it(tiny):
    head = fresh_head(tiny)
    queries = torch.randn(1, 3, head.config.num_attention_heads, head.config.head_dim)
    keys = torch.randn(1, head.config.num_key_value_heads, 3, head.config.head_dim)
    visible = torch.tensor([[[False, False, False], [True, False, False], [True, True, False]]])
    out = longspec_heads.attend(queries, keys, keys, visible)
    assert torch.equal(out[0, 0], torch.zeros_like(out[0, 0])) and out[0, 1:].abs().sum() > 0


def test_a_few_training_steps_lower_the_loss_and_the_chain_matches_the_drafter(tiny):
    conversations = [(list(range(5, 15)), [20 + (i * 7) % 50 for i in range(30)]) for _ in range(4)]
    recipe = trainer.recipe_of("longspec", {"train_steps": 30, "lr": 5e-3, "warmup_ratio": 0.0})
    sequences = trainer.target_sequences(tiny, conversations, training.feature_layers("longspec", tiny.num_layers,
                                                                                     recipe), "features")
    head = training.new_head(tiny, "longspec", recipe, sequences)
    batch = trainer.make_batch(sequences, trainer.EVAL_POSITIONS)
    with torch.no_grad():
        before = float(training.loss(head, None, batch, "longspec", recipe, torch.Generator().manual_seed(1))[0])
    optimizer = torch.optim.AdamW(head.parameters(), lr=5e-3)
    for step in range(30):
        optimizer.zero_grad()
        value, _ = training.loss(head, None, batch, "longspec", recipe, torch.Generator().manual_seed(step))
        value.backward()
        optimizer.step()
    with torch.no_grad():
        after = float(training.loss(head, None, batch, "longspec", recipe, torch.Generator().manual_seed(1))[0])
    assert after < before - 1.0
    # the trainer's chain (batched, dense masks) is what the drafter drafts step by step
    head.eval()
    chain = training.chain_tokens(head, None, batch, "longspec", 3)
    drafter = drafter_with(head, tiny, (1, 1, 1))
    ids = sequences[0].token_ids.tolist()
    for t in (9, 14, 25):
        draft = first_tree(drafter, tiny, ids[:t + 1], ids[t + 1])
        assert draft.token_ids.tolist() == chain[0, t].tolist()
