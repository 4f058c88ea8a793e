"""The model-facing interface builders and run.json read (``specbench.targets.weights.TargetWeights``) and its
transformers implementation; and the seam itself: outside the backends and the loaders, nothing in specbench
reads a transformers module (``.model``, ``model.config``, embeddings, ``generate``) of a target."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from specbench.testing import greedy_reference

from specbench.targets.transformers import (TransformersWeights, dense_state_dict, parameter_count,
                                            weights_fingerprint)
from specbench.targets.weights import TargetWeights

PACKAGE = Path(__file__).resolve().parent.parent / "specbench"
# The backends and the loaders that build their objects: the only code that may hold a transformers module. The
# GGUF conversion is a loader's step too: it reads the GGUF file through transformers to save it as a checkpoint
# (a module of its own making, never the target's).
# The GPU check's lossless row decodes its reference with the plain module, the oracle the loop is checked against
# (as tests/ do through the test kit).
MAY_READ_THE_MODULE = ("targets/", "models/loaded.py", "models/hub.py", "models/gguf.py", "models/tiny.py",
                       "models/placement.py", "artefacts/gguf_conversion.py", "device_check.py",
                       "compiled_check.py")
# A transformers module reached through a loaded model or a target: LoadedModel.model / .backend (gone), a
# module's config, embeddings, output layer, generate or hidden states, and the backend's own attribute.
MODULE_ACCESS = re.compile(r"\b(?:target|loaded|model|teacher|self\.target)\.(?:model|backend)\b"
                           r"|\bmodel\.config\b|\.get_(?:input|output)_embeddings\("
                           r"|\bmodel\.generate\(|output_hidden_states|\.weights\.module\b")
# The one place a drafter runs a module itself: the draft model, which is loaded as one (not the target).
DRAFT_MODULE = ("drafters/draft_model.py", "return loaded.weights.module, loaded.source, loaded.checkpoint")


def module_accesses(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if MODULE_ACCESS.search(line)]


def test_the_pattern_catches_module_access_and_nothing_else():
    caught = ["output = target.model.generate(ids)", "text = target.model.config.get_text_config()",
              "layer = model.get_output_embeddings()", "Decoder(model.backend, eos)", "x = loaded.model",
              "m = target.weights.module"]
    missed = ["cfg.model.name", "self.model_db = db", "drafter.model.hub_id", "target.weights.generate(ids)",
              "compose(['model=tiny-random']).model", "decoder.generate(prompt_ids, drafter, 8)"]
    assert [line for line in caught if not module_accesses(line)] == []
    assert [line for line in missed if module_accesses(line)] == []


def test_no_builder_or_drafter_reads_the_targets_transformers_module():
    hits = []
    for file in sorted(PACKAGE.rglob("*.py")):
        relative = file.relative_to(PACKAGE).as_posix()
        if relative.startswith(MAY_READ_THE_MODULE):
            continue
        for line in module_accesses(file.read_text()):
            if (relative, line) != DRAFT_MODULE:
                hits.append(f"{relative}: {line}")
    assert hits == []


def test_the_transformers_weights_answer_from_their_module(tiny):
    weights = tiny.weights
    module = weights.module
    assert isinstance(weights, TargetWeights)
    assert (weights.vocab_size, weights.num_layers, weights.hidden_size) == (258, 2, 64)
    assert weights.dtype == torch.float32 and weights.input_device == torch.device("cpu")
    assert weights.parameter_count == parameter_count(module) > 0
    assert weights.fingerprint == weights_fingerprint(module) == tiny.weights_fingerprint
    assert weights.architecture["hidden_size"] == 64 and weights.architecture["num_hidden_layers"] == 2
    weights.architecture["hidden_size"] = 1  # a copy: the caller cannot change the model's config through it
    assert module.config.get_text_config().hidden_size == 64
    assert weights.input_embeddings().data_ptr() == module.get_input_embeddings().weight.data_ptr()
    assert weights.output_layer() is module.get_output_embeddings()


def test_a_pruned_copy_keeps_the_chosen_layers(tiny):
    copy = tiny.weights.pruned_copy([1])
    assert copy.config.num_hidden_layers == 1 and copy is not tiny.weights.module
    original = dense_state_dict(tiny.weights.module)  # its linear layers may run on oneDNN (packed weights)
    assert torch.equal(copy.state_dict()["model.layers.0.mlp.up_proj.weight"],
                       original["model.layers.1.mlp.up_proj.weight"])


@torch.inference_mode()
def test_batched_greedy_generation_is_plain_greedy_decoding_of_each_row(tiny, prompt_ids):
    """Left-padded rows of different lengths: each row's continuation is what greedy decoding of it alone gives."""
    rows = prompt_ids[:2]
    width = max(len(ids) for ids in rows)
    pad = min(tiny.eos_token_ids)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention[row, width - len(ids):] = 1
    continuations = tiny.weights.generate(input_ids, attention, 6, tiny.eos_token_ids, pad)
    assert continuations.shape[0] == 2 and continuations.shape[1] <= 6
    for ids, row in zip(rows, continuations.tolist()):
        expected = greedy_reference(tiny.weights.module, ids, 6, tiny.eos_token_ids)
        assert row[: len(expected)] == expected and len(expected) > 0


