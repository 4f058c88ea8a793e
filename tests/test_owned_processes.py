"""A run owns its engine's processes (``specbench.run.owned_processes``), checked with plain Python processes standing
in for vLLM's (the default environment has no vLLM; tests/test_vllm_env.py kills real vLLM runs): what /proc says of
a process, finding a run's processes by its token at any depth, ending them (SIGTERM, then SIGKILL), the watchdog
ending them when the run's process is killed (SIGKILL, SIGTERM) or interrupted, and a resumed run ending what a
killed session left and naming it."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbench.run.owned_processes import (PROCESSES_FILE, TOKEN_VARIABLE, end_leftovers, end_processes, is_alive,
                                           process_info, processes_with_token)

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")

SLEEPER = "import time\ntime.sleep(120)\n"
# Ignores SIGTERM, as a process stuck in a system call or with a handler that does not exit would.
STUBBORN = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(120)\n")
# A stand-in for a run: owns its processes, starts a child that starts a grandchild (vLLM's engine core and its
# worker), prints their pids and the record, then waits to be killed, interrupted or told to finish (stdin).
RUN = """
import json, subprocess, sys
from specbench.run.owned_processes import OwnedProcesses
with OwnedProcesses(sys.argv[1]) as owned:
    child = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time\\n'
                              'grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])\\n'
                              'print(grandchild.pid, flush=True)\\ntime.sleep(120)\\n'],
                             stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    print(json.dumps({"child": child.pid, "grandchild": grandchild, "watchdog": owned.watchdog.pid}), flush=True)
    sys.stdin.readline()
