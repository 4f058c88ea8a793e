"""Cached artefacts (converted models, datastores, automata, model databases, target answers): where they live and
what they are keyed by, the checksums that tell a whole one from a damaged one, the locks that let one process
build each of them while others wait, and the atomic publish that lets readers keep reading while it is replaced.

Layout of a published directory ``D`` (say ``<cache>/datastores/<key>``)::

    D -> .D.versions/<content key>     a symbolic link, swapped atomically (rename) by each publish
    .D.versions/<content key>/         one built version: its files and manifest.json, never written again
    .D.versions/.staging-<pid>-<random>-<host>/   a version being written
    .D.versions/build.lock             held by the one process building D (``load_or_rebuild``)
    .D.versions/publish.lock           held for the milliseconds of a publish

Readers open ``D/<file>`` as before. A reader that has opened (or memory-mapped) a version keeps a complete
directory when a rebuild publishes, since the new version is written beside it and only the link changes; the
version a publish replaces is kept until the next publish, and older ones are removed then (best effort).

Locks are files created with ``O_CREAT | O_EXCL``, which works across processes and hosts on NFS (v3 and later) and
Lustre, where ``flock`` may not. A lock file names its holder (pid, host, start time); a lock whose holder is gone
is taken over: on the same host when its pid is dead, on any host when it was not refreshed (its holder touches it
while it holds it) for ``SPECBENCH_LOCK_STALE_S`` seconds (default 600). A second builder waits up to
``SPECBENCH_LOCK_WAIT_S`` seconds (default 7200) and then loads what the first built.
"""

from __future__ import annotations

import datetime
import errno
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from specbench.errors import SpecbenchError, damage_reason, raise_refusal, refusing_writes, storage_refusal

log = logging.getLogger(__name__)

Loaded = TypeVar("Loaded")

CACHE_HINT = "set SPECBENCH_CACHE (or the drafter's cache_dir) to a writable directory"
MANIFEST = "manifest.json"
# A lock file is written right after it is created; one still empty after this long lost its holder in between.
EMPTY_LOCK_GRACE_S = 10.0
LOCK_WAIT_S = 7200.0  # default of SPECBENCH_LOCK_WAIT_S: the longest build (a large datastore) a second job waits on
LOCK_STALE_S = 600.0  # default of SPECBENCH_LOCK_STALE_S; a holder refreshes its lock every quarter of it


# ---- where artefacts live, and their keys --------------------------------------------------------------------


def cache_root(cache_dir: str | None) -> Path:
    """Where converted model copies and built databases live: ``cache_dir``, else $SPECBENCH_CACHE, else
    ~/.cache/specbench."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def settings_key(settings: dict) -> str:
    """A short hash of ``settings`` (JSON, keys sorted): the part of a cached artefact's name that keeps it from
    being reused for other settings."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]


def cached_path(cache_dir: str | None, kind: str, stem: str, settings: dict, suffix: str = "") -> Path:
    """Where the cache keeps an artefact of ``kind`` built with ``settings`` (``settings_key`` is in its name)."""
    return cache_root(cache_dir) / kind / f"{stem}-{settings_key(settings)}{suffix}"


