"""Training heads with the one trainer (specbench/training/heads.py, the EAGLE kinds' hooks in
specbench/training/eagle.py, scripts/train_head.py) on tiny random targets: the batched,
unrolled training forward is what decoding computes, a built head loads back strictly and fits, an interrupted
build resumes to the very head an uninterrupted one builds, damaged heads are rebuilt or refused in one line, the
draft vocabulary is the most frequent tokens, and training lowers the loss."""

from __future__ import annotations

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
from specbench.artefacts.trained_head import rebuild_command, trained_head, trained_head_directory
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
                                             "hydra$"):
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


@pytest.mark.parametrize("drafter", ["eagle", "eagle2", "eagle3"])
def test_the_scripts_defaults_build_the_head_the_drafter_looks_up(drafter):
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
    eagle = instantiate(cfg.drafter)
    args = script.parse(["--kind", eagle.kind])
    assert args.model == cfg.model.name == "smollm2-135m" and args.out is None
    # The key reads only the target's name and source (no model needs loading to compare two keys).
    target = SimpleNamespace(name=args.model, source="the same weights")
    looked_up = eagle._spec_for(target)["trained"]
    assert (trained_head_directory(target, args.kind, script.spec_of(args), None)
            == trained_head_directory(target, eagle.kind, looked_up, eagle.cache_dir))
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
