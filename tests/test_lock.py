"""The lock (specbench/data/lock-cpu.txt, lock-cuda.txt): what it holds, how it is read, how a run and the report
compare the installed versions with it (specbench.run.locked_versions, scripts/lock.py); setup.sh's use of it is
tested in test_setup.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specbench.run.locked_versions import (TORCH_SECTION, describe, differences, parse_lock, read_lock,
                                           versions_against_lock)

REPO = Path(__file__).resolve().parent.parent


def pyproject_requirements() -> list[Requirement]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["test"]]


@pytest.mark.parametrize("build", ["cpu", "cuda"])
def test_the_lock_pins_every_requirement_inside_pyprojects_range(build):
    lock = read_lock(build)
    for requirement in pyproject_requirements():
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in lock.pins, f"{requirement} is not in lock-{build}.txt"
        assert requirement.specifier.contains(lock.pins[name], prereleases=True), (requirement, lock.pins[name])


def test_both_locks_share_what_is_not_torchs_own_and_torch_is_setups():
    cpu, cuda = read_lock("cpu"), read_lock("cuda")
    shared = {name: version for name, version in cpu.pins.items() if name not in cpu.torch_only}
    assert shared == {name: version for name, version in cuda.pins.items() if name not in cuda.torch_only}
    # torch's own dependencies the two builds share have one version too; the CUDA build adds its libraries.
    assert all(cuda.pins[name] == cpu.pins[name] for name in cpu.torch_only)
    assert {"nvidia-cublas", "triton"} <= cuda.torch_only and not {"nvidia-cublas", "triton"} & set(cpu.pins)
    setup = (REPO / "setup.sh").read_text()
    assert cpu.torch_version == cuda.torch_version == re.search(r"^TORCH_VERSION=([0-9.]+)", setup, re.M).group(1)
    assert f'TORCH_SECTION="{TORCH_SECTION}"' in setup  # where setup.sh cuts a lock is where the reader splits it


def test_the_lock_holds_what_setup_installs_without_dependencies():
    setup = (REPO / "setup.sh").read_text()
    no_deps = [word for line in setup.splitlines() if re.match(r"\s*locked_install .*--no-deps", line)
               for word in line.split("--no-deps", 1)[1].split()]
    names = [re.split(r"==", word)[0] for word in no_deps]
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import lock as lock_script
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert sorted(names) == sorted(lock_script.NO_DEPS)
    cpu = read_lock("cpu")
    for word in no_deps:
        name, _, version = word.partition("==")
        assert name in cpu.pins and (not version or cpu.pins[name] == version), word


LOCK_TEXT = f"""# a header
numpy==2.4.6
typing_extensions==4.16.0
{TORCH_SECTION} (setup.sh keeps them only where the torch found is the one locked here)
sympy==1.14.0
torch==2.13.0
"""


def test_a_lock_is_read_with_names_as_pip_compares_them_and_its_torch_part_apart():
    lock = parse_lock(LOCK_TEXT, "cpu")
    assert lock.pins == {"numpy": "2.4.6", "typing-extensions": "4.16.0", "sympy": "1.14.0", "torch": "2.13.0"}
    assert lock.torch_only == {"sympy", "torch"} and lock.torch_version == "2.13.0"
    with pytest.raises(ValueError, match=r"lock-cpu.txt line 2: 'numpy>=2' is not name==version"):
        parse_lock("# header\nnumpy>=2\n", "cpu")


def test_differences_name_each_other_release_and_each_missing_package_but_not_a_build_label():
    lock = parse_lock(LOCK_TEXT, "cpu")
    installed = {"numpy": "2.4.6", "typing-extensions": "4.17.0", "sympy": None, "torch": "2.13.0+cpu"}
    assert differences(lock, installed) == {"typing-extensions": {"installed": "4.17.0", "locked": "4.16.0"},
                                            "sympy": {"installed": None, "locked": "1.14.0"}}
    assert differences(lock, {**installed, "typing-extensions": "4.16.0", "sympy": "1.14.0"}) == {}


def test_a_run_records_its_differences_and_the_report_line_says_them(monkeypatch):
    import specbench.run.locked_versions as locked_versions

    lock = read_lock("cpu")
    monkeypatch.setattr(locked_versions, "installed_versions",
                        lambda names: {**{name: lock.pins.get(name) for name in names}, "transformers": "5.26.0"})
    recorded = versions_against_lock(None)
    assert recorded == {"lock": "lock-cpu.txt",
                        "differences": {"transformers": {"installed": "5.26.0", "locked": lock.pins["transformers"]}}}
    assert describe(recorded) == f"1 differ from lock-cpu.txt: transformers 5.26.0 (lock {lock.pins['transformers']})"
    assert versions_against_lock("12.8")["lock"] == "lock-cuda.txt"
    assert describe({"lock": "lock-cpu.txt", "differences": {}}) == "as locked (lock-cpu.txt)"
    assert describe(None) == "not recorded (a run from before the lock)"
    monkeypatch.setattr(locked_versions, "read_lock", lambda build: (_ for _ in ()).throw(OSError("gone")))
    assert describe(versions_against_lock(None)) == "not checked (lock-cpu.txt could not be read)"


def test_the_report_warns_of_runs_measured_off_the_lock(tmp_path):
    import json

    from analysis.report import environment_section
    from specbench.results.schema import SCHEMA_VERSION

    def run(name, recorded):
        directory = tmp_path / name
        directory.mkdir()
        environment = {"device": "cpu: a CPU", "torch": "2.13.0+cpu"}
        if recorded is not None:
            environment["versions_vs_lock"] = recorded
        (directory / "summary.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "model": "m",
                                                            "drafter": "pld", "tasks": {},
                                                            "environment": environment}))
        return str(directory)

    off = {"lock": "lock-cpu.txt", "differences": {"transformers": {"installed": "5.26.0", "locked": "5.25.0"}}}
    page = environment_section([run("a", off), run("b", {"lock": "lock-cpu.txt", "differences": {}}), run("c", None)])
    assert "class='warning'>Measured with versions other than the lock's, which the test suite" in page
    assert "(1 of 3 runs): a: 1 differ from lock-cpu.txt: transformers 5.26.0 (lock 5.25.0)" in page
    assert "as locked (lock-cpu.txt)" in page and "not recorded (a run from before the lock)" in page
    quiet = environment_section([run("d", {"lock": "lock-cpu.txt", "differences": {}})])
    assert "warning" not in quiet


def test_lock_check_names_each_difference_and_exits_1(tmp_path):
    """``scripts/lock.py check`` (setup.sh and scripts/latest_env.sh print it): 0 for an environment that is the
    lock's, 1 and a line per difference otherwise."""
    from importlib.metadata import version

    def check(text):
        path = tmp_path / "lock-test.txt"
        path.write_text(text)
        return subprocess.run([sys.executable, str(REPO / "scripts" / "lock.py"), "check", "--lock", str(path)],
                              capture_output=True, text=True, timeout=120)

    same = check(f"numpy=={version('numpy')}\npytest=={version('pytest')}\n")
    assert same.returncode == 0 and "has the versions of lock-test.txt" in same.stdout, same.stdout + same.stderr
    off = check(f"numpy==0.0.1\npytest=={version('pytest')}\nno-such-package==1.0\n")
    assert off.returncode == 1
    assert off.stdout.splitlines() == [f"lock: no-such-package is missing (locked: 1.0)",
                                       f"lock: numpy {version('numpy')} (locked: 0.0.1)",
                                       "lock: 2 of 3 differ from lock-test.txt"]