@pytest.mark.parametrize("temperature", [0.5, 2.0])
@torch.inference_mode()
def test_sampled_generation_follows_the_global_seed(tiny, prompt_ids, temperature):
    """The same seed, the same answer; another seed or greedy decoding, another (tiny-random's distributions are
    nearly flat, so eight sampled tokens differ from greedy's)."""
    ids = torch.tensor([prompt_ids[0]])
    draws = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        draws.append(tiny.weights.generate(ids, torch.ones_like(ids), 8, tiny.eos_token_ids, 0,
                                           temperature=temperature).tolist())
    greedy = tiny.weights.generate(ids, torch.ones_like(ids), 8, tiny.eos_token_ids, 0).tolist()
    assert draws[0] == draws[1] and 0 < len(draws[0][0]) <= 8
    assert draws[2] != draws[0] and greedy != draws[0]


@torch.inference_mode()
def test_hidden_states_and_logits_are_the_modules_own(tiny, prompt_ids):
    ids = torch.tensor(prompt_ids[0])
    states, logits = tiny.weights.hidden_states_and_logits(ids, (0, 2))
    output = tiny.weights.module(input_ids=ids[None], output_hidden_states=True)
    assert [state.shape for state in states] == [(ids.numel(), 64)] * 2
    torch.testing.assert_close(states[1], output.hidden_states[2][0])
    torch.testing.assert_close(logits, output.logits[0])
    torch.testing.assert_close(tiny.weights.logits(ids[None]), output.logits)


def test_a_loaded_model_holds_the_target_and_the_weights_its_loader_built(tiny):
    from specbench.targets.transformers import TransformersTarget

    assert isinstance(tiny.target, TransformersTarget) and isinstance(tiny.weights, TransformersWeights)
    assert tiny.target.model is tiny.weights.module
    assert not hasattr(tiny, "model") and not hasattr(tiny, "backend")
    assert (tiny.vocab_size, tiny.num_layers, tiny.device) == (258, 2, torch.device("cpu"))


def test_saved_weights_load_back_as_the_same_model(tmp_path):
    """save_checkpoint writes what another engine (vLLM) loads: the same config and weights, as transformers reads
    them back; a model on oneDNN's packed layers (no weights under transformers' names) is refused, not saved
    half."""
    import torch
    from transformers import AutoModelForCausalLM

    from specbench import testing
    from specbench.errors import SpecbenchError

    model = testing.tiny_random("cpu", linear_backend="aten")
    model.weights.save_checkpoint(tmp_path / "aten")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "aten", dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 7]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.weights.logits(ids))
    with pytest.raises(SpecbenchError, match="linear_backend=aten"):
        testing.tiny_random("cpu", linear_backend="onednn").weights.save_checkpoint(tmp_path / "onednn")