def file_digest(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 of a file's content, read in chunks (about 1 s per GB): caches built from a file are keyed by
    what it holds, not by its path, so an edited file never reuses what was built from its old content."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def unique_suffix() -> str:
    """``<pid>-<random>-<host>``: a name no other process writes, on this host or on another one sharing the
    filesystem (pids repeat across the hosts of a cluster). The host comes last, since host names hold dashes."""
    return f"{os.getpid()}-{secrets.token_hex(4)}-{socket.gethostname()}"


def versions_dir(directory: str | Path) -> Path:
    """Where the versions (and the locks) of the published directory ``directory`` are kept: beside it."""
    directory = Path(directory)
    return directory.with_name(f".{directory.name}.versions")


# ---- writes the filesystem refuses ----------------------------------------------------------------------------

# safetensors reports a failed write as SafetensorError("Error while serializing: I/O error: No space left on
# device (os error 28)"), not as an OSError; the errno is only in the text.
_QUOTED_ERRNO = re.compile(r"\(os error (\d+)\)")
_QUOTED_PATH = re.compile(r'at path "([^"]*)"')
# numpy's np.save of an array (ndarray.tofile) reports a short write as OSError("360001 requested and 64480
# written") without an errno: measured on a full tmpfs, where it is the disk that is full.
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def os_error_of(error: BaseException) -> OSError | None:
    """The OSError behind ``error``: itself, one it was raised from, the one a SafetensorError quotes, or, for
    numpy's short write, ENOSPC."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is None and _SHORT_WRITE.fullmatch(str(error)):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if isinstance(error, OSError):
            return error
        if type(error).__name__ == "SafetensorError":
            quoted = _QUOTED_ERRNO.search(str(error))
            if quoted:
                code = int(quoted.group(1))
                path = _QUOTED_PATH.search(str(error))
                return OSError(code, os.strerror(code), path.group(1) if path else None)
        error = error.__cause__
    return None


def write_refusal(error: BaseException, path=None, what: str = "write") -> SpecbenchError | None:
    """``errors.storage_refusal`` for any error a refused write raises (an OSError, or safetensors' own error):
    the one-line SpecbenchError naming ``path`` (default: the path the error names), or None for a bug."""
    os_error = os_error_of(error)
    return storage_refusal(os_error, path, what) if os_error is not None else None


# ---- checksums -------------------------------------------------------------------------------------------------


def file_records(directory: Path) -> dict:
    """{file name: {bytes, mtime_ns, ctime_ns, sha256}} of the files in ``directory`` but manifest.json, for
    ``verify_files``: written when a database or a converted model copy is built. Returns once the filesystem's
    clock has passed the files' change times, so that any later write to one of them changes its ctime."""
    records = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            stat = path.stat()
            records[path.name] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
                                  "sha256": file_digest(path)}
    _wait_for_later_change_times(directory, max((record["ctime_ns"] for record in records.values()), default=0))
    return records


def _wait_for_later_change_times(directory: Path, latest_ns: int, limit_s: float = 2.0) -> None:
    """Wait until a file touched in ``directory`` gets a change time after ``latest_ns``. File times come from a
    clock that advances in ticks (a few ms on Linux, a second or two on some network filesystems), and a write in
    the tick of the build's own last write would keep the recorded ctime; ``limit_s`` bounds the wait where the
    clock does not advance at all."""
    probe = directory / f".clock-{unique_suffix()}"
    deadline = time.monotonic() + limit_s
    try:
        probe.touch()
        while probe.stat().st_ctime_ns <= latest_ns and time.monotonic() < deadline:
            time.sleep(0.001)
            os.utime(probe)
    finally:
        probe.unlink(missing_ok=True)


def verify_files(directory: Path, manifest: dict) -> str | None:
    """What is wrong with the files ``manifest["files"]`` records (``file_records`` at build time), or None.

    A file must have its recorded size; its content is hashed only when its modification or change time (ctime)
    differs from the recorded one. Hashing on every load was measured on 2 cores at 0.13-0.18 s for the 175 MB
    ShareGPT datastore, 0.15 s for SmolLM2's 270 MB bfloat16 weights (0.5 s with a cold page cache) and
    0.3-0.5 s for python-docs' 256 MB suffix automaton, which loads in a few ms because it is memory-mapped;
    UltraChat-size datastores are several GB. A stat costs 0.1 ms, and no write leaves both times as they were:
    ``os.utime`` can restore the modification time, but setting it sets the change time to now, which no
    user process can set back. A file found whole by its hash despite other times (a copied cache, one recorded
    before change times were) has its times written into manifest.json, so that it is hashed once.

    A published version is named by its manifest's content key (``content_key``), so a manifest edited in place
    (a changed count, checksum or source) is caught by comparing the two. A manifest without records (written
    before they existed) passes: the loaders' shape and dtype checks still apply."""
    records = manifest.get("files")
    if records is None:
        return None
    if not isinstance(records, dict):
        return "manifest.json: 'files' is not a table of files"
    version = Path(directory).resolve()
    if version.parent.name.endswith(".versions") and re.fullmatch(r"[0-9a-f]{16}", version.name):
        if content_key(manifest) != version.name:
            return f"manifest.json is not the one that was written (its content key is not {version.name})"
    verified = {}
    for name, record in records.items():
        if not isinstance(record, dict) or Path(name).name != name:
            return f"manifest.json: bad entry for {name!r}"
        path = directory / name
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != record.get("bytes"):
            return f"{name} holds {stat.st_size} bytes, manifest.json says {record.get('bytes')}"
        if stat.st_mtime_ns == record.get("mtime_ns") and stat.st_ctime_ns == record.get("ctime_ns"):
            continue
        if file_digest(path) != record.get("sha256"):
            return f"{name} is not the file that was written (its SHA-256 differs from manifest.json's)"
        # The times read before hashing: a write during the hash leaves a later ctime, hashed at the next load.
        verified[name] = {**record, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}
    if verified:
        _record_verified_times(Path(directory), manifest, verified)
    return None


def _record_verified_times(directory: Path, manifest: dict, verified: dict) -> None:
    """Write the times of files that their hash found whole into ``directory``'s manifest.json, renamed into
    place (a reader sees the old manifest or the new one; the content key leaves times out). Best effort: a
    read-only cache is hashed on every load instead."""
    partial = directory / f".{MANIFEST}.{unique_suffix()}"
    try:
        partial.write_text(json.dumps({**manifest, "files": {**manifest["files"], **verified}}, indent=2) + "\n")
        os.replace(partial, directory / MANIFEST)
    except OSError as error:
        log.debug("%s: could not record the verified file times (%s)", directory, error)
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass


def read_manifest(directory: Path, what: str, fix: str) -> dict:
    """The parsed ``manifest.json`` of a database directory, or a one-line SpecbenchError naming what is wrong
    and ``fix``."""
    manifest_file = directory / MANIFEST
    if not manifest_file.is_file():
        raise SpecbenchError(f"{directory}: no {what} here (manifest.json missing); {fix}")
    try:
        manifest = json.loads(manifest_file.read_text())
    except Exception as error:  # OSError, not UTF-8, not JSON, RecursionError (deep nesting): damaged all the same
        raise SpecbenchError(f"{directory}: damaged {what} (manifest.json: {damage_reason(error)}); {fix}") from None
    if not isinstance(manifest, dict):
        raise SpecbenchError(f"{directory}: damaged {what} (manifest.json is not a JSON object); {fix}")
    return manifest


def content_key(manifest: dict) -> str:
    """The name of a built version: a hash of its manifest with every file's size and SHA-256 (not their times),
    so two builds of the same content are one version."""
    files = {name: [record.get("bytes"), record.get("sha256")] for name, record in manifest.get("files", {}).items()}
    described = {**manifest, "files": files}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- locks -----------------------------------------------------------------------------------------------------


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


# ---- building and publishing -----------------------------------------------------------------------------------


def require_writable(directory: str | Path, hint: str = CACHE_HINT) -> None:
    """A one-line SpecbenchError unless an artefact can be built at ``directory``: its versions are written beside
    it, so its nearest existing ancestor must be writable (and a directory written there before versions
    existed, which is moved aside, and the versions directory, if they exist). Checked before the build, which
    may take minutes."""
    directory = Path(directory)
    existing = directory.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    paths = [existing]
    if directory.is_dir() and not directory.is_symlink():
        paths.append(directory)
    if versions_dir(directory).is_dir():
        paths.append(versions_dir(directory))
    for path in paths:
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise SpecbenchError(f"cannot build {directory}: {path} is not a writable directory; {hint}")


def replace_directory(directory: str | Path, write: Callable[[Path], None], manifest: dict) -> None:
    """Call ``write(staging)`` on an empty staging directory, add ``manifest.json`` (written last, since loaders
    take its presence for a whole database) with a record of every file written (``file_records``), and publish
    it as the new version of ``directory`` (see the module docstring): readers of the old version keep a
    complete directory. An existing ``directory`` is replaced only if it holds a database (a manifest.json or
    arrays: .npy, .npz, a model's .safetensors), so that a mistyped output path never loses other files; a
    symbolic link that is not a published one is followed."""
    directory = Path(directory)
    if directory.is_symlink() and _published_version(directory) is None:
        directory = directory.resolve()
    if directory.exists() and not _holds_database(directory):
        raise SpecbenchError(f"{directory} exists and holds no database (no manifest.json or arrays): not replacing "
                             "it; remove it or choose another directory")
    store = versions_dir(directory)
    staging = store / f".staging-{unique_suffix()}"
    with refusing_writes(store, "create"):
        staging.mkdir(parents=True)
    try:
        write(staging)
        manifest = {**manifest, "files": file_records(staging)}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        with artefact_lock(directory, "publish.lock"):
            _publish(staging, directory, store / content_key(manifest))
    except BaseException as error:  # a failed or interrupted build leaves nothing behind
        shutil.rmtree(staging, ignore_errors=True)
        try:
            store.rmdir()  # only if nothing else is in it
        except OSError:
            pass
        refusal = _refusal_inside(error, store, directory)
        if refusal is None:
            raise
        raise refusal from error


def _refusal_inside(error: BaseException, store: Path, directory: Path) -> SpecbenchError | None:
    """The one-line refusal naming ``directory`` for a write that failed in its staging or versions directory
    (``store``); None for anything else, such as a corpus file that a builder could not read."""
    os_error = os_error_of(error)
    if os_error is None:
        return None
    failed = os_error.filename
    if failed is not None and not (str(os.path.abspath(failed)) + os.sep).startswith(str(store.absolute()) + os.sep):
        return None
    return storage_refusal(os_error, directory, "write")


def _publish(staging: Path, directory: Path, version: Path) -> None:
    """Make ``version`` (renamed from ``staging``, unless a whole copy of the same content is there) what
    ``directory`` points to, then remove the versions that are neither it nor the one it replaces."""
    store = version.parent
    previous = _published_version(directory)
    if version.is_dir() and _whole(version):
        shutil.rmtree(staging)
    else:
        if version.exists():  # a damaged copy of this very content
            damaged = store / f".damaged-{unique_suffix()}"
            version.rename(damaged)
            shutil.rmtree(damaged, ignore_errors=True)
        staging.rename(version)
    # Relative to the link's folder, so the cache can be moved or mounted elsewhere; made in the store and renamed
    # over ``directory``, which is atomic.
    link = store / f".link-{unique_suffix()}"
    os.symlink(os.path.join(store.name, version.name), link)
    try:
        if directory.is_dir() and not directory.is_symlink():  # written before versions existed: moved aside
            previous = f"unversioned-{unique_suffix()}"
            directory.rename(store / previous)
        os.replace(link, directory)
    except BaseException:
        link.unlink(missing_ok=True)
        raise
    for entry in store.iterdir():
        if entry.name in (version.name, previous) or not entry.is_dir() or entry.is_symlink():
            continue
        if entry.name.startswith(".staging-"):  # another builder's, unless that builder died on this host
            pid, _, host = entry.name.removeprefix(".staging-").split("-", 2)
            if not (pid.isdigit() and holder_is_dead({"pid": int(pid), "host": host})):
                continue
        shutil.rmtree(entry, ignore_errors=True)


def _published_version(directory: Path) -> str | None:
    """The name of the version ``directory`` links to, if it is a published directory."""
    if not directory.is_symlink():
        return None
    target = Path(os.readlink(directory))
    return target.name if target.parent == Path(versions_dir(directory).name) else None


def _whole(version: Path) -> bool:
    try:
        manifest = read_manifest(version, "version", "")
    except SpecbenchError:
        return False
    return isinstance(manifest.get("files"), dict) and verify_files(version, manifest) is None


def _holds_database(directory: Path) -> bool:
    if not directory.is_dir():
        return False
    names = [path.name for path in directory.iterdir()]
    return not names or MANIFEST in names or any(name.endswith((".npy", ".npz", ".safetensors")) for name in names)


def load_or_rebuild(directory: Path, what: str, load: Callable[[], Loaded], build: Callable[[], None]) -> Loaded:
    """A cached (``auto``) artefact: ``load()`` it if it is there and passes its checks; otherwise ``build()`` it
    (first checking that the cache is writable) and load it. One process builds it: others wait for its build
    lock (``artefact_lock``) and then load what it built; one that waits past ``SPECBENCH_LOCK_WAIT_S`` stops
    with one line naming the builder. A cached artefact that fails its checks is damaged (the cache key covers
    everything it was built from), so it is rebuilt with one warning rather than stopping the run."""
    directory = Path(directory)
    if directory.exists():
        try:
            return load()
        except SpecbenchError:
            pass  # damaged, or another process published a new version while it was read: judged under the lock
    require_writable(directory)
    try:
        versions_dir(directory).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        refusal = storage_refusal(error, versions_dir(directory), "create")
        if refusal is None:
            raise SpecbenchError(f"cannot build {directory} ({error.strerror}); {CACHE_HINT}") from None
        raise refusal from error
    lock = artefact_lock(directory)
    if not lock.acquire():
        try:
            return load()
        except SpecbenchError:
            raise SpecbenchError(f"the {what} in {directory} is still being built after {lock.wait_s:g} s "
                                 f"(SPECBENCH_LOCK_WAIT_S): {lock.refusal()}") from None
    try:
        if directory.exists():
            try:
                return load()  # built by the process this one waited for
            except SpecbenchError as error:
                log.warning("the cached %s is damaged and is being rebuilt: %s", what, error)
                with refusing_writes(directory, "remove the damaged"):
                    if not directory.is_symlink() and directory.is_dir():  # the cache's own, written before versions
                        shutil.rmtree(directory)
                    elif directory.is_file():
                        directory.unlink()
        else:
            # The builder says what it builds, how long it takes and how to build it ahead (announce_build).
            log.debug("building the %s (once; cached in %s)", what, directory)
        build()
    finally:
        lock.release()
        if not directory.exists():  # a first build that failed leaves no trace (rmdir: only an empty folder)
            try:
                versions_dir(directory).rmdir()
            except OSError:
                pass
    return load()


# ---- saying what a first use builds, before it builds it --------------------------------------------------------

# A build expected to take longer than this is announced as a warning: long enough to surprise a user who asked for
# a run, not for a build. Shorter ones are announced at INFO.
LONG_BUILD_S = 60.0
PREPARE_COMMAND = "python -m specbench.prepare"


@dataclass(frozen=True)
class PlannedArtefact:
    """One artefact a run looks up in the cache: what it is, where it is cached, a rough build time on a 2-core
    CPU (None: not known before its source is downloaded) with what that estimate is scaled from, and the command
    that builds it ahead of time. ``shipped``: the package carries it, and its copy was checked whole, so it is
    installed, not built; ``shipped_damage``: why the package's copy cannot be installed, when it is damaged.

    A plan says what it has checked: a cached copy counts as cached only when its files are the ones its manifest
    records (``cached_damage``), and a shipped one only when its checksum holds (checked by whoever plans it)."""

    what: str
    directory: Path
    seconds: float | None
    basis: str
    command: str
    shipped: bool = False
    shipped_damage: str | None = None

    def cached(self) -> bool:
        """Whether something is cached there, whole or not (``ready``: whole)."""
        return Path(self.directory).exists()

    @functools.cached_property
    def cached_damage(self) -> str | None:
        """What is wrong with the cached copy (its manifest unreadable, a file of another size or checksum than
        the manifest records), or None when it is whole or there is none. Checked once per plan entry."""
        if not self.cached():
            return None
        manifest_file = Path(self.directory) / MANIFEST
        if not manifest_file.is_file():
            return f"no {MANIFEST}"
        try:
            manifest = json.loads(manifest_file.read_text())
        except Exception as error:  # whatever the reading raised: the manifest is damaged
            return f"{MANIFEST}: {damage_reason(error)}"
        if not isinstance(manifest, dict):
            return f"{MANIFEST} is not a JSON object"
        return verify_files(Path(self.directory), manifest)

    def ready(self) -> bool:
        """Cached and whole: nothing to do."""
        return self.cached() and self.cached_damage is None

    def needs_build(self) -> bool:
        """Whether a run would build it: not ready and not installable from the package."""
        return not self.ready() and not self.shipped

    def state(self) -> str:
        if self.ready():
            return "cached"
        if self.shipped:
            if self.cached():
                return (f"the cached copy is damaged ({self.cached_damage}): reinstalled from the copy shipped with "
                        "specbench, in a second")
            return "shipped with specbench (installed in a second)"
        why = []
        if self.cached():
            why.append(f"the cached copy is damaged ({self.cached_damage})")
        if self.shipped_damage:
            why.append(f"the copy shipped with specbench is damaged ({self.shipped_damage})")
        return (f"{'; '.join(why)}: " if why else "") + f"to build, {estimate_text(self)}"


def duration_text(seconds: float) -> str:
    """A rough duration for a person: 40 -> "about 40 s", 1057 -> "about 18 min", 9000 -> "about 2.5 h"."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"


def estimate_text(planned: PlannedArtefact) -> str:
    if planned.seconds is None:
        return f"time not known in advance ({planned.basis})"
    return f"{duration_text(planned.seconds)} on a 2-core CPU (an estimate: {planned.basis})"


def build_notice(planned: PlannedArtefact) -> str:
    """The one line said before ``planned`` is built on first use: what, how long, where it is cached, and the
    command that builds it ahead of time.

    Example: "building the greedy answers of smollm2-135m to 96 prompts (once): about 18 min on a 2-core CPU (an
    estimate: ...); cached in ~/.cache/specbench/answers/...; to build it ahead of time: python -m specbench.prepare
    --model smollm2-135m --drafters hd"."""
    return (f"building {planned.what} (once): {estimate_text(planned)}; cached in {planned.directory}; "
            f"to build it ahead of time: {planned.command}")


