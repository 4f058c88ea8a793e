"""One run per run directory: a second process writing the same directory would interleave its answers with
the first's and leave the summary and steps of one of them only.

The lock is an ``fcntl.flock`` on ``.specbench.lock`` in the run directory, which the kernel releases when its
holder dies however it dies (SIGKILL, out of memory, a SLURM preemption), so a lock left by a killed run is
recognised as stale and taken over. The file names the holder (pid, host, start time) for the refusal message.
It is emptied, never removed, on release: removing it could let two later processes lock two different files.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)

LOCK_NAME = ".specbench.lock"


class RunLock:
    """``with RunLock(directory) as lock:``: hold the directory for this process, or raise a one-line
    SpecbenchError naming the holder. A run refused after locking (``keep`` not called) leaves the directory as
    it found it: a lock file this process created is removed again."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._handle = None
        self._created: list[Path] = []  # what this process created, removed again unless kept
        self._kept = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            if not self.directory.exists():
                self.directory.mkdir(parents=True)
                self._created.append(self.directory)
            if not self.path.exists():
                self._created.insert(0, self.path)
            self._handle = open(self.path, "a+", encoding="utf-8")
        except PermissionError as error:
            self._remove_created()
            raise SpecbenchError(f"cannot write to the run directory {self.directory} ({error.strerror}); choose a "
                                 "writable hydra.run.dir") from None
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            self._handle.close()
            self._handle = None
            raise SpecbenchError(f"{self.directory} is in use by another run ({_describe(holder)}); wait for it to "
                                 "finish, or choose another hydra.run.dir") from None
        earlier = self._holder()
        if earlier and earlier.get("pid") != os.getpid():
            log.warning("%s: taking over the lock of a run that is no longer running (%s)", self.directory,
                        _describe(earlier))
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                       "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}))
        self._handle.flush()

    def keep(self) -> None:
        """The run goes ahead: what was created for it stays."""
        self._kept = True

    def release(self) -> None:
        if self._handle is None:
            return
        if self._kept or not self._created:
            self._handle.seek(0)
            self._handle.truncate()
        else:
            self._remove_created()
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None

    def _remove_created(self) -> None:
        for path in self._created:
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                pass  # a directory something else wrote into stays

    def _holder(self) -> dict | None:
        try:
            self._handle.seek(0)
            text = self._handle.read().strip()
            return json.loads(text) if text else None
        except (OSError, ValueError):
            return None


def _describe(holder: dict | None) -> str:
    if not holder:
        return "holder unknown"
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
