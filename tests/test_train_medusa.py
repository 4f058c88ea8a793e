"""Medusa-1's training hooks on tiny-random: the loss re-stated by hand from train_legacy.py, the heads' chain as
the trainer compares it, the initialisation, the round trip through Medusa's format, and the published recipe."""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F

from specbench.testing import greedy_reference, prompt_ids
from specbench.training import medusa, methods
from specbench.training.heads import dense_weight, make_batch, target_sequences


def recipe(**method):
    return types.SimpleNamespace(method={**medusa.METHOD_SETTINGS["medusa"], **method}, seed=0)


@pytest.fixture(scope="module")
def sequences(tiny):
    conversations = [(ids, greedy_reference(tiny.weights.module, ids, 12)) for ids in prompt_ids(tiny)]
    return target_sequences(tiny, conversations, medusa.feature_layers("medusa", tiny.num_layers, None), "test")


@pytest.fixture(scope="module")
def batch(sequences):
    return make_batch(sequences, 1)  # the trainer's depth: the hooks must not need it to reach t + 2 + k


def trained_heads(tiny, seed=1):
    """Heads with every weight random, so that each head's logits differ."""
    heads = medusa.new_head(tiny, "medusa", recipe(), None)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))
    return heads


@torch.no_grad()  # the sequences' tensors come from inference mode, as the trainer's do before make_batch copies them
def reference_loss(heads, sequences):
    """train_legacy.py:72-78 @e2a5d20 (the first release's medusa/train/train.py:60-67 @ab5d60c): head i's logits at t
    against labels[t + 2 + i], the labels the assistant's tokens only (IGNORE elsewhere: the first release's
    masking, train.py:178-202 @ab5d60c, which ignores the user's turns); CrossEntropyLoss's mean over the batch's
    labelled positions; summed over heads."""
    total = 0.0
    for k in range(heads.config.num_heads):
        losses = []
        for sequence in sequences:
            length, prompt = len(sequence.token_ids), sequence.prompt_length
            for t in range(length):
                u = t + 2 + k
                if prompt <= u < length:
                    logits = heads.head_logits(k, sequence.final[t])
                    losses.append(F.cross_entropy(logits[None], sequence.token_ids[u:u + 1]))
        total += torch.stack(losses).mean()
    return total


def test_the_loss_is_medusa_ones_hard_label_sum_over_heads(tiny, sequences, batch):
    heads = trained_heads(tiny)
    total, parts = medusa.loss(heads, None, batch, "medusa", recipe(), None)
    torch.testing.assert_close(total, reference_loss(heads, sequences), rtol=1e-5, atol=1e-5)
    assert sorted(parts) == sorted(f"medusa{k}_{name}" for k in range(4) for name in ("loss", "top1"))
    assert math.isclose(sum(parts[f"medusa{k}_loss"] for k in range(4)), float(total.detach()), rel_tol=1e-5)


def test_only_the_heads_train_every_part_of_them(tiny, batch):
    heads = trained_heads(tiny)
    heads.train()
    total, _ = medusa.loss(heads, None, batch, "medusa", recipe(), None)
    total.backward()
    for name, parameter in heads.named_parameters():
        assert parameter.requires_grad and parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    # the heads' lm_heads are copies: nothing reaches the target's own weights
    assert all(parameter.grad is None for parameter in tiny.weights.module.parameters())


def test_the_chain_is_each_heads_argmax_at_the_same_state(tiny, batch):
    heads = trained_heads(tiny)
    chain = medusa.chain_tokens(heads, None, batch, "medusa", 6)
    assert chain.shape == (*batch.features.shape[:2], 6)
    for k in range(4):
        assert torch.equal(chain[:, :, k], heads.head_logits(k, batch.features).argmax(-1))
    assert (chain[:, :, 4:] == -1).all()  # no head names the 5th and 6th tokens


def test_a_head_equal_to_the_targets_lm_head_names_the_targets_next_token(tiny, batch):
    """Index convention: chain[:, t, 0] reads f_t, the state whose own lm_head gives greedy[t]. A head that is the
    target's lm_head (zero block, zero bias) therefore names greedy[t], one position early for head 0, whose label is
    x_{t+2} (compared with greedy[t + 1] by the trainer)."""
    heads = medusa.new_head(tiny, "medusa", recipe(heads=1), None)
    with torch.no_grad():
        heads.medusa_head[0][0].linear.bias.zero_()
    chain = medusa.chain_tokens(heads, None, batch, "medusa", 1)
    inside = torch.arange(batch.features.shape[1])[None, :] < (batch.lengths[:, None] - 1)
    assert torch.equal(chain[:, :, 0][inside], batch.greedy[:, :batch.features.shape[1]][inside])


