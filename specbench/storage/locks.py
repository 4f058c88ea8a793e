"""Locks held by creating a file with ``O_CREAT | O_EXCL``, which works across processes and hosts on NFS (v3 and
later) and Lustre, where ``flock`` may not. A lock file names its holder (pid, host, start time); a lock whose holder
is gone is taken over: on the same host when its pid is dead, on any host when it was not refreshed (its holder
touches it while it holds it) for ``SPECBENCH_LOCK_STALE_S`` seconds (default 600). A second builder waits up to
``SPECBENCH_LOCK_WAIT_S`` seconds (default 7200) and then loads what the first built."""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.storage.cache import versions_dir
from specbench.storage.refusal import raise_refusal

log = logging.getLogger(__name__)

# A lock file is written right after it is created; one still empty after this long lost its holder in between.
EMPTY_LOCK_GRACE_S = 10.0
LOCK_WAIT_S = 7200.0  # default of SPECBENCH_LOCK_WAIT_S: the longest build (a large datastore) a second job waits on
LOCK_STALE_S = 600.0  # default of SPECBENCH_LOCK_STALE_S; a holder refreshes its lock every quarter of it


def describe_holder(holder: dict | None) -> str:
    """A lock holder for a message: "pid 123 on node-7, started 2026-01-01T10:00:00+00:00"."""
    if not holder:
        return "holder unknown"
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


def holder_is_dead(holder: dict | None) -> bool:
    """Whether ``holder`` (a lock file's pid and host) is a process of this host that no longer runs. A holder on
    another host cannot be checked from here."""
    if not holder or holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    if holder["pid"] <= 0:
        return True
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        return False
    return False


