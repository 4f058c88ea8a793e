"""A draft head trained for a target no published head exists for (any kind of ``training.methods``: eagle,
eagle3, medusa, hydra), built once per target and recipe by the one trainer (``training.heads``) with the kind's
hooks, and published whole; a build interrupted resumes from its checkpoint (``training.heads.train``, whose module
docstring shows the layout)."""

from __future__ import annotations

import contextlib
import gc
import logging
import shlex
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from specbench.artefacts.base import Artefact
from specbench.artefacts.target_answers import (
    TargetAnswers,
    prompts_digest,
    resolve_prompt_set,
    sampled_answers,
    target_answers,
)
from specbench.errors import SpecbenchError
from specbench.storage.cache import cached_path
from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.training import methods
from specbench.training.heads import (
    CHECKPOINT_S,
    Labels,
    Recipe,
    acceptance,
    chain_positions,
    place,
    common_names,
    held_out_indices,
    recipe_of,
    target_sequences,
    train,
    training_sample,
)

log = logging.getLogger(__name__)
SCRIPT = "scripts/train_head.py"
# The target's features per training sequence, the held-out ones folded in (SmolLM2-135M alone on 2 cores: 366 s for
# the 579 training and 16 held-out answers to the head prompts, eagle3's and medusa's builds alike).
FEATURE_SECONDS_PER_SEQUENCE = 366.0 / 579
TOKENS_PER_SEQUENCE = 249  # prompt + answer, for the estimate only: the head prompts' mean (144,222 tokens / 579)


def head_key(recipe: Recipe) -> dict:
    """What names a head: its recipe (``Recipe.key``) and, where the prompt set is a local file, the SHA-256 of its
    text, so an edited set names another head."""
    key = recipe.key()
    digest = prompts_digest(recipe.prompts)
    return key if digest is None else {**key, "prompts_sha256": digest}


def trained_head_directory(target, kind: str, spec: dict, cache_dir: str | None) -> Path:
    """Where the cache keeps the head of ``kind`` trained for ``target`` with ``spec`` (a drafter's ``trained``
    entry). The key holds the whole recipe with its defaults filled in (``Recipe.key``), so an empty spec and one
    spelling out the defaults are the same head."""
    recipe = recipe_of(kind, spec)
    return cached_path(cache_dir, "heads", f"{target.name}-{kind}",
                       {"source": target.source, "kind": kind, **head_key(recipe)})


def command_value(value) -> str:
    """A setting's value as scripts/train_head.py reads it back (``setting_value``)."""
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)


def rebuild_command(target, directory: Path, kind: str, spec: dict) -> str:
    """The scripts/train_head.py command that builds the head of ``spec`` at ``directory``."""
    words = ["python", SCRIPT, "--model", target.name, "--kind", kind]
    recipe = recipe_of(kind, spec)
    for name in [*common_names(), *recipe.method]:
        if name in spec:
            value = recipe.method[name] if name in recipe.method else getattr(recipe, name)
            words += [f"--{name.replace('_', '-')}", command_value(value)]
    return shlex.join([*words, "--out", str(directory)])


def build_seconds_estimate(target, kind: str, recipe: Recipe, sequences: int) -> float | None:
    """A rough duration of a build of ``sequences`` training sequences on a 2-core CPU for a target the size of
    SmolLM2-135M (scaled by the target's hidden size squared): features plus training, without generating answers
    that are not cached yet (each answer set has its own estimate, target_answers.SECONDS_PER_ANSWER_SLOT). None
    when the kind's module has measured no rate. For the log line only."""
    rate = getattr(methods.module(kind), "SECONDS_PER_KILO_TOKEN", {}).get(kind)
    if rate is None:
        return None
    scale = (target.weights.hidden_size / 576) ** 2
    steps = recipe.steps(sequences)
    unroll = recipe.method.get("ttt_steps", 1)
    work = steps * recipe.batch_sequences * TOKENS_PER_SEQUENCE * unroll / 1000
    data = FEATURE_SECONDS_PER_SEQUENCE * sequences if steps else 0.0
    return scale * (data + work * rate)


