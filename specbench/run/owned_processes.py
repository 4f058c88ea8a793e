"""A run owns the processes its engine starts (vLLM's engine cores and workers): they end when the run ends, however
it ends, and a resumed run does not start beside what an earlier session of it left running.

How the run's processes are told from every other process (Linux, from ``/proc``), two ways that each suffice:

- **Its token.** Before the engine starts, the run puts a token of its own (a random hex string) in its environment
  (``TOKEN_VARIABLE``), which every process started from it inherits, forked or spawned, at any depth (vLLM's
  engine core and the workers the core starts): ``processes_with_token`` reads it in ``/proc/<pid>/environ``. vLLM
  names its processes (``VLLM::EngineCore``) with setproctitle, which overwrites that area unless ``SPT_NOENV`` is
  set, so the run sets that too.
- **Its tree.** The watchdog (below) looks at the run's descendants every ``SCAN_S`` and keeps each one's pid and
  start time in the record (``PROCESSES_FILE``), since a process whose parent died is no longer anyone's descendant
  but the init process's.

How they end:

- **The run ends by itself** (finished, a refusal, an exception, Ctrl-C, which unwinds): the engine shuts its
  processes down (``Engine.close``), then ``OwnedProcesses`` ends whatever still holds the token (SIGTERM, then
  SIGKILL after ``GRACE_S``) before the run returns. Python's multiprocessing resource tracker is left alone: it
  ends by itself once the run's process exits, and cleans up the shared memory the others leave.
- **The run's process is killed** (SIGKILL, an out-of-memory kill, SIGTERM, which ends it without unwinding, a
  second Ctrl-C): a watchdog started before the engine, in a session of its own (so a Ctrl-C at the terminal does
  not reach it), sees its parent gone (``os.getppid`` changes the moment it dies) within ``POLL_S`` and ends every
  process that holds the token or that it saw descend from the run, then exits.
- **Both are killed** (the whole process group, a machine-wide kill): the record ``PROCESSES_FILE`` in the run
  directory names the session (its token, its process's pid and start time, the processes the watchdog saw). The
  next session of the run directory (``end_leftovers``, before it locks the directory) finds those that still run
  (by token, or by pid and start time) while the recorded process is gone, logs them by pid and command line, and
  ends them: they are verifiably this run's, and they hold the memory the new session needs. A recorded process
  still alive is a session still running, which the run lock refuses.

Standard library only: the watchdog runs this module (``python -m specbench.run.owned_processes``) and imports
nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TOKEN_VARIABLE = "SPECBENCH_RUN_PROCESSES"
PROCESSES_FILE = "engine_processes.json"
POLL_S = 0.2  # how often the watchdog looks for its parent: the run's processes outlive it by at most this
SCAN_S = 2.0  # how often it records the run's descendants: a /proc walk of a few milliseconds
GRACE_S = 3.0  # from SIGTERM to SIGKILL: room to exit on their own (vLLM's engine core frees its shared memory)
PROC = Path("/proc")
# Python's own helper (multiprocessing's resource tracker): it exits once the run's process does, and unlinks the
# shared memory that processes ended by a signal leave behind, so it is not ended here.
RESOURCE_TRACKER = "multiprocessing.resource_tracker"


@dataclass(frozen=True)
class ProcessInfo:
    """A process as ``/proc`` shows it: its pid, its start time (clock ticks after boot: a pid taken again by a
    later process has another) and its command line."""

    pid: int
    start: int
    command: str

    def describe(self) -> str:
        command = self.command if len(self.command) <= 60 else self.command[:57] + "..."
        return f"pid {self.pid} ({command})"


def process_info(pid: int, proc: Path = PROC) -> ProcessInfo | None:
    """``pid``'s ProcessInfo; None when there is no such process (or it has exited and awaits its parent)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        command = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold spaces or parentheses itself: the fields after the last ")"
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):  # state: exited, only its exit status is left
        return None
    return ProcessInfo(pid, int(fields[19]), command.replace(b"\0", b" ").decode(errors="replace").strip())