class FileLock:
    """A lock held by creating ``path`` with ``O_CREAT | O_EXCL``; the file names its holder (pid, host, start
    time, a random token that tells this holder from a later one).

    ``acquire()`` waits up to ``wait_s`` for another holder and returns False if it still holds the lock
    (``holder`` says who). A lock is taken over, with a warning, when its holder is a dead pid of this host or,
    if ``stale_after_s`` is given, when its file was not refreshed for that long: the holder touches it every
    quarter of ``stale_after_s`` while it holds it, so only a holder that is gone (a job killed on another node)
    goes stale. Without ``stale_after_s`` a holder on another host is never taken over (a run may last days).
    Take-over is serialised by a second ``O_EXCL`` file, so two waiters never both remove the same lock."""

    def __init__(self, path: str | Path, wait_s: float = 0.0, stale_after_s: float | None = None):
        self.path = Path(path)
        self.wait_s = wait_s
        self.stale_after_s = stale_after_s
        self.holder: dict | None = None
        self._mine: str | None = None  # the text of the lock file this object wrote
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> FileLock:
        if not self.acquire():
            raise SpecbenchError(self.refusal())
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> bool:
        deadline = time.monotonic() + self.wait_s
        pause, waited = 0.05, False
        while True:
            if self._create():
                return True
            state = self._read()
            if state is None:  # released meanwhile
                continue
            self.holder = _parse_holder(state[0])
            reason = self._stale_reason(time.time() - state[2] / 1e9)
            if reason and self._take_over(state):
                log.warning("%s: taking over a lock whose holder %s (%s)", self.path, reason,
                            describe_holder(self.holder))
                continue
            if time.monotonic() >= deadline:
                return False
            if not waited:
                log.info("waiting for %s (%s) to be released", self.path, describe_holder(self.holder))
                waited = True
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 2.0)

    def release(self) -> None:
        if self._mine is None:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        try:
            state = self._read()
            if state is not None and state[0] == self._mine:  # not taken over meanwhile (a holder judged stale)
                self.path.unlink(missing_ok=True)
        except OSError as error:  # the lock is then taken over once it goes stale
            log.warning("%s: could not remove this process's lock (%s)", self.path, error)
        self._mine = None

    def refusal(self) -> str:
        """One line: who holds the lock, and how to remove it if that holder is gone."""
        return (f"{self.path} is held by {describe_holder(self.holder)}; if that process is no longer running, "
                f"remove {self.path}")

    def _create(self) -> bool:
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  "token": secrets.token_hex(8), "stale_after_s": self.stale_after_s}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:  # its folder was removed meanwhile (an empty versions folder, tidied)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                self._refuse_write(error)
            return False
        except OSError as error:
            self._refuse_write(error)
        text = json.dumps(holder)
        try:
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError as error:  # a full disk: the empty lock file would hold the lock for EMPTY_LOCK_GRACE_S
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass  # then a waiter takes it over once that grace has passed
            self._refuse_write(error)
        self._mine, self.holder = text, holder
        if self.stale_after_s is not None:
            self._stop.clear()
            self._heartbeat = threading.Thread(target=self._refresh, args=(self.stale_after_s / 4,), daemon=True)
            self._heartbeat.start()
        return True

    def _read(self) -> tuple[str, int, int] | None:
        """The lock file's text, inode and modification time (its last refresh, in ns); None when there is none."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                stat = os.fstat(handle.fileno())
                return handle.read(), stat.st_ino, stat.st_mtime_ns
        except FileNotFoundError:
            return None

    def _stale_reason(self, age: float) -> str | None:
        if self.holder is None:
            return f"never wrote its name ({age:.0f} s ago)" if age > EMPTY_LOCK_GRACE_S else None
        if holder_is_dead(self.holder):
            return "is no longer running"
        if self.stale_after_s is not None:
            # A holder told to refresh less often (another SPECBENCH_LOCK_STALE_S) is judged by its own setting.
            own = self.holder.get("stale_after_s")
            limit = max(self.stale_after_s, own if isinstance(own, (int, float)) else 0)
            if age > limit:
                return f"has not refreshed it for {age:.0f} s"
        return None

    def _take_over(self, stale: tuple[str, int, int]) -> bool:
        """Remove the lock file if it is still the ``stale`` one (same text, inode and refresh time); True if this
        process did. Only the holder of ``<lock>.takeover`` removes a lock, so a waiter never removes a lock that
        another waiter has just created, nor one whose holder has just refreshed it."""
        mutex = self.path.with_name(self.path.name + ".takeover")
        try:
            os.close(os.open(mutex, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileNotFoundError:  # the lock's folder was removed meanwhile: so was the lock
            return False
        except OSError as error:
            if isinstance(error, FileExistsError):
                return self._mutex_left_behind(mutex)
            self._refuse_write(error, mutex)
        try:
            if self._read() != stale:
                return False
            self.path.unlink(missing_ok=True)
            return True
        except OSError as error:
            self._refuse_write(error)
        finally:
            try:
                mutex.unlink(missing_ok=True)
            except OSError:
                pass  # a taker that died mid-way: removed by the next one after EMPTY_LOCK_GRACE_S

    @staticmethod
    def _mutex_left_behind(mutex: Path) -> bool:
        try:
            if time.time() - mutex.stat().st_mtime > EMPTY_LOCK_GRACE_S:  # its taker died mid-way
                mutex.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        return False

    def _refuse_write(self, error: OSError, path: Path | None = None):
        """Raise the one-line refusal for a lock the filesystem will not let this process write (read-only, full,
        not permitted), or ``error`` itself when it is something else."""
        raise_refusal(error, path or self.path, "lock")

    def _refresh(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                state = self._read()
                if state is not None and state[0] == self._mine:
                    os.utime(self.path)
            except OSError:
                pass  # the next refresh tries again; a lock not refreshed is at worst built twice


def _parse_holder(text: str) -> dict | None:
    try:
        holder = json.loads(text) if text.strip() else None
    except Exception:  # a garbled lock file (RecursionError included) names no holder
        return None
    return holder if isinstance(holder, dict) else None


def _seconds(variable: str, default: float) -> float:
    value = os.environ.get(variable)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise SpecbenchError(f"{variable}={value!r}: expected a number of seconds (0 or more)")
    return seconds


def artefact_lock(directory: str | Path, name: str = "build.lock") -> FileLock:
    """The lock of the artefact at ``directory`` (``build.lock``: building it; ``publish.lock``: swapping in a
    version), waiting ``SPECBENCH_LOCK_WAIT_S`` and stale after ``SPECBENCH_LOCK_STALE_S``."""
    if name == "build.lock":
        return build_lock(versions_dir(directory) / name)
    return FileLock(versions_dir(directory) / name, wait_s=_seconds("SPECBENCH_LOCK_WAIT_S", LOCK_WAIT_S),
                    stale_after_s=_seconds("SPECBENCH_LOCK_STALE_S", LOCK_STALE_S))


def rank_tag() -> str:
    """``.rank<r>`` in a process of a multi-process torchrun job, "" otherwise: what tells apart the files that
    the ranks of one job, building together, must not share (build locks, staging files)."""
    return f".rank{os.environ.get('RANK', '0')}" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""


def build_lock(path: str | Path) -> FileLock:
    """The lock of building something at ``path`` (waiting ``SPECBENCH_LOCK_WAIT_S``, stale after
    ``SPECBENCH_LOCK_STALE_S``).

    The processes of one torchrun job build a target-run artefact (a model database, target answers) together,
    each running its shard of every forward pass, so one waiting for another's build lock would wait for itself:
    each rank has a build lock of its own. Rank r of another job still waits for rank r of this one, and the ranks
    publish the same content, which is one version."""
    path = Path(path)
    path = path.with_name(f"{path.stem}{rank_tag()}{path.suffix}")
    return FileLock(path, wait_s=_seconds("SPECBENCH_LOCK_WAIT_S", LOCK_WAIT_S),
                    stale_after_s=_seconds("SPECBENCH_LOCK_STALE_S", LOCK_STALE_S))