class TrainedHead(Artefact):
    """The head of ``kind`` trained for ``target`` with ``spec`` (a drafter's ``trained`` entry) at ``directory``,
    built there first if missing, by one process while others wait. A damaged head in the cache (not ``given``)
    is rebuilt with a warning, since its directory's key covers everything it was built from; a damaged one in a
    directory the user has ``given`` stops the run with one line naming the problem and the command that rebuilds
    it. ``command``: what builds it ahead of time, for the line said before a build (default:
    scripts/train_head.py's). The greedy answers it trains on are planned beside it while it is not cached."""

    def __init__(self, target, directory: Path, kind: str, spec: dict, given: bool = False,
                 command: str | None = None):
        self.recipe = recipe_of(kind, spec)  # a bad recipe is one line before anything is looked up
        self.target, self.directory, self.kind, self.spec, self.given = target, Path(directory), kind, spec, given
        self.command = command or rebuild_command(target, self.directory, kind, spec)
        self.given_command = command

    @property
    def what(self) -> str:
        return (f"a {self.kind} head for {self.target.name} ({self.recipe.describe_steps()}; resumable if "
                "interrupted)")

    @property
    def label(self) -> str:
        return f"{self.kind} head of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        if self.recipe.train_steps == 0:
            return 0.0, "an untrained head"
        prompts = len(training_prompts(self.recipe)) - self.recipe.held_out
        sequences = prompts * (1 + self.recipe.sampled_answers)
        seconds = build_seconds_estimate(self.target, self.kind, self.recipe, sequences)
        if seconds is None:
            return None, f"no training rate measured for {self.kind} heads yet"
        return seconds, (f"{self.recipe.steps(sequences)} steps x {self.recipe.batch_sequences} sequences of "
                         f"~{TOKENS_PER_SEQUENCE} tokens, rates measured for SmolLM2-135M, scaled by hidden size "
                         "squared; answers not cached yet come on top")

    def rebuild_command(self) -> str:
        return rebuild_command(self.target, self.directory, self.kind, self.spec)

    def inputs(self) -> list[Artefact]:
        if self.recipe.train_steps == 0:
            return []  # an untrained head reads no data
        return [TargetAnswers(self.target, training_prompts(self.recipe), self.recipe.max_new_tokens,
                              purpose=f"the {self.kind} head trains on them", command=self.given_command)]

    def build(self) -> None:
        self.announce()
        build_trained_head(self.target, self.directory, self.kind, **self.spec)
        if self.target.device.type == "cuda":
            # the head, its optimizer and labels are garbage now: give their memory back before the run decodes
            gc.collect()
            torch.cuda.empty_cache()

    def load(self):
        return load_trained_head(self.target, self.directory, self.kind, f"rebuild it with `{self.rebuild_command()}`")

    def get(self):
        if self.given:
            directory = self.directory
            if directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
                with contextlib.suppress(OSError):
                    directory.rmdir()  # an empty directory made for the head: built as if missing
            if directory.exists():
                return self.load()
        return super().get()


def trained_head(target, directory: Path, kind: str, spec: dict, given: bool, prepare: str | None = None):
    """The ``TrainedHead`` of ``spec`` at ``directory``, built first if need be."""
    return TrainedHead(target, directory, kind, spec, given, prepare).get()