def test_new_heads_are_initialised_as_medusa_does_and_seeded(tiny):
    before = torch.random.get_rng_state()
    heads = medusa.new_head(tiny, "medusa", recipe(), None)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's random stream is untouched
    assert (heads.config.num_heads, heads.config.num_layers) == (4, 1)
    lm_head = dense_weight(tiny.weights.output_layer())
    for head in heads.medusa_head:
        assert torch.count_nonzero(head[0].linear.weight) == 0
        torch.testing.assert_close(head[1].weight, lm_head)
    again = medusa.new_head(tiny, "medusa", recipe(), None)
    assert torch.equal(again.medusa_head[2][0].linear.bias, heads.medusa_head[2][0].linear.bias)
    two_layers = medusa.new_head(tiny, "medusa", recipe(heads=2, layers=2), None)
    assert len(two_layers.medusa_head) == 2 and len(two_layers.medusa_head[0]) == 3


def test_save_and_load_round_trip_in_medusas_format(tiny, tmp_path, batch):
    heads = trained_heads(tiny)
    medusa.save(heads, "medusa", tmp_path)
    assert (tmp_path / "medusa_lm_head.safetensors").is_file() and (tmp_path / "config.json").is_file()
    loaded = medusa.load(tiny, tmp_path, "medusa")
    assert torch.equal(medusa.chain_tokens(loaded, None, batch, "medusa", 4),
                       medusa.chain_tokens(heads, None, batch, "medusa", 4))


def test_feature_layers_are_the_final_state_and_unknown_kinds_are_refused(tiny):
    from conftest import refusal

    assert medusa.feature_layers("medusa", 30, None) == (30,)
    assert "Medusa head kind 'hydra' is unknown; choose one of medusa" in refusal(medusa.feature_layers, "hydra",
                                                                                   30, None)


def test_the_published_recipe_is_medusas_and_every_value_has_its_source():
    # FasterDecoding/Medusa scripts/train_vicuna_7b.sh @e2a5d20, re-stated: --num_train_epochs 1, --learning_rate
    # 1e-3, --lr_scheduler_type cosine, --warmup_ratio 0.1, --weight_decay 0.0, --bf16 True, 8 per device x 4
    # processes x 4 accumulation steps, --model_max_length 2048; transformers' Trainer for max_grad_norm (1.0, the
    # global norm) and Adam's betas.
    assert medusa.PUBLISHED["medusa"] == {
        "epochs": 1, "lr": 1e-3, "schedule": "cosine", "warmup_ratio": 0.1, "weight_decay": 0.0, "grad_clip": 1.0,
        "grad_clip_by": "norm", "betas": (0.9, 0.999), "batch_sequences": 128, "precision": "bf16",
        "max_length": 2048, "data": medusa.PUBLISHED["medusa"]["data"], "heads": 5, "layers": 1}
    assert "ShareGPT_V4.3_unfiltered_cleaned_split.json" in medusa.PUBLISHED["medusa"]["data"]
    assert set(medusa.SOURCES["medusa"]) == set(medusa.PUBLISHED["medusa"])
    assert all("@e2a5d20" in source for source in medusa.SOURCES["medusa"].values())
    # which tokens train: the first release's masking (assistant turns alone), not train_legacy.py's, whose test
    # `tok_stop >= start or tok_start < tok_stop` (:210) holds for every token with a non-empty span
    assert "medusa/train/train.py:178-202 @ab5d60c" in medusa.SOURCES["medusa"]["data"]
    assert "train_legacy.py" not in medusa.SOURCES["medusa"]["data"]
    # specbench's own defaults: the 4 heads Spec-Bench drafts with, one block each
    assert medusa.METHOD_SETTINGS == {"medusa": {"heads": 4, "layers": 1}}
    assert set(medusa.METHOD_SETTINGS["medusa"]) <= set(medusa.PUBLISHED["medusa"])


