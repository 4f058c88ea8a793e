"""What every cached artefact is (target answers, statistics datastores, HD's model databases, SAM's corpus
automata, pruned drafts, trained EAGLE heads, GGUF conversions): an ``Artefact`` knows its directory (its key is in
the name), what it is in one line, its build estimate, how to build and publish it, how to load and check what is
published, and the commands that build it ahead of time and rebuild it. ``Drafter.artefacts(target)`` returns
them, ``Drafter.prepare`` loads them (``fetch``: built on first use, by one process while others wait, rebuilt with
a warning when damaged) and ``python -m specbench.prepare`` builds the same objects ahead of time."""

from __future__ import annotations

import functools
import json
import logging
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from specbench.errors import SpecbenchError, damage_reason
from specbench.storage.cache import versions_dir
from specbench.storage.locks import artefact_lock
from specbench.storage.manifest import MANIFEST, verify_files
from specbench.storage.publish import CACHE_HINT, require_writable
from specbench.storage.refusal import refusing_writes, storage_refusal

log = logging.getLogger(__name__)

Loaded = TypeVar("Loaded")

# Why this process may not build artefacts, only load them (None: it may): vLLM's worker, where a drafter runs
# without the target's weights (``engines.vllm_proposer.refuse_builds``).
BUILDS_REFUSED: str | None = None


def load_or_rebuild(directory: Path, what: str, load: Callable[[], Loaded], build: Callable[[], None]) -> Loaded:
    """A cached (``auto``) artefact: ``load()`` it if it is there and passes its checks; otherwise ``build()`` it
    (first checking that the cache is writable) and load it. One process builds it: others wait for its build
    lock (``artefact_lock``) and then load what it built; one that waits past ``SPECBENCH_LOCK_WAIT_S`` stops
    with one line naming the builder. A cached artefact that fails its checks is damaged (the cache key covers
    everything it was built from), so it is rebuilt with one warning rather than stopping the run."""
    directory = Path(directory)
    if directory.exists():
        try:
            return load()
        except SpecbenchError as error:
            if BUILDS_REFUSED is not None:
                raise SpecbenchError(f"the {what} in {directory} does not load ({error}), and {BUILDS_REFUSED}") from None
            # damaged, or another process published a new version while it was read: judged under the lock
    if BUILDS_REFUSED is not None:
        raise SpecbenchError(f"the {what} is not in the cache ({directory}), and {BUILDS_REFUSED}")
    require_writable(directory)
    try:
        versions_dir(directory).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        refusal = storage_refusal(error, versions_dir(directory), "create")
        if refusal is None:
            raise SpecbenchError(f"cannot build {directory} ({error.strerror}); {CACHE_HINT}") from None
        raise refusal from error
    lock = artefact_lock(directory)
    if not lock.acquire():
        try:
            return load()
        except SpecbenchError:
            raise SpecbenchError(f"the {what} in {directory} is still being built after {lock.wait_s:g} s "
                                 f"(SPECBENCH_LOCK_WAIT_S): {lock.refusal()}") from None
    try:
        if directory.exists():
            try:
                return load()  # built by the process this one waited for
            except SpecbenchError as error:
                log.warning("the cached %s is damaged and is being rebuilt: %s", what, error)
                with refusing_writes(directory, "remove the damaged"):
                    if not directory.is_symlink() and directory.is_dir():  # the cache's own, written before versions
                        shutil.rmtree(directory)
                    elif directory.is_file():
                        directory.unlink()
        else:
            # The builder says what it builds, how long it takes and how to build it ahead (announce_build).
            log.debug("building the %s (once; cached in %s)", what, directory)
        build()
    finally:
        lock.release()
        if not directory.exists():  # a first build that failed leaves no trace (rmdir: only an empty folder)
            try:
                versions_dir(directory).rmdir()
            except OSError:
                pass
    return load()


# A build expected to take longer than this is announced as a warning: long enough to surprise a user who asked for
# a run, not for a build. Shorter ones are announced at INFO.
LONG_BUILD_S = 60.0
PREPARE_COMMAND = "python -m specbench.prepare"


