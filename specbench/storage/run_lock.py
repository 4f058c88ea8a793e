"""One run per run directory: a second process writing the same directory would interleave its answers with
the first's and leave the summary and steps of one of them only.

The lock is an ``fcntl.flock`` on ``.specbench.lock`` in the run directory, which the kernel releases when its
holder dies however it dies (SIGKILL, out of memory, a SLURM preemption), so a lock left by a killed run is
recognised as stale and taken over. The file names the holder (pid, host, start time) for the refusal message.
It is emptied, never removed, on release: removing it could let two later processes lock two different files.

Where ``flock`` is not supported (Lustre mounted without ``-o flock``, some NFS mounts: ENOSYS, EOPNOTSUPP or
ENOLCK), the lock is the file's creation instead (``storage.locks.FileLock``: ``O_CREAT | O_EXCL``, removed on
release). A lock left by a dead run of this host is taken over; one held on another host is refused, naming its
holder and the file to remove if that run is gone, since from here a run on another node cannot be told from a
killed one.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.storage.locks import FileLock, describe_holder, holder_is_dead
from specbench.storage.refusal import raise_refusal

log = logging.getLogger(__name__)

LOCK_NAME = ".specbench.lock"
# What flock raises on a filesystem that does not support it.
NO_FLOCK = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK}


class RunLock:
    """``with RunLock(directory) as lock:``: hold the directory for this process, or raise a one-line
    SpecbenchError naming the holder. A run refused after locking (``keep`` not called) leaves the directory as
    it found it: a lock file this process created is removed again."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._handle = None
        self._file_lock: FileLock | None = None  # where flock is not supported
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
        except OSError as error:
            self._refuse_write(error, None, "create")
        created_file = False
        try:
            created_file = not self.path.exists()
            if created_file:
                self._created.insert(0, self.path)
            self._handle = open(self.path, "a+", encoding="utf-8")
        except OSError as error:  # an existing run directory on a read-only or full filesystem
            self._refuse_write(error, self.path, "lock")
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # flock is released when its holder dies: this one runs
            self._refuse(self._holder(), by_creation=False)
        except OSError as error:
            if error.errno not in NO_FLOCK:
                raise
            self._handle.close()
            self._handle = None
            self._lock_by_creation(created_file)
            return
        earlier = self._holder()
        if earlier and "token" in earlier and not holder_is_dead(earlier):
            # Held by creation (storage.locks.FileLock) from a host whose mount has no flock: that run is not ours.
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._refuse(earlier, by_creation=True)
        if earlier and earlier.get("pid") != os.getpid():
            log.warning("%s: taking over the lock of a run that is no longer running (%s)", self.directory,
                        describe_holder(earlier))
        try:
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                           "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}))
            self._handle.flush()
        except OSError as error:  # a full disk: the lock is flock's, the holder's name only explains a refusal
            self._close_quietly()
            self._refuse_write(error, self.path, "lock")

    def _lock_by_creation(self, created_file: bool) -> None:
        """The lock where flock is not supported: creating the lock file (``FileLock``, no waiting, never taken
        over by age). The empty file this process just created to try flock is removed first."""
        if created_file:
            self.path.unlink(missing_ok=True)
            self._created.remove(self.path)  # from here on the file is the holder's, whichever process that is
        self._file_lock = FileLock(self.path)
        try:
            locked = self._file_lock.acquire()
        except SpecbenchError:  # the filesystem refused the lock file (FileLock names it)
            self._file_lock = None
            self._remove_created()
            raise
        except OSError as error:
            self._file_lock = None
            self._refuse_write(error, self.path, "lock")
        if not locked:
            holder, self._file_lock = self._file_lock.holder, None
            self._remove_created()
            self._refuse(holder, by_creation=True)

    def _refuse_write(self, error: OSError, path: Path | None, what: str) -> None:
        """Remove what this process created and raise the one-line refusal of a filesystem that will not take the
        write (``storage.refusal.storage_refusal``), or ``error`` itself when it is not one (a bug keeps its traceback)."""
        self._remove_created()
        raise_refusal(error, path, what)

    def _close_quietly(self) -> None:
        """Unlock and close the lock file; a write still buffered for a full disk fails here and is dropped."""
        try:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
        except OSError:
            pass  # closing releases the flock in any case
        try:
            self._handle.close()
        except OSError:
            pass
        self._handle = None

    def _refuse(self, holder: dict | None, by_creation: bool) -> None:
        """Close the lock file and raise the one-line refusal; for a lock held by creation on another host, name
        the file to remove if that run is gone (from here, a run there cannot be told from a killed one)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        message = (f"{self.directory} is in use by another run ({describe_holder(holder)}); wait for it to finish, "
                   "or choose another hydra.run.dir")
        if by_creation and holder and holder.get("host") != socket.gethostname():
            message += f"; if that run is no longer running, remove {self.path}"
        raise SpecbenchError(message) from None

    def keep(self) -> None:
        """The run goes ahead: what was created for it stays."""
        self._kept = True

    def release(self) -> None:
        if self._file_lock is not None:
            self._file_lock.release()  # removes the lock file
            self._file_lock = None
            if not self._kept:
                self._remove_created()
            return
        if self._handle is None:
            return
        if self._kept or not self._created:
            try:
                self._handle.seek(0)
                self._handle.truncate()
            except OSError as error:  # a later run reads a holder that is gone, and takes the lock over
                log.warning("%s: could not empty the run lock (%s)", self.path, error)
        else:
            self._remove_created()
        self._close_quietly()

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
            holder = json.loads(text) if text else None
        except Exception:  # a garbled holder record (RecursionError included) names no holder
            return None
        return holder if isinstance(holder, dict) else None
