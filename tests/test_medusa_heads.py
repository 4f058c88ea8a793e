"""Medusa heads: the forward pinned against a plain re-statement of Medusa's, the published directory format (written
here key by key, not by specbench's writer), the writer's round trip, and the loader's refusals of heads that do not
fit the target."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import refusal, warnings_of
from safetensors.torch import save_file

from specbench.heads.medusa_heads import (
    MedusaConfig,
    MedusaHeads,
    load_medusa_heads,
    new_medusa_heads,
    save_medusa_heads,
)
from specbench.models.tiny import build_tiny_random
from specbench.training.heads import dense_weight

HEADS, LAYERS = 5, 1


@pytest.fixture(scope="module")
def target():
    return build_tiny_random()


def published_state(target, heads=HEADS, layers=LAYERS, seed=0):
    """Random weights under Medusa-1's own key names (``{i}.{j}.linear.weight``, ``{i}.{layers}.weight``), as
    FasterDecoding's medusa_lm_head.pt holds them (the state dict of its ``medusa_head`` ModuleList)."""
    generator = torch.Generator().manual_seed(seed)
    hidden, vocab = target.weights.hidden_size, target.vocab_size
    state = {}
    for i in range(heads):
        for j in range(layers):
            state[f"{i}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=generator) / hidden ** 0.5
            state[f"{i}.{j}.linear.bias"] = torch.randn(hidden, generator=generator) * 0.1
        state[f"{i}.{layers}.weight"] = torch.randn(vocab, hidden, generator=generator) / hidden ** 0.5
    return state


def write_published(directory, state, config=None, name="medusa_lm_head.pt"):
    """A head directory as FasterDecoding publishes one: config.json and the weights file."""
    directory.mkdir(parents=True, exist_ok=True)
    values = {"medusa_num_heads": 2, "medusa_num_layers": LAYERS, "base_model_name_or_path": "tiny-random"}
    (directory / "config.json").write_text(json.dumps(values if config is None else config))
    if name.endswith(".pt"):
        torch.save(state, directory / name)
    else:
        save_file(state, str(directory / name))
    return str(directory)


def reference_logits(state, hidden_state, head, layers=LAYERS):
    """Medusa's head: ``layers`` times x + SiLU(W x + b), then its own lm_head (medusa_model.py:66, 100-108)."""
    x = hidden_state
    for j in range(layers):
        x = x + F.silu(x @ state[f"{head}.{j}.linear.weight"].T + state[f"{head}.{j}.linear.bias"])
    return x @ state[f"{head}.{layers}.weight"].T


@pytest.mark.parametrize("name", ["medusa_lm_head.pt", "medusa_lm_head.safetensors"])
def test_a_published_head_loads_and_drafts_as_medusas_forward(target, tmp_path, name):
    state = published_state(target)
    # the uploaded configs name fewer heads than the file holds (2 here, 5 in the file): the weights decide
    heads = load_medusa_heads(target, write_published(tmp_path, state, name=name))
    assert heads.config.num_heads == HEADS and heads.config.num_layers == LAYERS
    hidden_state = torch.randn(3, target.weights.hidden_size)
    logits = heads(hidden_state)
    assert logits.shape == (HEADS, 3, target.vocab_size)
    for k in range(HEADS):
        torch.testing.assert_close(logits[k], reference_logits(state, hidden_state, k), rtol=1e-5, atol=1e-5)
    assert not any(parameter.requires_grad for parameter in heads.parameters())


def test_the_drafter_reads_the_first_heads_of_the_file(target, tmp_path):
    state = published_state(target)
    heads = load_medusa_heads(target, write_published(tmp_path, state), num_heads=4)
    assert heads.config.num_heads == 4
    hidden_state = torch.randn(target.weights.hidden_size)
    torch.testing.assert_close(heads(hidden_state)[3], reference_logits(state, hidden_state, 3), rtol=1e-5, atol=1e-5)
    refusal_text = refusal(load_medusa_heads, target, str(tmp_path), num_heads=6)
    assert "holds 5 heads" in refusal_text and "drafter.heads=6" in refusal_text


def test_two_layer_heads_and_the_full_model_spelling_load(target, tmp_path):
    state = published_state(target, heads=2, layers=2)
    prefixed = {f"medusa_head.{key}": value for key, value in state.items()}
    heads = load_medusa_heads(target, write_published(tmp_path, prefixed, {"medusa_num_layers": 2}))
    hidden_state = torch.randn(target.weights.hidden_size)
    torch.testing.assert_close(heads(hidden_state)[1], reference_logits(state, hidden_state, 1, layers=2),
                               rtol=1e-5, atol=1e-5)


def test_save_writes_medusas_format_and_loads_back(target, tmp_path):
    config = MedusaConfig(3, 1, target.weights.hidden_size, target.vocab_size, "tiny-random")
    torch.manual_seed(0)
    heads = MedusaHeads(config)
    save_medusa_heads(heads, tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "medusa_lm_head.safetensors")))
    assert keys == {f"{i}.0.linear.{part}" for i in range(3) for part in ("weight", "bias")} | \
        {f"{i}.1.weight" for i in range(3)}
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["medusa_num_heads"], written["medusa_num_layers"]) == (3, 1)
    assert written["base_model_name_or_path"] == "tiny-random"
    loaded = load_medusa_heads(target, str(tmp_path))
    hidden_state = torch.randn(2, target.weights.hidden_size)
    torch.testing.assert_close(loaded(hidden_state), heads(hidden_state))
    torch.save({}, tmp_path / "medusa_lm_head.pt")  # an older file beside it is removed by the next save
    save_medusa_heads(heads, tmp_path)
    assert not (tmp_path / "medusa_lm_head.pt").exists()