@dataclass(frozen=True)
class PlannedArtefact:
    """One artefact a run looks up in the cache: what it is, where it is cached, a rough build time on a 2-core
    CPU (None: not known before its source is downloaded) with what that estimate is scaled from, and the command
    that builds it ahead of time. ``shipped``: the package carries it, and its copy was checked whole, so it is
    installed, not built; ``shipped_damage``: why the package's copy cannot be installed, when it is damaged.

    A plan says what it has checked, and checks what a run will: a cached copy counts as cached only when its
    files are the ones its manifest records and, given ``load`` (the artefact's own ``load``, which a run calls),
    when it loads (``cached_damage``); a shipped one only when the install's own check passes (whoever plans it)."""

    what: str
    directory: Path
    seconds: float | None
    basis: str
    command: str
    shipped: bool = False
    shipped_damage: str | None = None
    load: Callable[[], object] | None = field(default=None, compare=False, repr=False)

    def cached(self) -> bool:
        """Whether something is cached there, whole or not (``ready``: whole)."""
        return Path(self.directory).exists()

    @functools.cached_property
    def cached_damage(self) -> str | None:
        """What is wrong with the cached copy (its manifest unreadable, a file of another size or checksum than
        the manifest records; then whatever its ``load`` refuses: a format of another version, another kind, a
        tokenizer or shape that does not fit the target), or None when it is whole or there is none. Checked once
        per plan entry: a copy planned as cached is one the run loads, never one it rebuilds for many minutes."""
        if not self.cached():
            return None
        manifest_file = Path(self.directory) / MANIFEST
        if not manifest_file.is_file():
            return f"no {MANIFEST}"
        try:
            manifest = json.loads(manifest_file.read_text())
        except Exception as error:  # whatever the reading raised: the manifest is damaged
            return f"{MANIFEST}: {damage_reason(error)}"
        if not isinstance(manifest, dict):
            return f"{MANIFEST} is not a JSON object"
        problem = verify_files(Path(self.directory), manifest)
        if problem is None and self.load is not None:
            try:
                self.load()
            except SpecbenchError as error:  # what load_or_rebuild takes for damage, and rebuilds
                return " ".join(str(error).split())
        return problem

    def ready(self) -> bool:
        """Cached and whole: nothing to do."""
        return self.cached() and self.cached_damage is None

    def needs_build(self) -> bool:
        """Whether a run would build it: not ready and not installable from the package."""
        return not self.ready() and not self.shipped

    def state(self) -> str:
        if self.ready():
            return "cached"
        if self.shipped:
            if self.cached():
                return (f"the cached copy is damaged ({self.cached_damage}): reinstalled from the copy shipped with "
                        "specbench, in a second")
            return "shipped with specbench (installed in a second)"
        why = []
        if self.cached():
            why.append(f"the cached copy is damaged ({self.cached_damage})")
        if self.shipped_damage:
            why.append(f"the copy shipped with specbench is damaged ({self.shipped_damage})")
        return (f"{'; '.join(why)}: " if why else "") + f"to build, {estimate_text(self)}"


def duration_text(seconds: float) -> str:
    """A rough duration for a person: 40 -> "about 40 s", 1057 -> "about 18 min", 9000 -> "about 2.5 h"."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"


def estimate_text(planned: PlannedArtefact) -> str:
    if planned.seconds is None:
        return f"time not known in advance ({planned.basis})"
    return f"{duration_text(planned.seconds)} on a 2-core CPU (an estimate: {planned.basis})"


def build_notice(planned: PlannedArtefact) -> str:
    """The one line said before ``planned`` is built on first use: what, how long, where it is cached, and the
    command that builds it ahead of time.

    Example: "building the greedy answers of smollm2-135m to 96 prompts (once): about 18 min on a 2-core CPU (an
    estimate: ...); cached in ~/.cache/specbench/answers/...; to build it ahead of time: python -m specbench.prepare
    --model smollm2-135m --drafters hd"."""
    return (f"building {planned.what} (once): {estimate_text(planned)}; cached in {planned.directory}; "
            f"to build it ahead of time: {planned.command}")


def announce_build(planned: PlannedArtefact) -> str:
    """Log ``build_notice(planned)``, as a warning when the build is long or of unknown length; return the line."""
    line = build_notice(planned)
    long = planned.seconds is None or planned.seconds > LONG_BUILD_S
    log.log(logging.WARNING if long else logging.INFO, "%s", line)
    return line


def prepare_command(model: str, drafter: str | None = None) -> str:
    """The ``python -m specbench.prepare`` command that builds what ``drafter`` needs for ``model``."""
    return f"{PREPARE_COMMAND} --model {model}" + (f" --drafters {drafter}" if drafter else "")


