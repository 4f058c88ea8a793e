"""A trained EAGLE head (``training.eagle``) for a target no published head exists for, built once per target and
recipe and published whole; a build interrupted resumes from its checkpoint (``training.eagle.train``)."""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path

from specbench.artefacts.base import Artefact, PlannedArtefact
from specbench.artefacts.target_answers import TargetAnswers, resolve_prompts
from specbench.errors import SpecbenchError
from specbench.storage.cache import cached_path
from specbench.storage.manifest import read_manifest, verify_files
from specbench.training import eagle as training
from specbench.training.eagle import DATA_SECONDS, SECONDS_PER_KILO_TOKEN_STEP, Recipe, recipe_of


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
    hidden size squared): features plus training, without generating answers that are not cached yet (about 2
    minutes each for the greedy and the sampled set). For the log line only."""
    scale = (int(target.model.config.get_text_config().hidden_size) / 576) ** 2
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
        return f"rebuild it with `{rebuild_command(self.target, self.directory, self.kind, self.spec)}`"

    def inputs(self) -> list[Artefact]:
        # The greedy answers it trains on (training_conversations: target_answers' defaults).
        return [TargetAnswers(self.target, resolve_prompts(None), 256, purpose=f"the {self.kind} head trains on them",
                              command=self.given_command)]

    def build(self) -> None:
        self.announce()
        training.build_trained_head(self.target, self.directory, self.kind, **self.spec)

    def load(self):
        return load_trained_head(self.target, self.directory, self.kind, self.rebuild_command())

    def get(self):
        if self.given:
            directory = self.directory
            if directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
                with contextlib.suppress(OSError):
                    directory.rmdir()  # an empty directory made for the head: built as if missing
            if directory.exists():
                return self.load()
        return super().get()


def planned_head(target, directory: Path, kind: str, spec: dict, command: str | None = None) -> PlannedArtefact:
    """The plan entry of the head ``trained_head`` looks up."""
    return TrainedHead(target, directory, kind, spec, command=command).plan()


def trained_head(target, directory: Path, kind: str, spec: dict, given: bool, prepare: str | None = None):
    """The ``TrainedHead`` of ``spec`` at ``directory``, built first if need be."""
    return TrainedHead(target, directory, kind, spec, given, prepare).get()


def load_trained_head(target, directory: Path, kind: str, rebuild: str):
    """The published head at ``directory``, found whole first (every file of the size, and when its times changed
    the SHA-256, that its manifest.json recorded), then loaded strictly by ``load_eagle_head``, which checks it
    fits ``target``. Anything wrong is a one-line SpecbenchError ending in ``rebuild``."""
    from specbench.models.eagle_heads import load_eagle_head

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
