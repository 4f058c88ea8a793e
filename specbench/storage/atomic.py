"""The one atomic write of the package, and the one append of whole records: a reader (or a resumed run) sees a
file's old content or its new content, never half of one, and a write the filesystem refuses is one line naming
the file (``storage.refusal``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from specbench.storage.refusal import raise_refusal, refusal_in_chain


def unique_suffix() -> str:
    """``<pid>-<random>-<host>``: a name no other process writes, on this host or on another one sharing the
    filesystem (pids repeat across the hosts of a cluster). The host comes last, since host names hold dashes."""
    return f"{os.getpid()}-{secrets.token_hex(4)}-{socket.gethostname()}"


def staging_file(path: Path) -> Path:
    """Where ``write_atomically`` writes ``path`` before renaming it into place: a hidden name beside it, of this
    process and call alone, so two writers of the same file never write into each other's staging file."""
    return path.with_name(f".{path.name}.{unique_suffix()}.partial")


def process_umask() -> int:
    """This process's umask, read without changing it (os.umask can only be read by setting it, which would race with
    other threads creating files): Linux's /proc/self/status, else the common 022."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> None:
    """``write(staging)`` then rename the staging file over ``path``, with the mode an ordinary open() gives (0666 less
    the umask): safetensors writes its files 0600, which would hide a shared cache's heads from the cluster's other
    users. On any failure (an interrupt too) the staging
    file is removed; a filesystem that refuses (a full disk, a read-only mount, a quota), wherever the library
    that wrote reports it (torch's and safetensors' own errors), is one line naming ``path``."""
    path = Path(path)
    staging = staging_file(path)
    try:
        write(staging)
        if staging.is_file():
            os.chmod(staging, 0o666 & ~process_umask())
        os.replace(staging, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
        refusal = refusal_in_chain(error, path) if isinstance(error, Exception) else None
        if refusal is None:
            raise
        raise refusal from error


def append_whole(path: str | Path, data: bytes, sync: bool = False) -> None:
    """Append ``data`` (whole records, each ending in a newline) to ``path`` in as few write calls as the system
    takes, then, with ``sync``, flush it to the disk. A write that fails part-way (a disk filling up, an interrupt)
    is cut back to where the file ended, so no half record is left for the next append to run into; if even the
    cut fails, readers trust only the whole records before it. A filesystem that refuses is one line naming
    ``path``."""
    path = Path(path)
    try:
        handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as error:
        raise_refusal(error, path)
    try:
        start = os.fstat(handle).st_size
        try:
            written = 0
            while written < len(data):  # a short write: the rest goes through, or the disk's refusal comes
                written += os.write(handle, data[written:])
            if sync:
                os.fsync(handle)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.ftruncate(handle, start)
            if isinstance(error, OSError):
                raise_refusal(error, path)
            raise
    finally:
        os.close(handle)
