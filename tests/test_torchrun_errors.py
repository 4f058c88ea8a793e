"""What a process of a torchrun job leaves for torchrun's failure summary (specbench.torchrun_errors): a user error
as its one line, said once by the first process, a bug with its traceback. Read back with torch's own
``ProcessFailure`` and ``ChildFailedError``, so each test checks the summary torchrun prints. The jobs themselves
(torchrun processes, seconds each) are in tests/test_tensor_parallel.py under slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbench import torchrun_errors
from specbench.errors import SpecbenchError
from specbench.torchrun_errors import record_failure, say_user_error

REPO = Path(__file__).resolve().parents[1]
SENTENCE = "/runs/x holds results of a run with other settings (processes: 2 -> 4); choose another hydra.run.dir"


def as_torchrun_process(monkeypatch, attempt: Path, local_rank: int, world_size: int = 2) -> Path:
    """This process as torchrun starts its ``local_rank``: the environment it sets, the error file it names."""
    file = attempt / str(local_rank) / "error.json"
    for key, value in {"TORCHELASTIC_ERROR_FILE": file, "WORLD_SIZE": world_size, "RANK": local_rank,
                       "LOCAL_RANK": local_rank}.items():
        monkeypatch.setenv(key, str(value))
    return file


def summary(file: Path, rank: int = 0) -> str:
    """torchrun's summary of a job whose process ``rank`` failed and left ``file``."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=rank, pid=1, exitcode=2, error_file=str(file))
    return ChildFailedError("specbench", {rank: failure}).format_msg()


def raise_a_bug():
    return {}["missing key"]


def test_a_user_error_is_recorded_as_its_line_and_torchrun_shows_the_line(monkeypatch, tmp_path):
    file = as_torchrun_process(monkeypatch, tmp_path, 0)
    record_failure(SpecbenchError(SENTENCE))
    message = json.loads(file.read_text())["message"]
    assert message["message"] == SENTENCE and "py_callstack" not in message["extraInfo"]
    assert message["extraInfo"]["rank"] == 0
    shown = summary(file)
    assert f"traceback : {SENTENCE}\n" in shown and "Traceback" not in shown and 'File "' not in shown


def test_a_bug_keeps_its_traceback_in_the_record_torchrun_shows(monkeypatch, tmp_path):
    file = as_torchrun_process(monkeypatch, tmp_path, 1)
    try:
        raise_a_bug()
    except KeyError as error:
        record_failure(error)
    message = json.loads(file.read_text())["message"]
    assert message["message"] == "KeyError: 'missing key'"
    assert message["extraInfo"]["py_callstack"].startswith("Traceback (most recent call last):")
    shown = summary(file, 1)
    assert "in raise_a_bug" in shown and "KeyError: 'missing key'" in shown


def test_processes_record_a_user_error_as_its_line_and_a_bug_with_its_traceback(monkeypatch, tmp_path):
    """Processes.run, where a process of a job fails: the record it leaves for the other processes and torchrun."""
    from specbench.distributed import Processes

    file = as_torchrun_process(monkeypatch, tmp_path, 0)
    processes = Processes(rank=0, world_size=2)

    def refuse():
        raise SpecbenchError(SENTENCE)

    with pytest.raises(SpecbenchError):
        processes.run(refuse)
    message = json.loads(file.read_text())["message"]
    assert message["message"] == SENTENCE and sorted(message["extraInfo"]) == ["rank", "timestamp"]
    with pytest.raises(KeyError):
        processes.run(raise_a_bug)
    assert "in raise_a_bug" in json.loads(file.read_text())["message"]["extraInfo"]["py_callstack"]


def test_the_first_process_says_the_line_then_records_that_it_said_it(monkeypatch, tmp_path, capsys):
    file = as_torchrun_process(monkeypatch, tmp_path, 0)
    say_user_error(SENTENCE)
    assert capsys.readouterr().err == f"specbench: error: {SENTENCE}\n"
    info = json.loads(file.read_text())["message"]["extraInfo"]
    assert info["said_by_pid"] == os.getpid() and "py_callstack" not in info
    assert torchrun_errors.recorded_failures() == [(0, SENTENCE)]