def test_a_lock_written_again_from_this_environment_is_the_shipped_one_where_it_is_the_lock(monkeypatch):
    """scripts/lock.py's walk of the installed dependencies finds exactly the shipped lock's first part in an
    environment set up from it (so the lock says what setup.sh installs, no more and no less)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import lock as lock_script
    finally:
        sys.path.remove(str(REPO / "scripts"))
    cpu = read_lock("cpu")
    if differences(cpu, lock_script.installed_versions(cpu.pins)):
        pytest.skip("this environment is not the lock's (SPECBENCH_DEPS=latest, or another torch)")
    roots = [("specbench", {"test"}, True), ("torch", set(), True)] + [(n, set(), False) for n in lock_script.NO_DEPS]
    walked = lock_script.closure(roots, stop=frozenset({"torch"}))
    first_part = {name for name in cpu.pins if name not in cpu.torch_only}
    assert set(walked) - {"specbench", "torch"} == first_part


def test_a_written_lock_names_the_python_and_platform_setup_compares_with():
    """setup.sh's SPECBENCH_DEPS=auto takes the lock only where its "# For:" line is this machine's, in setup.sh's
    own words (test_setup.py checks that side)."""
    import platform

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import lock as lock_script
    finally:
        sys.path.remove(str(REPO / "scripts"))
    text = lock_script.lock_text("cpu", {"numpy": "2.4.6"}, {"sympy": "1.14.0", "torch": "2.13.0+cpu"})
    here = f"Python {sys.version_info[0]}.{sys.version_info[1]}, {platform.system()} {platform.machine()}"
    assert f"\n# For: {here}\n" in text
    lock = parse_lock(text, "cpu")
    assert lock.pins == {"numpy": "2.4.6", "sympy": "1.14.0", "torch": "2.13.0"} and lock.torch_only == {"sympy", "torch"}
    setup = (REPO / "setup.sh").read_text()
    assert """print("Python %d.%d, %s %s" % (*sys.version_info[:2], platform.system(), platform.machine()))""" in setup


def module_level_imports(path: Path) -> set[str]:
    """The top-level names a file imports when it is loaded (its body, and the try/if blocks there): an import inside
    a function is an optional dependency the function names when it is missing."""
    import ast

    names = set()
    pending = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, (ast.Try, ast.If)):
            pending.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            pending.extend(statement for handler in getattr(node, "handlers", []) for statement in handler.body)
    return names


def test_every_module_the_code_and_tests_import_comes_from_a_locked_distribution():
    """A package only this machine's system site-packages provides (the venv sees them, for a cluster's torch) passes
    here and fails on a fresh machine: CI's newest-releases environment found scipy imported by a test and installed
    by nothing specbench declares. Each module imported when a file loads must come from a distribution the lock
    pins (what setup.sh installs), or be the standard library or this checkout's own."""
    import importlib.metadata

    from specbench.run.locked_versions import normalized

    locked = set(read_lock("cpu").pins)
    providers = importlib.metadata.packages_distributions()
    roots = ["specbench", "tests", "scripts", "analysis"]
    local = {path.stem for root in roots for path in (REPO / root).glob("*.py")} | {
        path.name for path in REPO.iterdir() if path.is_dir()}
    unlocked = {}
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            for name in module_level_imports(path):
                # pip: every venv's own installer (pyproject_requirements.py reads TOML with its tomli on Python 3.10)
                if name in sys.stdlib_module_names or name in local or name in ("__future__", "pip"):
                    continue
                if not any(normalized(dist) in locked for dist in providers.get(name, [])):
                    unlocked.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert unlocked == {}, f"imported, but from no locked distribution: {unlocked}"


def test_the_import_check_sees_an_unlocked_module(tmp_path):
    source = tmp_path / "uses_scipy.py"
    source.write_text("import os\ntry:\n    from scipy.stats import chi2\nexcept ImportError:\n    pass\n"
                      "def later():\n    import datasets\n")
    assert module_level_imports(source) == {"os", "scipy"}