def test_specbenchs_medusa_recipe_is_the_published_one_but_for_the_named_differences():
    """specbench's defaults for a medusa head, re-stated: Medusa-1's recipe but for 4 sequences per step and 4
    heads (each with its reason in methods.DIFFERENCES); a default that reverts or drifts fails here."""
    from specbench.training.heads import recipe_of

    recipe = recipe_of("medusa", {})
    ours = {"train_steps": None, "epochs": 1.0, "batch_sequences": 4, "lr": 1e-3, "schedule": "cosine",
            "warmup_steps": None, "warmup_ratio": 0.1, "weight_decay": 0.0, "grad_clip": 1.0, "grad_clip_by": "norm",
            "betas": (0.9, 0.999), "prompts": "head", "max_new_tokens": 256, "sampled_answers": 0}
    assert {name: getattr(recipe, name) for name in ours} == ours
    assert recipe.method == {"heads": 4, "layers": 1}
    assert set(methods.DIFFERENCES["medusa"]) == {"batch_sequences", "heads", "precision", "data", "max_length"}
    assert methods.DIFFERENCES["medusa"]["batch_sequences"][0] == 4 and methods.DIFFERENCES["medusa"]["heads"][0] == 4


def test_the_loss_needs_no_batch_depth_past_the_sequences(tiny, sequences):
    """Head k's label at t is the sequence's own token t + 2 + k, inside every sequence: the loss is the same
    whatever depth the trainer pads the label arrays to (so training.medusa has no batch_depth hook), also for
    more heads than the trainer's measured chain is deep."""
    assert not hasattr(medusa, "batch_depth")
    heads = medusa.new_head(tiny, "medusa", recipe(heads=8), None)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))
    shallow, _ = medusa.loss(heads, None, make_batch(sequences, 0), "medusa", recipe(heads=8), None)
    deep, _ = medusa.loss(heads, None, make_batch(sequences, 12), "medusa", recipe(heads=8), None)
    torch.testing.assert_close(shallow, deep)
    torch.testing.assert_close(shallow, reference_loss(heads, sequences), rtol=1e-5, atol=1e-5)


def test_a_built_medusa_head_is_published_in_medusas_format_alone_and_loads_back(tiny, tmp_path, monkeypatch):
    """The one trainer builds medusa heads end to end (answers, features, training, the acceptance measured held out
    and on training answers) and publishes only Medusa's two files beside the manifest: the optimizer's state (twice
    the heads' size) stays in the partial checkpoint, which is removed once the head is published. The weight file
    is the heads in float32 and no more (for SmolLM2: 4 x 49,152 x 576 x 4 bytes of lm_heads, about 453 MB)."""
    from specbench.artefacts import trained_head as trained_heads
    from specbench.heads.medusa_heads import MedusaHeads
    from specbench.storage.manifest import read_manifest

    conversations = [(ids, greedy_reference(tiny.weights.module, ids, 12)) for ids in prompt_ids(tiny)]
    monkeypatch.setattr(trained_heads, "training_conversations", lambda target, recipe: conversations)
    monkeypatch.setattr(trained_heads, "training_prompts", lambda recipe: [str(i) for i in range(len(conversations))])
    spec = {"train_steps": 3, "batch_sequences": 2, "held_out": 1}
    directory = trained_heads.trained_head_directory(tiny, "medusa", spec, str(tmp_path))
    heads = trained_heads.trained_head(tiny, directory, "medusa", spec, given=False)
    manifest = read_manifest(directory, "head", "")
    assert manifest["kind"] == "trained medusa head" and manifest["steps"] == 3
    assert manifest["recipe"]["heads"] == 4 and manifest["recipe"]["grad_clip_by"] == "norm"
    for measured in ("train_acceptance", "held_out_acceptance"):
        # one position per head: 4 heads name no 5th or 6th token, which is not reported as a rejection
        assert manifest[measured]["drafts"] > 0 and len(manifest[measured]["acceptance"]) == 4
    assert sorted(path.name for path in directory.iterdir()) == ["config.json", "manifest.json",
                                                                  "medusa_lm_head.safetensors"]
    assert not trained_heads.staging_directory(directory).exists()
    hidden, vocab = tiny.weights.hidden_size, tiny.vocab_size
    weights = 4 * (vocab * hidden + hidden * hidden + hidden)
    assert weights * 4 < (directory / "medusa_lm_head.safetensors").stat().st_size < weights * 4 + 4096
    assert isinstance(heads, MedusaHeads) and heads.config.num_heads == 4
    assert not any(parameter.requires_grad for parameter in heads.parameters())
    again = trained_heads.load_trained_head(tiny, directory, "medusa", "rebuild it")
    assert all(torch.equal(again.state_dict()[key], value) for key, value in heads.state_dict().items())
    # what was trained is what is saved: the heads moved off Medusa's initialisation
    fresh = medusa.new_head(tiny, "medusa", recipe(), None)
    assert not torch.equal(fresh.medusa_head[0][0].linear.weight, heads.medusa_head[0][0].linear.weight)


