"""What each process of a torchrun job leaves for torchrun's failure summary, and which process says a user error.

torchrun gives every process an error file (``TORCHELASTIC_ERROR_FILE``, ``<attempt>/<local rank>/error.json``) and,
once a process fails, prints a summary naming each failed process with the file's call stack where it holds one
(``message.extraInfo.py_callstack``), else its message (torch's ``ChildFailedError._format_failure``, which
``ProcessFailure`` fills from the file). So a user error is recorded as its one line and no call stack, and the
summary says the sentence; a crash (a bug) keeps its traceback there.

A user error that every process meets alike (a run directory of another placement, a model the processes cannot
split, a setting refused before anything loads) is said once, by the node's first process (local rank 0; rank 0
on one machine). It prints its line and only then records it, marked as said. Each other process waits a few
seconds for that record: if it comes, it stays quiet (the first process speaks for the job), records its own line
and waits until the first process is gone before it ends, since torchrun stops every process once one has ended
with a failure and could otherwise stop the first one before it spoke. A process whose failure the first process
does not say (its own, e.g. a question that does not fit on it alone) prints its line itself.

Standard library only: the entry point reports Hydra's config errors before torch is imported.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from specbench.errors import SpecbenchError

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
# How long another process waits for the first one's record of the same failure: the processes meet an error
# they share within a second of each other, more on a busy machine; a process failing alone is said this late.
SPEAKER_WAIT_S = 5.0
# How long a quiet process waits for the first one to be gone (torchrun waits 30 s before it kills a process).
GONE_WAIT_S = 20.0
POLL_S = 0.05


def record_failure(error: BaseException) -> None:
    """``error`` in this process's error file, in torchrun's format (nothing outside torchrun): a user error
    (SpecbenchError) as its one line, an interrupt as "interrupted", anything else (a bug) as its first line with
    its full traceback, which torchrun's summary then shows."""
    if isinstance(error, SpecbenchError):
        _write_record(_first_line(error))
    elif isinstance(error, KeyboardInterrupt):
        _write_record("interrupted")
    else:
        _write_record(f"{type(error).__name__}: {_first_line(error)}",
                      {"py_callstack": "".join(traceback.format_exception(error))})


def say_user_error(line: str, program: str = "specbench") -> None:
    """Print ``program: error: <line>`` on stderr, unless this is another process of a torchrun job whose first
    process said a failure of its own (see the module's docstring); and record ``line`` for torchrun's summary.
    The caller exits with USER_ERROR after."""
    local_rank = _local_rank()
    if local_rank is None or local_rank == 0:
        _print(program, line)
        _write_record(line, {"said_by_pid": os.getpid()})
        return
    # torchrun stops the other processes once one has ended with a failure: this one says or records its line first.
    ignored = _ignore_sigterm()
    try:
        speaker = _wait_for_said(0, SPEAKER_WAIT_S)
        if speaker is None:
            _print(program, line)
        _write_record(line)
        if speaker is not None:
            _wait_until_gone(speaker, GONE_WAIT_S)
    finally:
        if ignored is not None:
            signal.signal(signal.SIGTERM, ignored)


def recorded_failures() -> list[tuple[int, str]]:
    """(rank, first line) of every process of this node's attempt that recorded a failure (none outside torchrun)."""
    found = []
    for local_rank, record in _records():
        message = record.get("message")
        text = str(message.get("message", "") if isinstance(message, dict) else message or "").strip()
        info = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        rank = info.get("rank", local_rank) if isinstance(info, dict) else local_rank
        found.append((rank if isinstance(rank, int) else local_rank, text.splitlines()[0] if text else "an error"))
    return found


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def _print(program: str, line: str) -> None:
    print(f"{program}: error: {line}", file=sys.stderr, flush=True)


def _local_rank() -> int | None:
    """This process's local rank in a torchrun job of two or more processes, else None."""
    if not os.environ.get(ERROR_FILE) or int(os.environ.get("WORLD_SIZE", "1") or 1) < 2:
        return None
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) or 0)


def _write_record(message: str, extra: dict | None = None) -> None:
    """The error file torchrun gave this process, holding ``message`` and ``extra`` beside the timestamp (torchrun
    reads whole seconds) and this process's rank; nothing outside torchrun. ``py_callstack`` in ``extra`` is what
    torchrun's summary shows in place of the message."""
    file = os.environ.get(ERROR_FILE)
    if not file:
        return
    info = {**(extra or {}), "timestamp": str(int(time.time()))}
    if os.environ.get("RANK", "").isdigit():
        info["rank"] = int(os.environ["RANK"])  # the folder is named by the local rank, the summary by this one
    try:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        partial = Path(f"{file}.partial")
        partial.write_text(json.dumps({"message": {"message": message, "extraInfo": info}}))
        partial.replace(file)  # whole or absent: the other processes read it while it is written
    except OSError:
        pass  # the failure itself is what matters; torchrun's summary then says less


def _records() -> list[tuple[int, dict]]:
    """(local rank, record) of every error file of this node's attempt, in torchrun's layout."""
    file = os.environ.get(ERROR_FILE)
    folder = Path(file).parent.parent if file else None
    found = []
    if folder is None or not folder.is_dir():
        return found
    for path in sorted(folder.glob("*/error.json")):
        try:
            found.append((int(path.parent.name), json.loads(path.read_text())))
        except Exception:  # noqa: BLE001 - half-written or foreign: not a failure this process can name
            continue
    return found


def _said_by(local_rank: int) -> int | None:
    """The process id of ``local_rank`` if it recorded that it said its failure, else None."""
    for rank, record in _records():
        message = record.get("message") if isinstance(record, dict) else None
        info = message.get("extraInfo") if isinstance(message, dict) else None
        if rank == local_rank and isinstance(info, dict) and isinstance(info.get("said_by_pid"), int):
            return info["said_by_pid"]
    return None


def _wait_for_said(local_rank: int, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while True:
        pid = _said_by(local_rank)
        if pid is not None or time.monotonic() > deadline:
            return pid
        time.sleep(POLL_S)


def _wait_until_gone(pid: int, seconds: float) -> None:
    """Until process ``pid`` (on this machine: its record is in this node's folder) has ended and torchrun has
    seen it end, or ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except OSError:  # alive but not ours to signal: it is still there
            pass
        time.sleep(POLL_S)


def _ignore_sigterm():
    """SIGTERM ignored from here on; the previous handler returned (None where signals cannot be set)."""
    try:
        return signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread
        return None