def announce_build(planned: PlannedArtefact) -> str:
    """Log ``build_notice(planned)``, as a warning when the build is long or of unknown length; return the line."""
    line = build_notice(planned)
    long = planned.seconds is None or planned.seconds > LONG_BUILD_S
    log.log(logging.WARNING if long else logging.INFO, "%s", line)
    return line


def prepare_command(model: str, drafter: str | None = None) -> str:
    """The ``python -m specbench.prepare`` command that builds what ``drafter`` needs for ``model``."""
    return f"{PREPARE_COMMAND} --model {model}" + (f" --drafters {drafter}" if drafter else "")


# The work a decoder-only model does per token, as its weight count from its config (attention taken at full width,
# the output layer included): the measure build-time estimates scale by, the same whichever linear backend packs
# the weights. SmolLM2-135M's (30 layers of width 576, 1536 wide MLPs, 49152 tokens), the model the rates were
# measured on.
REFERENCE_WEIGHTS = 30 * (4 * 576 * 576 + 3 * 576 * 1536) + 49152 * 576


def relative_size(target) -> float:
    """How many times SmolLM2-135M's per-token work ``target`` does (see REFERENCE_WEIGHTS), for estimates."""
    config = target.weights.architecture
    width, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    mlp = int(config.get("intermediate_size") or 4 * width)
    return (layers * (4 * width * width + 3 * width * mlp) + int(config["vocab_size"]) * width) / REFERENCE_WEIGHTS