def test_the_scripts_defaults_build_the_heads_drafter_medusa_looks_up():
    # `python scripts/train_head.py --kind medusa` with every setting left to its default writes the heads that
    # drafter=medusa's smollm2-135m entry ({trained: {}}) names: else the drafter would train others on first use.
    import importlib.util
    from pathlib import Path

    from hydra.utils import instantiate

    from specbench.artefacts.trained_head import trained_head_directory
    from specbench.config import compose

    loader = importlib.util.spec_from_file_location("train_head", Path(__file__).parents[1] / "scripts" /
                                                    "train_head.py")
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    cfg = compose(["drafter=medusa"])
    drafter = instantiate(cfg.drafter)
    args = script.parse(["--kind", drafter.kind])
    assert args.model == cfg.model.name == "smollm2-135m" and drafter.kind == "medusa"
    target = types.SimpleNamespace(name=args.model, source="the same weights")
    assert drafter.source.spec(target) == {"trained": {}}
    assert (trained_head_directory(target, "medusa", script.spec_of(args), None)
            == trained_head_directory(target, "medusa", {}, drafter.cache_dir))


def test_a_medusa_build_has_an_estimate_before_it_starts():
    # the rate measured for medusa heads on SmolLM2-135M (training/medusa.py): 145 steps of 4 sequences, about
    # 21 minutes with the features, the figure docs/first_use.md and docs/usage.md give (a build alone measured
    # 21 min 7 s: 6 min of features, 14 of training)
    from specbench.artefacts.trained_head import build_seconds_estimate
    from specbench.training.heads import recipe_of

    target = types.SimpleNamespace(weights=types.SimpleNamespace(hidden_size=576))
    recipe = recipe_of("medusa", {})
    assert recipe.steps(579) == 145
    assert 19 * 60 < build_seconds_estimate(target, "medusa", recipe, 579) < 23 * 60


@pytest.mark.parametrize("argv, message", [
    (["--heads", "0"], "medusa training heads must be an integer >= 1, got 0"),
    (["--layers", "0"], "medusa training layers must be an integer >= 1, got 0"),
    (["--heads", "-1"], "medusa training heads must be an integer >= 0, got -1"),
])
def test_the_script_refuses_zero_heads_or_blocks_in_one_line_before_the_model_loads(monkeypatch, capsys, argv,
                                                                                      message):
    # `train_head.py --heads 0` published an empty head and exited 0; with training steps it failed inside the
    # optimizer. Medusa's loader needs a head and a block (heads.medusa_heads), so the recipe refuses fewer.
    import importlib.util
    import sys
    from pathlib import Path

    from specbench.training.heads import recipe_of

    loader = importlib.util.spec_from_file_location("train_head", Path(__file__).parents[1] / "scripts" /
                                                    "train_head.py")
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    monkeypatch.setattr(script, "instantiate", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    monkeypatch.setattr(sys, "argv", ["train_head.py", "--model", "tiny-random", "--kind", "medusa",
                                      "--train-steps", "0", *argv])
    with pytest.raises(SystemExit) as status:
        script.main()
    assert status.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"train_head: error: {message}"]
    assert recipe_of("medusa", {"heads": 1, "layers": 1}).method == {"heads": 1, "layers": 1}  # the least allowed


def test_the_trained_head_artefact_refuses_zero_heads_before_its_build(tiny, tmp_path):
    from conftest import refusal

    from specbench.artefacts.trained_head import TrainedHead

    assert refusal(TrainedHead, tiny, tmp_path / "heads", "medusa", {"heads": 0}) == (
        "medusa training heads must be an integer >= 1, got 0")
    assert not (tmp_path / "heads").exists()