def load_trained_head(target, directory: Path, kind: str, rebuild: str):
    """The published head at ``directory``, found whole first (every file of the size, and when its times changed
    the SHA-256, that its manifest.json recorded), then loaded strictly by the kind's ``load`` hook, which checks it
    fits ``target``. Anything wrong is a one-line SpecbenchError ending in ``rebuild``."""
    manifest = read_manifest(directory, f"trained {kind} head", rebuild)
    problem = verify_files(directory, manifest)
    if problem:
        raise SpecbenchError(f"{directory}: damaged trained {kind} head ({problem}); {rebuild}")
    if manifest.get("kind") != f"trained {kind} head":
        raise SpecbenchError(f"{directory} holds a {manifest.get('kind', 'manifest without a kind')}, not a trained "
                             f"{kind} head; {rebuild}")
    try:
        return methods.module(kind).load(target, directory, kind)
    except SpecbenchError as error:
        raise SpecbenchError(f"{error}; {rebuild}") from None


# ---- the build ---------------------------------------------------------------------------------------------------


def training_prompts(recipe: Recipe) -> list[str]:
    """The prompts the head's answers answer (``Recipe.prompts``), in file order."""
    return resolve_prompt_set(recipe.prompts)


def training_conversations(target, recipe: Recipe) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) the head trains and is measured on: the target's greedy answers to
    ``training_prompts`` at ``recipe.max_new_tokens`` (cached; installed from the package where shipped, else
    generated on first use)."""
    return target_answers(target, training_prompts(recipe), recipe.max_new_tokens)


def training_device_name(device) -> str:
    """The device a head trains on, as its manifest records it: ``cpu``, or ``cuda:0 (NVIDIA H200)``."""
    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def staging_directory(directory: Path) -> Path:
    """Where a training under way keeps its checkpoint: beside the head's directory."""
    directory = Path(directory)
    return directory.with_name(f"{directory.name}.partial")


TRAIN_DEVICES = ("target", "cpu")  # where a head trains: beside the target (its device), or on the host


