"""A trained EAGLE head (``training.eagle``) for a target no published head exists for, built once per target and
recipe and published whole; a build interrupted resumes from its checkpoint (``training.eagle.train``, whose
module docstring shows the layout)."""

from __future__ import annotations

import contextlib
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
    read_prompts,
    resolve_prompts,
    sampled_answers,
    target_answers,
)
from specbench.datastores.prompts import MODEL_DB_PROMPTS
from specbench.errors import SpecbenchError
from specbench.storage.cache import cached_path
from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.training.eagle import (
    CHECKPOINT_S,
    DATA_SECONDS,
    SECONDS_PER_KILO_TOKEN_STEP,
    Labels,
    Recipe,
    greedy_token_counts,
    held_out_acceptance,
    held_out_indices,
    new_head,
    recipe_of,
    select_draft_vocabulary,
    target_sequences,
    train,
)

log = logging.getLogger(__name__)


def trained_head_directory(target, kind: str, spec: dict, cache_dir: str | None) -> Path:
    """Where the cache keeps the head of ``kind`` trained for ``target`` with ``spec`` (a drafter's ``trained``
    entry). The key holds the whole recipe with its defaults filled in (``Recipe.key``), so an empty spec and one
    spelling out the defaults are the same head."""
    recipe = recipe_of(kind, spec)
    return cached_path(cache_dir, "heads", f"{target.name}-{kind}",
                       {"source": target.source, "kind": kind, **recipe.key(kind)})


def rebuild_command(target, directory: Path, kind: str, spec: dict) -> str:
    """The scripts/train_eagle.py command that builds the head of ``spec`` at ``directory``."""
    words = ["python", "scripts/train_eagle.py", "--model", target.name, "--kind", kind]
    for name, value in recipe_of(kind, spec).key(kind).items():
        if name == "recipe_version" or name not in spec:
            continue
        if isinstance(value, list):
            value = ",".join(str(layer) for layer in value)
        words += [f"--{name.replace('_', '-')}", "none" if value is None else str(value)]
    return shlex.join([*words, "--out", str(directory)])


def build_seconds_estimate(target, kind: str, recipe: Recipe, tokens_per_sequence: int = 300) -> float:
    """A rough duration of a build on a 2-core CPU for a target the size of SmolLM2-135M (scaled by the target's
    hidden size squared): features plus training, without generating answers that are not cached yet (each
    answer set has its own estimate, target_answers.SECONDS_PER_ANSWER_SLOT: about 4.5 min for the embedded model,
    docs/first_use.md). For the log line only."""
    scale = (target.weights.hidden_size / 576) ** 2
    steps = recipe.ttt_steps if kind == "eagle3" else 1
    work = recipe.train_steps * recipe.batch_sequences * tokens_per_sequence * steps / 1000
    data = DATA_SECONDS if recipe.train_steps else 0.0
    return scale * (data + work * SECONDS_PER_KILO_TOKEN_STEP[kind])


class TrainedHead(Artefact):
    """The head of ``kind`` trained for ``target`` with ``spec`` (a drafter's ``trained`` entry) at ``directory``,
    built there first if missing, by one process while others wait. A damaged head in the cache (not ``given``)
    is rebuilt with a warning, since its directory's key covers everything it was built from; a damaged one in a
    directory the user has ``given`` stops the run with one line naming the problem and the command that rebuilds
    it. ``command``: what builds it ahead of time, for the line said before a build (default:
    scripts/train_eagle.py's). The greedy answers it trains on are planned beside it while it is not cached."""

    def __init__(self, target, directory: Path, kind: str, spec: dict, given: bool = False,
                 command: str | None = None):
        self.recipe = recipe_of(kind, spec)  # a bad recipe is one line before anything is looked up
        self.target, self.directory, self.kind, self.spec, self.given = target, Path(directory), kind, spec, given
        self.command = command or rebuild_command(target, self.directory, kind, spec)
        self.given_command = command

    @property
    def what(self) -> str:
        return (f"an {self.kind} head for {self.target.name} ({self.recipe.train_steps} training steps; resumable if "
                "interrupted)")

    @property
    def label(self) -> str:
        return f"{self.kind} head of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        return (build_seconds_estimate(self.target, self.kind, self.recipe),
                f"{self.recipe.train_steps} steps x {self.recipe.batch_sequences} sequences of ~300 tokens, rates "
                "measured for SmolLM2-135M, scaled by hidden size squared; answers not cached yet come on top")

    def rebuild_command(self) -> str:
        return rebuild_command(self.target, self.directory, self.kind, self.spec)

    def inputs(self) -> list[Artefact]:
        # The greedy answers it trains on (training_conversations: target_answers' defaults).
        return [TargetAnswers(self.target, resolve_prompts(None), 256, purpose=f"the {self.kind} head trains on them",
                              command=self.given_command)]

    def build(self) -> None:
        self.announce()
        build_trained_head(self.target, self.directory, self.kind, **self.spec)

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
    the SHA-256, that its manifest.json recorded), then loaded strictly by ``load_eagle_head``, which checks it
    fits ``target``. Anything wrong is a one-line SpecbenchError ending in ``rebuild``."""
    from specbench.heads.eagle_head_files import load_eagle_head

    manifest = read_manifest(directory, f"trained {kind} head", rebuild)
    problem = verify_files(directory, manifest)
    if problem:
        raise SpecbenchError(f"{directory}: damaged trained {kind} head ({problem}); {rebuild}")
    if manifest.get("kind") != f"trained {kind} head":
        raise SpecbenchError(f"{directory} holds a {manifest.get('kind', 'manifest without a kind')}, not a trained "
                             f"{kind} head; {rebuild}")
    try:
        return load_eagle_head(target, str(directory), kind)
    except SpecbenchError as error:
        raise SpecbenchError(f"{error}; {rebuild}") from None


# ---- the build ---------------------------------------------------------------------------------------------------


def training_conversations(target) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) the head trains and is measured on: the target's greedy answers to the built-in
    prompt set (cached; generated on first use)."""
    return target_answers(target)