# The work a decoder-only model does per token, as its weight count from its config (attention taken at full width,
# the output layer included): the measure build-time estimates scale by, the same whichever linear backend packs
# the weights. SmolLM2-135M's (30 layers of width 576, 1536 wide MLPs, 49152 tokens), the model the rates were
# measured on.
REFERENCE_WEIGHTS = 30 * (4 * 576 * 576 + 3 * 576 * 1536) + 49152 * 576


def relative_size(target) -> float:
    """How many times SmolLM2-135M's per-token work ``target`` does (see REFERENCE_WEIGHTS), for estimates."""
    config = target.weights.architecture
    width, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    mlp = int(config.get("intermediate_size") or 4 * width)
    return (layers * (4 * width * width + 3 * width * mlp) + int(config["vocab_size"]) * width) / REFERENCE_WEIGHTS


class Artefact(ABC):
    """One cached thing. A subclass sets ``directory`` (where the cache keeps it: its key is in the name) and
    ``command`` (what builds it ahead of time) and implements the rest; ``get`` is the one way a run obtains it.

    ``build`` publishes the artefact whole at ``directory`` through ``storage.publish.replace_directory``: it is
    written into a staging directory beside the published one and renamed in, so a killed build leaves nothing
    that looks complete, and a reader of the previous version keeps a complete directory."""

    directory: Path
    command: str

    @property
    @abstractmethod
    def what(self) -> str:
        """What it is, in one line of the plan and of the notice said before a build ("the greedy answers of ...")."""

    @property
    @abstractmethod
    def label(self) -> str:
        """Its name in the lines of a wait or a rebuild ("answer set of smollm2-135m")."""

    @abstractmethod
    def estimate(self) -> tuple[float | None, str]:
        """(a rough build time in seconds on a 2-core CPU, or None when not known before its source is downloaded;
        what that estimate is scaled from)."""

    @abstractmethod
    def rebuild_command(self) -> str:
        """The command that builds it again where it is (what a line saying it is damaged names)."""

    @abstractmethod
    def build(self) -> None:
        """Build it (its inputs first, through their own ``get``), announcing the build in one line
        (``announce``), and publish it whole at ``directory``."""

    @abstractmethod
    def load(self):
        """What is published at ``directory``, checked whole (its manifest's sizes and checksums) and fit for the
        target; a one-line SpecbenchError when it is missing or damaged."""

    def check(self) -> None:
        """What can be checked in a moment before any build starts (a corpus found and holding text, settings that
        fit the target), as one line: so that a missing input fails before minutes of other building."""

    def inputs(self) -> list[Artefact]:
        """The cached artefacts it is built from (HD's model database: the target's answers), planned beside it
        while it is not cached."""
        return []

    def shipped_copy(self) -> tuple[bool, str | None]:
        """(whether the package carries a copy checked whole, installed rather than built; why the package's copy
        cannot be installed, when it is damaged)."""
        return False, None

    def plan(self) -> PlannedArtefact:
        """Its plan entry: what, where, the estimate, and what is cached or shipped, as checked now (a cached copy
        by the very ``load`` a run calls, when the plan asks whether it is whole)."""
        seconds, basis = self.estimate()
        shipped, damage = self.shipped_copy()
        return PlannedArtefact(self.what, Path(self.directory), seconds, basis, self.command, shipped, damage,
                               load=self.load)

    def announce(self) -> str:
        """Say, before building it, what it is, how long it takes and how to build it ahead of time."""
        return announce_build(self.plan())

    def cached(self) -> bool:
        """Whether something is cached at its directory, whole or not."""
        return Path(self.directory).exists()

    def get(self):
        """Load it, building it first when it is not cached, rebuilding it with a warning when it is damaged
        (``load_or_rebuild``)."""
        return load_or_rebuild(Path(self.directory), self.label, self.load, self.build)


def plan_entries(artefacts: Iterable[Artefact]) -> list[PlannedArtefact]:
    """The plan entries of ``artefacts``, each preceded by those of its inputs while it is not cached (an input is
    not read once what is built from it is cached)."""
    entries = []
    for artefact in artefacts:
        if not artefact.cached():
            entries += plan_entries(artefact.inputs())
        entries.append(artefact.plan())
    return entries


def fetch(artefacts: dict[str, Artefact]) -> dict[str, object]:
    """Every artefact of ``artefacts`` loaded (``Artefact.get``), under the same names: each one not cached yet is
    checked first (``Artefact.check``), so that a missing input is one line before minutes of building another."""
    for artefact in artefacts.values():
        if not artefact.cached():
            artefact.check()
    return {name: artefact.get() for name, artefact in artefacts.items()}