def build_trained_head(target, directory: Path, kind: str, *, checkpoint_s: float = CHECKPOINT_S, on_step=None,
                       train_device: str = "target", **spec) -> dict:
    """Train a head of ``kind`` for ``target`` with the recipe ``spec`` (``Recipe``'s keys and the kind's method
    settings) and publish it whole at ``directory`` in its method's format (the kind's ``save`` hook), with a
    manifest of the recipe, the data's counts, the losses, the acceptance measured one way on the held-out answers
    and on as many training answers (``heads.acceptance``) and the seconds; return the manifest. An interrupted
    build resumes from its checkpoint beside ``directory`` (see ``training.heads``). ``train_device``: where the
    head trains, ``target`` (the target's device, where its features come from) or ``cpu`` (the host, for a GPU
    with too little memory beside the target); like ``checkpoint_s`` and ``on_step`` (tests), not part of the
    recipe: the device changes how fast a head trains, not what it learns."""
    if train_device not in TRAIN_DEVICES:
        raise SpecbenchError(f"train_device={train_device!r} is unknown; choose one of {', '.join(TRAIN_DEVICES)}")
    started = time.perf_counter()
    directory = Path(directory)
    recipe = recipe_of(kind, spec)
    module = methods.module(kind)
    layers = tuple(module.feature_layers(kind, target.num_layers, recipe))
    identity = {"target": target.source, "kind": kind, "recipe": head_key(recipe)}
    staging = staging_directory(directory)
    data: dict = {"prompts": 0}
    losses, training_s, features_s, measuring_s = [], 0.0, 0.0, 0.0
    trained = held = {"acceptance": [], "chain_tokens": None, "drafts": 0}
    steps, trained_on = 0, None
    if recipe.train_steps == 0:
        head = module.new_head(target, kind, recipe, [])
    else:
        conversations = training_conversations(target, recipe)
        held_indices = held_out_indices(len(conversations), recipe.held_out)
        held_set = set(held_indices)
        greedy_set = [pair for i, pair in enumerate(conversations) if i not in held_set]
        sampled = []
        if recipe.sampled_answers:
            prompts = [prompt for i, prompt in enumerate(training_prompts(recipe)) if i not in held_set]
            sampled = sampled_answers(target, prompts, recipe.sampled_answers, recipe.sample_temperature, recipe.seed,
                                      recipe.max_new_tokens)
        training_set = greedy_set + sampled
        held_out_set = [conversations[i] for i in held_indices]
        feature_started = time.perf_counter()
        training_sequences = target_sequences(target, training_set, layers, f"{target.name} features (training)")
        measured = target_sequences(target, held_out_set, layers, f"{target.name} features (held out)")
        features_s = time.perf_counter() - feature_started
        head = module.new_head(target, kind, recipe, training_sequences)
        draft_ids = getattr(module, "draft_ids", None)
        labels = Labels(target, draft_ids(head, kind) if draft_ids is not None else None)
        steps = recipe.steps(len(training_sequences))
        data.update(prompts=len(conversations), training_prompts=len(greedy_set), held_out_prompts=len(held_indices),
                    answers=len(training_set), sampled_answers=len(sampled),
                    answer_tokens=sum(len(answer) for _, answer in training_set),
                    prompt_tokens=sum(len(prompt) for prompt, _ in training_set),
                    held_out_answer_tokens=sum(len(answer) for _, answer in held_out_set))
        notes = getattr(module, "notes", None)
        if notes is not None:
            data.update(notes(head, kind, training_sequences, measured))
        # The head trains where the target ran (its features came from there), in float32, unless told to train on
        # the host: said, since a GPU trains in minutes what 2 CPU cores train in an hour.
        device = target.device if train_device == "target" else torch.device("cpu")
        trained_on = training_device_name(device)
        log.info("%s: the %s head trains on %s in float32", target.name, kind, trained_on)
        try:
            head = place(head, module, kind, device)
            if getattr(module, "READS_LABELS", True):  # Medusa's hard labels never read the target's lm_head copy
                labels.to(device)
            losses, training_s = train(head, labels, training_sequences, kind, recipe, staging, identity,
                                       checkpoint_s=checkpoint_s, on_step=on_step)
            measuring_started = time.perf_counter()
            # as many greedy training answers as held-out ones, measured the same way: the gap is what training
            # fitted
            sample = [training_sequences[i] for i in training_sample(len(greedy_set), len(measured))]
            positions = chain_positions(module, kind, recipe)
            trained = acceptance(head, module, labels, sample, kind, positions)
            held = acceptance(head, module, labels, measured, kind, positions)
            measuring_s = time.perf_counter() - measuring_started
        except torch.cuda.OutOfMemoryError as error:
            # the checkpoint train() writes on the way out (between two updates) resumes it on the host
            first = (str(error).strip().splitlines() or [""])[0][:120]
            raise SpecbenchError(f"training the {kind} head on {trained_on} ran out of GPU memory beside the "
                                 f"target ({first}); train it on the host instead: "
                                 f"{rebuild_command(target, directory, kind, spec)} --train-device cpu") from None
    manifest = {
        "kind": f"trained {kind} head",
        "target": {"name": target.name, "source": target.source, "layers": target.num_layers},
        "head_kind": kind,
        "recipe": head_key(recipe),
        "feature_layers": list(layers),
        "data": data,
        "steps": steps,
        "trained_on": trained_on,
        "loss": {"first": round(losses[0], 4) if losses else None,
                 "last20": round(float(np.mean(losses[-20:])), 4) if losses else None},
        "train_acceptance": trained,
        "held_out_acceptance": held,
        "seconds": {"features": round(features_s, 1), "training": round(training_s, 1),
                    "measuring": round(measuring_s, 1), "total": round(time.perf_counter() - started, 1)},
    }
    replace_directory(directory, lambda version: module.save(head, kind, version), manifest)
    with contextlib.suppress(OSError):  # published: the checkpoint is never read again
        shutil.rmtree(staging)
    log.info("%s head for %s saved to %s in %.0f s; acceptance per draft position held out %s, on training "
             "answers %s", kind, target.name, directory, manifest["seconds"]["total"], held["acceptance"],
             trained["acceptance"])
    return manifest