def a_finished_process() -> int:
    """The id of a process that has ended and been waited for, as torchrun waits for the first process."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_another_process_stays_quiet_once_the_first_said_the_line(monkeypatch, tmp_path, capsys):
    first = as_torchrun_process(monkeypatch, tmp_path, 0)
    first.parent.mkdir(parents=True)
    first.write_text(json.dumps({"message": {"message": SENTENCE, "extraInfo": {
        "timestamp": "1", "said_by_pid": a_finished_process()}}}))
    file = as_torchrun_process(monkeypatch, tmp_path, 1)
    say_user_error(SENTENCE)
    assert capsys.readouterr().err == ""  # rank 0 speaks for the job
    message = json.loads(file.read_text())["message"]
    assert message["message"] == SENTENCE and "said_by_pid" not in message["extraInfo"]
    assert sorted(torchrun_errors.recorded_failures()) == [(0, SENTENCE), (1, SENTENCE)]


def test_another_process_says_a_line_the_first_did_not_say(monkeypatch, tmp_path, capsys):
    """Its own failure (rank 0 went on, or failed without saying a line: a bug's traceback speaks for itself)."""
    monkeypatch.setattr(torchrun_errors, "SPEAKER_WAIT_S", 0.2)
    first = as_torchrun_process(monkeypatch, tmp_path, 0)
    first.parent.mkdir(parents=True)
    first.write_text(json.dumps({"message": {"message": "KeyError: 'x'", "extraInfo": {"timestamp": "1",
                                                                                      "py_callstack": "..."}}}))
    file = as_torchrun_process(monkeypatch, tmp_path, 1)
    say_user_error("question 7 does not fit the context")
    assert capsys.readouterr().err == "specbench: error: question 7 does not fit the context\n"
    assert json.loads(file.read_text())["message"]["message"] == "question 7 does not fit the context"


def test_outside_torchrun_the_line_is_said_and_nothing_written(monkeypatch, tmp_path, capsys):
    for key in ("TORCHELASTIC_ERROR_FILE", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    say_user_error(SENTENCE)
    record_failure(SpecbenchError(SENTENCE))
    assert capsys.readouterr().err == f"specbench: error: {SENTENCE}\n" and not list(tmp_path.iterdir())


def test_the_entry_point_records_its_user_error_for_torchrun(tmp_path):
    """python -m specbench as torchrun's second process, refused by Hydra before anything loads: exit 2, rank 0
    left to speak (no first process here: this one says its line after the wait), and the line in its record."""
    file = tmp_path / "attempt_0" / "1" / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(file), "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    first = tmp_path / "attempt_0" / "0" / "error.json"
    first.parent.mkdir(parents=True)
    line = "drafter=nope: no such config in conf/drafter/"
    first.write_text(json.dumps({"message": {"message": line, "extraInfo": {"timestamp": "1",
                                                                          "said_by_pid": a_finished_process()}}}))
    result = subprocess.run([sys.executable, "-m", "specbench", "drafter=nope", f"hydra.run.dir={tmp_path / 'run'}"],
                            capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert result.returncode == 2 and result.stderr == ""  # the first process said it
    message = json.loads(file.read_text())["message"]
    assert message["message"].startswith(line) and "py_callstack" not in message["extraInfo"]


def test_rank_zero_alone_prints_the_summary(monkeypatch, capsys):
    """Every process of a torchrun job returns a summary; the others' are of their scratch folders."""
    import specbench.__main__ as entry
    from specbench.results import console, readers

    monkeypatch.setattr(console, "format_summary_table", lambda summary: "TABLE")
    monkeypatch.setattr(console, "violation_report", lambda summary, answers: None)
    monkeypatch.setattr(readers, "read_answers", lambda output_dir: [])
    summary = {"model": "tiny-random", "drafter": "pld", "method": "pld"}
    for rank, printed in ((1, ""), (0, "\ntiny-random / pld  (runs/x)\nTABLE\n")):
        monkeypatch.setenv("RANK", str(rank))  # as torchrun sets it (no process group here)
        entry.print_summary(summary, "runs/x")
        assert capsys.readouterr().out == printed
