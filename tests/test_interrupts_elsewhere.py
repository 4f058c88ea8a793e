"""Ctrl-C at any moment of every command a user runs besides ``python -m specbench`` (tests/test_interrupts.py):
``python -m analysis`` and the scripts are exit status 130 and one line naming what was interrupted (and, for a
build that resumes, that re-running resumes), without a traceback: during their imports of pandas, matplotlib,
torch, transformers and Hydra, and while they work. It was a KeyboardInterrupt traceback and the interpreter's
death by SIGINT (status -2) at every moment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from test_analysis import synthetic_run
from test_interrupts import default_sigint, send_interrupts

ROOT = Path(__file__).resolve().parents[1]
# 0.2 s: the imports (pandas, matplotlib; torch, transformers, Hydra); 1 s: the scripts' imports, analysis
# reading the runs; 2.5 s: the work (reading the runs, answering prompts).
MID_WORK = 2.5
DELAYS = [0.2, 1.0, pytest.param(MID_WORK, marks=pytest.mark.slow)]  # mid-work: several seconds each
QUESTIONS = 30000  # a run analysis reads for several seconds, so that every delay lands before it ends


def interrupted(command: list[str], delay: float, env: dict | None = None,
                working=None) -> subprocess.CompletedProcess:
    """``command`` sent SIGINT ``delay`` seconds after its start, and not before ``working()`` is true, if given."""
    return send_interrupts(command, [delay], env, working)


def assert_one_line(result: subprocess.CompletedProcess, program: str) -> str:
    """Exit 130, no traceback, and one line about the interrupt, the last on stderr, naming ``program``."""
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    [line] = [line for line in lines if ": interrupted" in line]  # not the test's tmp_path, named after it
    assert line == lines[-1] and line.startswith(f"{program}: interrupted"), result.stderr
    return line


@pytest.fixture(scope="module")
def big_runs(tmp_path_factory) -> Path:
    """A folder with one run of QUESTIONS questions: a synthetic run's first question repeated under new ids."""
    root = tmp_path_factory.mktemp("runs")
    run = synthetic_run(root / "pld", "pld", accepted=2, verify_tokens=(3,), tasks=("qa",))
    for name in ("answers.jsonl", "baseline_answers.jsonl"):
        record = json.loads((run / name).read_text().splitlines()[0])
        lines = []
        for question in range(QUESTIONS):
            record.update(question_id=question, answer_id=uuid.uuid4().hex)
            lines.append(json.dumps(record) + "\n")
        (run / name).write_text("".join(lines))
    steps = pd.read_parquet(run / "steps.parquet")
    steps = steps.iloc[np.tile(np.arange(len(steps)), QUESTIONS)].reset_index(drop=True)
    steps["question_id"] = np.repeat(np.arange(QUESTIONS), len(steps) // QUESTIONS)
    steps.to_parquet(run / "steps.parquet")
    return root


def fresh_cache(tmp_path: Path) -> dict:
    """A cache of the test's own, so that no interrupted build resumes from another test's answers."""
    return {"SPECBENCH_CACHE": str(tmp_path / "cache")}


def answering(tmp_path: Path):
    """Whether the target is answering prompts (its answers' staging file, which a re-run resumes from, exists)."""
    return lambda: any((tmp_path / "cache" / "answers").glob("*.partial"))


@pytest.mark.parametrize("delay", DELAYS)
def test_analysis_tables_interrupted_at_any_moment_is_exit_130_and_one_line(big_runs, delay):
    result = interrupted([sys.executable, "-m", "analysis", "tables", str(big_runs)], delay)
    assert result.stdout == ""
    assert_one_line(result, "analysis")


@pytest.mark.parametrize("delay", DELAYS)
def test_build_model_db_interrupted_at_any_moment_is_exit_130_and_one_line_saying_it_resumes(tmp_path, delay):
    command = [sys.executable, "scripts/build_model_db.py", "--model", "tiny-random"]
    working = answering(tmp_path) if delay == MID_WORK else None
    line = assert_one_line(interrupted(command, delay, fresh_cache(tmp_path), working), "build_model_db")
    if working:
        assert line.startswith("build_model_db: interrupted; the target's answers generated so far are kept: "
                               "re-running the same command resumes"), line
        assert working(), "nothing is left to resume from"


@pytest.mark.parametrize("delay", DELAYS)
def test_prune_draft_interrupted_at_any_moment_is_exit_130_and_one_line(tmp_path, delay):
    command = [sys.executable, "scripts/prune_draft.py", "--model", "tiny-random", "--layers", "1",
               "--corpus", "target-answers", "--distill-tokens", "1000", "--out", str(tmp_path / "draft")]
    working = answering(tmp_path) if delay == MID_WORK else None
    line = assert_one_line(interrupted(command, delay, fresh_cache(tmp_path), working), "prune_draft")
    assert not (tmp_path / "draft").exists()
    if working:
        assert line.startswith("prune_draft: interrupted; no draft was saved: re-running the same command builds "
                               "it again, resuming"), line


def test_gpu_check_interrupted_at_work_removes_its_throwaway_cache_and_is_one_line(tmp_path):
    """From the task's start an interrupt unwinds, so the check's ``finally`` removes the cache it made."""
    (tmp_path / "tmp").mkdir()
    made = lambda: list((tmp_path / "tmp").glob("specbench-gpu-check-*"))  # noqa: E731
    command = [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--quick"]
    result = interrupted(command, 0.2, {"TMPDIR": str(tmp_path / "tmp")}, working=made)
    assert assert_one_line(result, "gpu_check").startswith("gpu_check: interrupted; no table was printed")
    assert made() == []


FINALIZER = """
import os, signal, sys, time
from specbench.interrupts import Interrupts

interrupts = Interrupts("finalizer: interrupted before it started", "finalizer: interrupted")
interrupts.arm()


class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the interpreter's next check: in this loop
        for _ in range(100000):
            pass


def main():
    Finalized()
    time.sleep(5)
    print("went on after the interrupt")


interrupts.run(main)
"""


def test_an_interrupt_that_lands_in_a_finalizer_still_ends_the_command():
    """A KeyboardInterrupt raised inside a ``__del__`` (a garbage collection runs them anywhere) is one Python
    ignores ("Exception ignored in"); the interrupt is raised again once the finalizer is done."""
    result = subprocess.run([sys.executable, "-c", FINALIZER], cwd=ROOT, capture_output=True, text=True, timeout=30,
                            preexec_fn=default_sigint)
    assert result.stdout == ""
    assert result.stderr.strip() == "finalizer: interrupted" and result.returncode == 130, result.stderr


IMPORTED = """
import sys, time
from specbench.interrupts import Interrupts

interrupts = Interrupts("import: interrupted before it started", "import: interrupted")
interrupts.arm()


def main():
    import interrupted_module
    print("imported whole" if interrupted_module.COMPLETE else "imported in part", flush=True)
    time.sleep(5)
    print("went on after the interrupt")


interrupts.run(main)
"""


@pytest.mark.parametrize("body, stdout", [
    # signal.raise_signal runs the handler from C, inside the module's code, as torch's _c10d_init ran it once (a
    # KeyboardInterrupt there aborted the process: status -6); the interrupt waits for the import to be done.
    ("signal.raise_signal(signal.SIGINT)\n", "imported whole\n"),
    # Delivered again every REDELIVERY_S while the import goes on: each time it waits again.
    ("signal.raise_signal(signal.SIGINT)\ntime.sleep(0.4)\n", "imported whole\n"),
    # The user's second Ctrl-C while the first waits ends the process at once.
    ("signal.raise_signal(signal.SIGINT)\nsignal.raise_signal(signal.SIGINT)\n", ""),
], ids=["once", "while-it-goes-on", "a-second-one"])
def test_an_interrupt_that_lands_inside_an_import_ends_the_command_once_the_import_is_done(tmp_path, body, stdout):
    (tmp_path / "interrupted_module.py").write_text(f"import signal, time\n{body}COMPLETE = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), str(ROOT)]))}
    result = subprocess.run([sys.executable, "-c", IMPORTED], cwd=ROOT, capture_output=True, text=True, timeout=30,
                            env=env, preexec_fn=default_sigint)
    assert (result.returncode, result.stdout, result.stderr.strip()) == (130, stdout, "import: interrupted"), \
        result.stderr