print('finished', flush=True)
"""


def start(code: str, **environment) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **environment})


def gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(process_info(pid) is None for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def started():
    """Processes a test starts; any still running at its end is killed (by pid)."""
    processes = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def start_run(started, run_dir) -> tuple[subprocess.Popen, dict]:
    """RUN in ``run_dir``, once it has started its processes: it and their pids (child, grandchild, watchdog)."""
    run = subprocess.Popen([sys.executable, "-c", RUN, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started.append(run)
    pids = json.loads(run.stdout.readline())
    return run, pids


def test_process_info_is_pid_start_time_and_command_line_and_none_once_it_has_exited(started):
    sleeper = start(SLEEPER)
    started.append(sleeper)
    info = process_info(sleeper.pid)
    assert info.pid == sleeper.pid and info.start > 0 and info.command.endswith("time.sleep(120)")
    assert process_info(sleeper.pid) == info  # the same process: the same start time
    assert is_alive({"pid": sleeper.pid, "start": info.start}) and not is_alive({"pid": sleeper.pid, "start": 1})
    assert not is_alive(None) and not is_alive({"pid": "1"})
    sleeper.kill()
    sleeper.wait()
    assert process_info(sleeper.pid) is None and not is_alive({"pid": sleeper.pid, "start": info.start})


def test_a_runs_processes_are_those_holding_its_token_at_any_depth(started):
    parent = start("import subprocess, sys, time\n"
                   "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                   "print(child.pid, flush=True)\ntime.sleep(120)\n", **{TOKEN_VARIABLE: "t0ken"})
    other = start(SLEEPER, **{TOKEN_VARIABLE: "another"})
    started += [parent, other]
    grandchild = int(parent.stdout.readline())
    # Popen returns once the child is forked, maybe before it has exec'd its command: wait until it runs the sleeper
    deadline = time.monotonic() + 10
    while "time.sleep(120)" not in getattr(process_info(grandchild), "command", "") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [info.pid for info in processes_with_token("t0ken")] == sorted([parent.pid, grandchild])
    assert [info.pid for info in processes_with_token("t0ken", exclude={parent.pid})] == [grandchild]
    assert [info.pid for info in processes_with_token("another")] == [other.pid]
    assert processes_with_token("t0ke") == [] and processes_with_token("t0ken", proc=Path("/no/proc")) == []
    os.kill(grandchild, signal.SIGKILL)


def test_ending_processes_is_sigterm_then_sigkill_for_those_that_stay(started):
    polite, stubborn = start(SLEEPER), start(STUBBORN)
    started += [polite, stubborn]
    assert stubborn.stdout.readline() == "ready\n"
    infos = [process_info(polite.pid), process_info(stubborn.pid)]
    killed = end_processes(infos, grace_s=0.3)
    assert killed == [infos[1]]  # the polite one ended at SIGTERM
    assert polite.wait(timeout=5) == -signal.SIGTERM and stubborn.wait(timeout=5) == -signal.SIGKILL
    assert end_processes(infos, grace_s=0.3) == []  # gone: nothing is sent to a pid that may be another's now


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_when_the_runs_process_is_killed_the_watchdog_ends_its_processes(started, tmp_path, kill):
    """SIGKILL (an out-of-memory kill) and SIGTERM end the run's process without running any of its code: the
    watchdog sees it gone and ends its child and grandchild within a second or two, then itself."""
    run, pids = start_run(started, tmp_path)
    record = json.loads((tmp_path / PROCESSES_FILE).read_text())
    assert record["main"]["pid"] == run.pid
    assert {info.pid for info in processes_with_token(record["token"])} == {pids["child"], pids["grandchild"]}
    os.kill(run.pid, kill)
    run.wait()
    assert gone_within([pids["child"], pids["grandchild"], pids["watchdog"]], 5.0)
    assert (tmp_path / PROCESSES_FILE).is_file()  # what the next session reads, should the watchdog have died too


def test_an_interrupted_or_finished_run_ends_what_it_started_before_it_returns(started, tmp_path):
    run, pids = start_run(started, tmp_path)
    os.kill(run.pid, signal.SIGINT)  # Ctrl-C: KeyboardInterrupt unwinds through the with block
    run.wait(timeout=10)
    assert gone_within([pids["child"], pids["grandchild"], pids["watchdog"]], 0.5)  # at once: not the watchdog's
    assert not (tmp_path / PROCESSES_FILE).exists()

    run, pids = start_run(started, tmp_path)
    run.stdin.write("\n")
    run.stdin.flush()
    assert run.stdout.readline() == "finished\n" and run.wait(timeout=10) == 0
    assert gone_within([pids["child"], pids["grandchild"], pids["watchdog"]], 0.5)
    assert not (tmp_path / PROCESSES_FILE).exists()


def test_the_watchdog_records_the_runs_descendants_for_a_later_session(started, tmp_path):
    """A process whose environment no longer shows the token (setproctitle without SPT_NOENV overwrites it) is
    still the run's: the watchdog keeps every descendant's pid and start time in the record."""
    from specbench.run.owned_processes import SCAN_S

    run, pids = start_run(started, tmp_path)
    deadline = time.monotonic() + SCAN_S + 3
    while time.monotonic() < deadline:
        record = json.loads((tmp_path / PROCESSES_FILE).read_text())
        if {entry["pid"] for entry in record["processes"]} == {pids["child"], pids["grandchild"]}:
            break
        time.sleep(0.1)
    assert {entry["pid"]: entry["start"] for entry in record["processes"]} == {
        pid: process_info(pid).start for pid in (pids["child"], pids["grandchild"])}
    assert os.environ.get("SPT_NOENV") is None  # the run's own setting, not the test's
    with open(f"/proc/{pids['child']}/environ", "rb") as environ:
        assert b"SPT_NOENV=1" in environ.read().split(b"\0")  # set for the run's processes: vLLM's names keep it
    run.stdin.write("\n")
    run.stdin.flush()
    assert run.wait(timeout=10) == 0


def test_a_resumed_run_ends_what_a_killed_session_left_and_names_it(started, tmp_path, caplog):
    """The earlier session's process and its watchdog both gone, its engine's processes still running: the next
    session ends them (verified by the session's token) and names them; a session still running is left alone."""
    dead = start("pass")
    dead.wait()
    left = start(SLEEPER, **{TOKEN_VARIABLE: "earlier"})
    untokened = start(SLEEPER)  # its environment overwritten: known by the record's pid and start time
    started += [left, untokened]
    recorded = process_info(untokened.pid)
    record = {"token": "earlier", "main": {"pid": dead.pid, "start": 1},
              "processes": [{"pid": recorded.pid, "start": recorded.start, "command": "x"},
                            {"pid": dead.pid, "start": 5, "command": "gone"}]}
    (tmp_path / PROCESSES_FILE).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        ended = end_leftovers(tmp_path)
    assert [info.pid for info in ended] == sorted([left.pid, untokened.pid])
    assert left.wait(timeout=5) == untokened.wait(timeout=5) == -signal.SIGTERM
    [warning] = [record.getMessage() for record in caplog.records]
    assert f"left 2 of its engine's processes running; ending them: pid {min(left.pid, untokened.pid)} (" in warning
    assert not (tmp_path / PROCESSES_FILE).exists()

    running = start(SLEEPER, **{TOKEN_VARIABLE: "live"})
    started.append(running)
    me = process_info(os.getpid())
    (tmp_path / PROCESSES_FILE).write_text(json.dumps({"token": "live", "main": {"pid": me.pid, "start": me.start}}))
    assert end_leftovers(tmp_path) == [] and running.poll() is None  # its session runs: the run lock refuses
    (tmp_path / PROCESSES_FILE).write_text("{damaged")
    assert end_leftovers(tmp_path) == [] and running.poll() is None
    (tmp_path / PROCESSES_FILE).write_text(json.dumps({"token": "nobody's", "main": "?", "processes": 5}))
    assert end_leftovers(tmp_path) == [] and running.poll() is None  # a damaged record ends nothing of another's


def test_leaving_ends_what_started_inside_and_leaves_what_the_process_had_started_before(started, tmp_path):
    """OwnedProcesses ends the processes started while it was entered (the engine's), not a child the run's process
    had before it (a host program's helper, another library's server)."""
    from specbench.run.owned_processes import OwnedProcesses

    before = start(SLEEPER)
    started.append(before)
    with OwnedProcesses(tmp_path):
        inside = subprocess.Popen([sys.executable, "-c", SLEEPER], env={**os.environ})  # the engine's: the token
        started.append(inside)
    assert inside.wait(timeout=5) == -signal.SIGTERM
    assert before.poll() is None and process_info(before.pid) is not None
