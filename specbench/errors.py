"""Errors that reach the user as one line, without a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn


class SpecbenchError(Exception):
    """A problem with the user's input or environment, explained in the message.

    The entry point prints the message alone and exits with status 2; anything else that escapes is a bug and
    keeps its traceback.
    """


# errno values meaning "the filesystem will not take this write": the user's storage, not a bug; with what to do.
_FREE_SPACE = "free space or choose another location"
_WRITABLE = "choose a writable location"
_STORAGE_ERRNOS = {
    "EROFS": ("the filesystem is read-only", _WRITABLE),
    "ENOSPC": ("the disk is full", _FREE_SPACE),
    "EDQUOT": ("the disk quota is used up", _FREE_SPACE),
    "EACCES": ("permission denied", _WRITABLE),
    "EPERM": ("operation not permitted", _WRITABLE),
    "EFBIG": ("the file is too large for the filesystem", "choose another filesystem"),
    "EMFILE": ("too many open files", "raise the open-file limit (ulimit -n)"),
    "ENAMETOOLONG": ("the path is too long", "choose a shorter path"),
}
_LOCATIONS = "hydra.run.dir, hydra.sweep.dir, model.cache_dir or $SPECBENCH_CACHE"


def storage_refusal(error: OSError, path=None, what: str = "write") -> SpecbenchError | None:
    """The one-line error for a filesystem that refused a ``what`` (``write``, ``create``, ``lock``) at ``path``
    (default: the path the error names; without one the sentence names no path), or None when ``error`` is not
    such a refusal (a bug keeps its traceback). Callers raise it ``from error`` after removing anything
    half-written."""
    import errno as errno_module

    name = errno_module.errorcode.get(error.errno or -1)
    if name not in _STORAGE_ERRNOS:
        return None
    where = path if path is not None else error.filename
    reason, fix = _STORAGE_ERRNOS[name]
    target = f"cannot {what} {where}" if where is not None else f"a {what} was refused"
    return SpecbenchError(f"{target}: {reason} ({name}); {fix} ({_LOCATIONS})")


def raise_refusal(error: OSError, path=None, what: str = "write") -> NoReturn:
    """Raise ``storage_refusal``'s one line from ``error``, or ``error`` itself when it is not a refusal."""
    refusal = storage_refusal(error, path, what)
    if refusal is None:
        raise error
    raise refusal from error


@contextmanager
def refusing_writes(path=None, what: str = "write") -> Iterator[None]:
    """A filesystem's refusal inside the block becomes ``storage_refusal``'s one line about ``path``; any other
    error goes on as it is."""
    try:
        yield
    except OSError as error:
        raise_refusal(error, path, what)


def damage_reason(error: BaseException) -> str:
    """What a reading library said about a damaged file, fit for the middle of one line: the first line of its
    message (numpy, pyarrow and safetensors write several), else the exception's name. Readers of the files
    specbench wrote catch any Exception from the library, since each raises its own kinds for a cut, foreign or
    garbled file (zipfile.BadZipFile, EOFError, zlib.error, RecursionError for deep JSON, ...)."""
    text = getattr(error, "strerror", None) if isinstance(error, OSError) else None
    first = (text or str(error)).strip().splitlines()
    return first[0] if first else type(error).__name__