def is_alive(recorded: dict | None, proc: Path = PROC) -> bool:
    """Whether the process a record names ({pid, start}) is still the one running under that pid."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("pid"), int):
        return False
    found = process_info(recorded["pid"], proc)
    return found is not None and found.start == recorded.get("start")


def descendants(pid: int, proc: Path = PROC) -> list[ProcessInfo]:
    """Every live process below ``pid`` (its children, theirs, ...), but the resource tracker, by pid."""
    children: dict[int, list[int]] = {}
    try:
        entries = [entry.name for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return []
    for name in entries:
        try:
            stat = (proc / name / "stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(name))
    found, below = [], list(children.get(pid, []))
    while below:
        child = below.pop()
        below += children.get(child, [])
        info = process_info(child, proc)
        if info is not None and RESOURCE_TRACKER not in info.command:
            found.append(info)
    return sorted(found, key=lambda info: info.pid)


def recorded_processes(record: dict, proc: Path = PROC) -> list[ProcessInfo]:
    """The processes a record names (``processes``: {pid, start, command}) that still run under the same pid and
    start time."""
    found = []
    entries = record.get("processes")
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and is_alive(entry, proc):
            found.append(process_info(entry["pid"], proc))
    return [info for info in found if info is not None]


def _union(*groups: list[ProcessInfo]) -> list[ProcessInfo]:
    merged = {(info.pid, info.start): info for group in groups for info in group}
    return sorted(merged.values(), key=lambda info: info.pid)


def processes_with_token(token: str, proc: Path = PROC, exclude: set[int] = frozenset()) -> list[ProcessInfo]:
    """Every live process whose environment holds ``TOKEN_VARIABLE=token`` (those of other users are unreadable
    and never match), but the pids in ``exclude`` and the resource tracker, by pid."""
    wanted = f"{TOKEN_VARIABLE}={token}".encode()
    found = []
    try:
        entries = [entry.name for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:  # no /proc (not Linux): nothing can be found
        return []
    for name in entries:
        pid = int(name)
        if pid in exclude:
            continue
        try:
            environment = (proc / name / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environment:
            info = process_info(pid, proc)
            if info is not None and RESOURCE_TRACKER not in info.command:
                found.append(info)
    return sorted(found, key=lambda info: info.pid)


def end_processes(processes: list[ProcessInfo], grace_s: float = GRACE_S, proc: Path = PROC) -> list[ProcessInfo]:
    """SIGTERM to each of ``processes`` still the process recorded, SIGKILL to those left after ``grace_s``; waits
    until they are gone (a few seconds at most) and returns those that still were there for the SIGKILL."""

    def living(candidates):  # by pid and start time: a command line changes with a process title (vLLM's)
        return [info for info in candidates if is_alive({"pid": info.pid, "start": info.start}, proc)]

    def send(candidates, kind):
        for info in candidates:
            try:
                os.kill(info.pid, kind)
            except (ProcessLookupError, PermissionError):
                pass

    send(living(processes), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while living(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    stubborn = living(processes)
    send(stubborn, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while living(stubborn) and time.monotonic() < deadline:
        time.sleep(0.05)
    return stubborn


def read_record(run_dir: str | Path) -> dict | None:
    """The run directory's PROCESSES_FILE, None when it has none or it cannot be read as one."""
    try:
        record = json.loads((Path(run_dir) / PROCESSES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("token"), str) else None


def end_leftovers(run_dir: str | Path, proc: Path = PROC) -> list[ProcessInfo]:
    """Before a session locks ``run_dir``: end the processes an earlier session of it left running, when that
    session's own process is gone (see the module docstring), naming them in a warning; returns them."""
    record = read_record(run_dir)
    if record is None or is_alive(record.get("main"), proc):
        return []  # nothing recorded, or a session still running (the run lock refuses a second one)
    left = [info for info in _union(processes_with_token(record["token"], proc), recorded_processes(record, proc))
            if info.pid != os.getpid()]
    if left:
        main = record.get("main") if isinstance(record.get("main"), dict) else {}
        log.warning("%s: an earlier session of this run (pid %s) left %d of its engine's processes running; "
                    "ending them: %s", run_dir, main.get("pid"), len(left),
                    ", ".join(info.describe() for info in left))
        end_processes(left, proc=proc)
    try:
        (Path(run_dir) / PROCESSES_FILE).unlink()
    except OSError:
        pass
    return left


class OwnedProcesses:
    """``with OwnedProcesses(run_dir):`` around the life of an engine that starts processes: the token in this
    process's environment, the watchdog, the record in ``run_dir``; on leaving, every process started meanwhile
    that still runs is ended (see the module docstring)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / PROCESSES_FILE
        self.token = uuid.uuid4().hex
        self.watchdog: subprocess.Popen | None = None
        self._previous: dict[str, str | None] = {}
        self._before: set[tuple[int, int]] = set()  # (pid, start) of the children the process had on entering

    def __enter__(self) -> OwnedProcesses:
        me = process_info(os.getpid())
        # not the engine's: a host program's own children (started before the engine) are not ended on leaving
        self._before = {(info.pid, info.start) for info in descendants(os.getpid())}
        environment = {key: value for key, value in os.environ.items() if key != TOKEN_VARIABLE}
        root = str(Path(__file__).resolve().parents[2])  # the checkout or site-packages that holds specbench
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [root, environment.get("PYTHONPATH")]))
        record = {"token": self.token, "main": None if me is None else {"pid": me.pid, "start": me.start},
                  "processes": []}
        write_record(self.path, record)
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", "specbench.run.owned_processes", self.token, str(os.getpid()), str(self.path)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=environment, start_new_session=True)
        self._previous = {key: os.environ.get(key) for key in (TOKEN_VARIABLE, "SPT_NOENV")}
        os.environ[TOKEN_VARIABLE] = self.token
        os.environ["SPT_NOENV"] = "1"  # setproctitle (vLLM's process names) would overwrite the token in environ
        return self

    def __exit__(self, *exc) -> None:
        for key, value in self._previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            self._stop_watchdog()  # first: it rewrites the record while it runs
            left = [info for info in _union(processes_with_token(self.token, exclude={os.getpid()}),
                                            descendants(os.getpid())) if (info.pid, info.start) not in self._before]
            if left:
                log.info("ending %d process(es) the engine left running: %s", len(left),
                         ", ".join(info.describe() for info in left))
                end_processes(left)
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    def _stop_watchdog(self) -> None:
        try:
            self.watchdog.stdin.write(b"stop\n")
            self.watchdog.stdin.close()
            self.watchdog.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.watchdog.kill()
            self.watchdog.wait()


def write_record(path: Path, record: dict) -> None:
    """``record`` into ``path`` whole: through a file of its own beside it and a rename."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(staging, path)


def watch(token: str, parent: int, record_path: Path, poll_s: float = POLL_S, scan_s: float = SCAN_S) -> int:
    """The watchdog: until its parent says "stop" on its stdin, look every ``poll_s`` for the parent and every
    ``scan_s`` at its descendants (kept in the record at ``record_path``); once the parent is gone (killed: no
    "stop", its end of the pipe closed, another parent), end every process that holds ``token`` or was seen below
    the parent."""
    for kind in (signal.SIGINT, signal.SIGHUP):
        signal.signal(kind, signal.SIG_IGN)
    seen: dict[tuple[int, int], ProcessInfo] = {}
    scanned = -scan_s
    while os.getppid() == parent:
        if time.monotonic() - scanned >= scan_s:
            scanned = time.monotonic()
            now = {(info.pid, info.start): info for info in descendants(parent) if info.pid != os.getpid()}
            if set(now) != set(seen):
                seen = now
                record = read_record(record_path.parent) or {"token": token}
                record["processes"] = [asdict(info) for info in seen.values()]
                try:
                    write_record(record_path, record)
                except OSError:  # a full or vanished directory: the token still finds them
                    pass
        ready, _, _ = select.select([sys.stdin], [], [], poll_s)
        if ready:
            said = sys.stdin.readline()
            if said.strip() == "stop":
                return 0
            if not said:  # the pipe closed without a word: the parent is dying or gone
                break
    end_processes(_union(processes_with_token(token, exclude={os.getpid()}),
                         [info for info in seen.values() if info.pid != os.getpid()]))
    return 0


if __name__ == "__main__":
    sys.exit(watch(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