def training_prompts(target) -> list[str]:
    """The prompts of ``training_conversations``, in the same order."""
    return read_prompts(MODEL_DB_PROMPTS)


def staging_directory(directory: Path) -> Path:
    """Where a training under way keeps its checkpoint: beside the head's directory."""
    directory = Path(directory)
    return directory.with_name(f"{directory.name}.partial")


def build_trained_head(target, directory: Path, kind: str, *, checkpoint_s: float = CHECKPOINT_S, on_step=None,
                       **spec) -> dict:
    """Train a head of ``kind`` for ``target`` with the recipe ``spec`` (``Recipe``'s keys) and publish it whole at
    ``directory`` (speculators format for eagle3, EAGLE's for eagle, naming ``target.source`` as the verifier) with
    a manifest of the recipe, the data's sizes, the losses, the held-out acceptance and the seconds; return the
    manifest. An interrupted build resumes from its checkpoint beside ``directory`` (see the module docstring).
    ``checkpoint_s`` and ``on_step`` are for tests, not part of the recipe."""
    from specbench.heads.eagle_head_files import save_eagle_head

    started = time.perf_counter()
    directory = Path(directory)
    recipe = recipe_of(kind, spec)
    head = new_head(target, kind, recipe)
    layers = tuple(head.config.feature_layers)
    identity = {"target": target.source, "kind": kind, "recipe": recipe.key(kind)}
    staging = staging_directory(directory)
    data: dict = {"conversations": 0}
    losses, training_s, features_s, evaluation = [], 0.0, 0.0, {"acceptance": [], "chain_tokens": None, "drafts": 0}
    if recipe.train_steps > 0:
        conversations = training_conversations(target)
        held = held_out_indices(len(conversations), recipe.held_out)
        held_set = set(held)
        training_set = [pair for i, pair in enumerate(conversations) if i not in held_set]
        sampled = []
        if recipe.sampled_answers:
            prompts = [prompt for i, prompt in enumerate(training_prompts(target)) if i not in held_set]
            sampled = sampled_answers(target, prompts, recipe.sampled_answers, recipe.sample_temperature, recipe.seed)
            data.update(sampled_answers=len(sampled), sampled_answer_tokens=sum(len(answer) for _, answer in sampled))
        training_set += sampled
        feature_started = time.perf_counter()
        training_sequences = target_sequences(target, training_set, layers, f"{target.name} features (training)")
        measured = target_sequences(target, [conversations[i] for i in held], layers,
                                    f"{target.name} features (held out)")
        features_s = time.perf_counter() - feature_started
        draft_ids = None
        if getattr(head, "d2t", None) is not None:
            counts = greedy_token_counts(training_sequences, target.vocab_size)
            chosen = select_draft_vocabulary(counts, head.config.draft_vocab_size)
            head.set_draft_vocabulary(torch.from_numpy(chosen))
            draft_ids = torch.from_numpy(chosen)
            data["draft_vocab_coverage"] = round(float(counts[chosen].sum() / max(1, counts.sum())), 4)
            # the share of the held-out greedy choices the draft vocabulary can name: position 1's ceiling
            measured_counts = greedy_token_counts(measured, target.vocab_size)
            data["held_out_draft_vocab_coverage"] = round(float(measured_counts[chosen].sum()
                                                                / max(1, measured_counts.sum())), 4)
        labels = Labels(target, draft_ids)
        data.update(conversations=len(conversations), training_conversations=len(training_set) - len(sampled),
                    held_out_conversations=len(held),
                    training_answer_tokens=sum(len(answer) for _, answer in training_set),
                    training_prompt_tokens=sum(len(prompt) for prompt, _ in training_set),
                    held_out_answer_tokens=sum(len(conversations[i][1]) for i in held))
        losses, training_s = train(head, labels, training_sequences, kind, recipe, staging, identity,
                                   checkpoint_s=checkpoint_s, on_step=on_step)
        evaluation = held_out_acceptance(head, measured)
    elif getattr(head, "d2t", None) is not None:
        # no data to count: the draft vocabulary is the first ids (the random head drafts at random anyway)
        head.set_draft_vocabulary(torch.arange(head.config.draft_vocab_size))
    manifest = {
        "kind": f"trained {kind} head",
        "target": {"name": target.name, "source": target.source, "layers": target.num_layers},
        "head_kind": kind,
        "recipe": recipe.key(kind),
        "feature_layers": list(layers),
        "draft_vocab_size": head.config.draft_vocab_size,
        "data": data,
        "loss": {"first": round(losses[0], 4) if losses else None,
                 "last20": round(float(np.mean(losses[-20:])), 4) if losses else None},
        "held_out": evaluation,
        "seconds": {"features": round(features_s, 1), "training": round(training_s, 1),
                    "total": round(time.perf_counter() - started, 1)},
    }
    replace_directory(directory, lambda version: save_eagle_head(head, version, head.config.format), manifest)
    with contextlib.suppress(OSError):  # published: the checkpoint is never read again
        shutil.rmtree(staging)
    log.info("%s head for %s saved to %s in %.0f s; held-out acceptance per draft position %s", kind, target.name,
             directory, manifest["seconds"]["total"], evaluation["acceptance"])
    return manifest
