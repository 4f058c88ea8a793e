"""The lock: the exact versions of everything ``./setup.sh`` installs, the ones the test suite last passed with.

Two files ship in ``specbench/data/``, one per build of torch: ``lock-cpu.txt`` and ``lock-cuda.txt``. Each is a
pip constraints file (``name==version`` a line) in two parts: first what specbench, its test extra and the
packages setup.sh adds (the embedded model, the question sets) need, then, below ``TORCH_SECTION``, what only torch
needs, ending with torch itself. setup.sh installs with the whole file as constraints where the torch found is the
locked one; beside another torch (a cluster's own build) it keeps the first part only, since torch's own
dependencies follow that torch's release. ``SPECBENCH_DEPS=latest ./setup.sh`` installs without the lock.

A run records how its installed versions differ from the lock (``differences``), so that the report can say a
number was measured on software the suite was not run with. Standard library only: ``scripts/lock.py`` reads the
lock before anything else is installed.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

LOCK_DIRECTORY = Path(__file__).resolve().parent.parent / "data"
BUILDS = ("cpu", "cuda")
# The line that starts the second part of a lock file; setup.sh cuts the file there by this very text.
TORCH_SECTION = "# torch's own dependencies"


def lock_path(build: str) -> Path:
    """The lock file of torch's ``build`` (``cpu`` or ``cuda``)."""
    if build not in BUILDS:
        raise ValueError(f"no lock for torch build {build!r}; the builds are {', '.join(BUILDS)}")
    return LOCK_DIRECTORY / f"lock-{build}.txt"


def build_of(cuda_version: str | None) -> str:
    """The lock that applies beside a torch whose ``torch.version.cuda`` is ``cuda_version``."""
    return "cpu" if cuda_version is None else "cuda"


def normalized(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503): ``typing_extensions`` is ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> str:
    """A version without its local label: torch's CPU build ``2.13.0+cpu`` is release ``2.13.0`` (pip's ``==2.13.0``
    accepts both builds; which build is setup.sh's choice, not the lock's)."""
    return version.split("+", 1)[0]


@dataclass(frozen=True)
class Lock:
    """One lock file read: ``pins`` (normalized name -> version) and which of them only torch needs."""

    build: str
    pins: dict[str, str]
    torch_only: frozenset[str]

    @property
    def torch_version(self) -> str | None:
        return self.pins.get("torch")


def parse_lock(text: str, build: str) -> Lock:
    """A lock file's text as a ``Lock``; a line that is neither a comment nor ``name==version`` is an error naming
    it (a hand edit gone wrong must not be installed as something else)."""
    pins: dict[str, str] = {}
    torch_only: set[str] = set()
    in_torch_section = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith(TORCH_SECTION):
            in_torch_section = True
            continue
        if not stripped or stripped.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s=;#]+)", stripped)
        if match is None:
            raise ValueError(f"lock-{build}.txt line {number}: {stripped!r} is not name==version")
        name = normalized(match.group(1))
        pins[name] = match.group(2)
        if in_torch_section:
            torch_only.add(name)
    return Lock(build, pins, frozenset(torch_only))


def read_lock(build: str, path: str | Path | None = None) -> Lock:
    """The shipped lock of ``build`` (or the file at ``path``)."""
    path = Path(path) if path is not None else lock_path(build)
    return parse_lock(path.read_text(encoding="utf-8"), build)


def installed_versions(names) -> dict[str, str | None]:
    """The version of each distribution in ``names`` that this python imports, None for one it lacks."""
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def differences(lock: Lock, installed: dict[str, str | None]) -> dict[str, dict]:
    """Each locked distribution whose installed version is another release than the lock's (a different local
    build label does not count): name -> {installed (None: missing), locked}. Empty when the environment is the
    lock's."""
    changed = {}
    for name, locked in sorted(lock.pins.items()):
        version = installed.get(name)
        if version is None or release(version) != release(locked):
            changed[name] = {"installed": version, "locked": locked}
    return changed


def versions_against_lock(cuda_version: str | None) -> dict:
    """What a run records of its software against the lock: the lock it is compared with and every difference
    (``{"lock": "lock-cpu.txt", "differences": {...}}``); ``differences`` is None where the lock cannot be read
    (an install without specbench's data files), so that "no difference" is never claimed unchecked."""
    build = build_of(cuda_version)
    try:
        lock = read_lock(build)
    except (OSError, ValueError):
        return {"lock": lock_path(build).name, "differences": None}
    return {"lock": lock_path(build).name, "differences": differences(lock, installed_versions(lock.pins))}


def describe(recorded: dict | None) -> str:
    """One line for a report: how a run's software compares with the lock (``versions_against_lock``'s record)."""
    if not recorded:
        return "not recorded (a run from before the lock)"
    changed = recorded.get("differences")
    if changed is None:
        return f"not checked ({recorded.get('lock')} could not be read)"
    if not changed:
        return f"as locked ({recorded.get('lock')})"
    parts = [f"{name} {values['installed'] or 'missing'} (lock {values['locked']})"
             for name, values in sorted(changed.items())]
    return f"{len(parts)} differ from {recorded.get('lock')}: " + ", ".join(parts)