def test_new_heads_start_as_medusa_initialises_them(target):
    config = MedusaConfig(2, 1, target.weights.hidden_size, target.vocab_size)
    lm_head = dense_weight(target.weights.output_layer())
    heads = new_medusa_heads(config, lm_head)
    for head in heads.medusa_head:
        block, own_lm_head = head[0], head[1]
        assert torch.count_nonzero(block.linear.weight) == 0  # zero weight (medusa_model.py:52)
        assert torch.count_nonzero(block.linear.bias) > 0  # the bias keeps nn.Linear's own initialisation
        torch.testing.assert_close(own_lm_head.weight, lm_head)  # a copy of the target's (medusa_model.py:113-115)
        assert own_lm_head.weight.data_ptr() != lm_head.data_ptr()
    hidden_state = torch.randn(target.weights.hidden_size)
    shifted = hidden_state + F.silu(heads.medusa_head[0][0].linear.bias)
    torch.testing.assert_close(heads(hidden_state)[0], shifted @ lm_head.T, rtol=1e-5, atol=1e-5)


def test_missing_unexpected_and_misshapen_weights_are_refused(target, tmp_path):
    state = published_state(target)
    del state["3.0.linear.bias"]
    text = refusal(load_medusa_heads, target, write_published(tmp_path / "missing", state))
    assert "missing 3.0.linear.bias" in text
    state = published_state(target)
    state["extra.weight"] = torch.zeros(2)
    text = refusal(load_medusa_heads, target, write_published(tmp_path / "unexpected", state))
    assert "unexpected extra.weight" in text
    state = published_state(target, layers=2)  # two blocks per head, but the config says one
    text = refusal(load_medusa_heads, target, write_published(tmp_path / "layers", state))
    assert "medusa_num_layers=1" in text and "missing 0.1.weight" in text and "0.2.weight" in text
    state = published_state(target)
    state["1.0.linear.weight"] = torch.zeros(3, 3)
    text = refusal(load_medusa_heads, target, write_published(tmp_path / "shape", state))
    assert "1.0.linear.weight [3, 3]" in text


def test_a_head_of_another_width_or_vocabulary_is_refused(target, tmp_path):
    wider = build_tiny_random(hidden_size=32, num_heads=2, num_kv_heads=1)
    text = refusal(load_medusa_heads, target, write_published(tmp_path / "wide", published_state(wider)))
    assert "width 32" in text and "hidden size 64" in text
    other_vocab = published_state(target)
    for i in range(HEADS):
        other_vocab[f"{i}.1.weight"] = other_vocab[f"{i}.1.weight"][:100]
    text = refusal(load_medusa_heads, target, write_published(tmp_path / "vocab", other_vocab))
    assert "vocabulary of 100 tokens" in text and str(target.vocab_size) in text


def test_a_bad_config_or_directory_is_refused(target, tmp_path):
    source = write_published(tmp_path / "config", published_state(target), {"medusa_num_layers": 1.5})
    assert "medusa_num_layers=1.5" in refusal(load_medusa_heads, target, source)
    (tmp_path / "empty").mkdir()
    assert "no config.json" in refusal(load_medusa_heads, target, str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert "medusa_lm_head.safetensors or medusa_lm_head.pt" in refusal(load_medusa_heads, target,
                                                                         str(tmp_path / "empty"))
    assert "not a directory" in refusal(load_medusa_heads, target, str(tmp_path / "absent"))
    source = write_published(tmp_path / "damaged", published_state(target))
    data = (tmp_path / "damaged" / "medusa_lm_head.pt").read_bytes()
    (tmp_path / "damaged" / "medusa_lm_head.pt").write_bytes(data[: len(data) // 2])
    assert "Medusa head" in refusal(load_medusa_heads, target, source)


def test_a_hub_id_offline_and_not_cached_names_the_download(target, monkeypatch):
    from specbench import hub_cache

    monkeypatch.setattr(hub_cache, "cached_snapshot", lambda hub_id, revision: None)
    monkeypatch.setattr(hub_cache, "hub_reachable", lambda *args, **kwargs: False)
    text = refusal(load_medusa_heads, target, "someone/medusa-missing")
    assert "Medusa head someone/medusa-missing is not in the local Hugging Face cache" in text
    assert "`hf download someone/medusa-missing`" in text


def test_heads_trained_for_another_base_model_warn(target, tmp_path, caplog):
    config = {"medusa_num_heads": 5, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}
    source = write_published(tmp_path, published_state(target), config)
    with caplog.at_level("WARNING"):
        load_medusa_heads(target, source)
    assert any("trained for lmsys/vicuna-7b-v1.3" in message for message in warnings_of(caplog))
