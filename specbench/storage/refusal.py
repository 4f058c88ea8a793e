"""The one place that turns an error of the filesystem into the one-line refusal a user reads: "cannot write P:
the disk is full (ENOSPC); free space or choose another location (...)". A refusal is the user's storage, not a
bug, so it reaches the user without a traceback; any other error goes on as it is."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from specbench.errors import SpecbenchError

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
    # A cache or output path through a file (SPECBENCH_CACHE=/some/file): mkdir below it, or of it.
    "ENOTDIR": ("a part of the path is a file, not a folder", "choose a folder"),
    "EEXIST": ("a file is in the way", "remove it or choose another location"),
}
_LOCATIONS = "hydra.run.dir, hydra.sweep.dir, model.cache_dir or $SPECBENCH_CACHE"

# safetensors reports a failed write as SafetensorError("Error while serializing: I/O error: No space left on
# device (os error 28)"), not as an OSError; the errno is only in the text.
_QUOTED_ERRNO = re.compile(r"\(os error (\d+)\)")
_QUOTED_PATH = re.compile(r'at path "([^"]*)"')
# numpy's np.save of an array (ndarray.tofile) reports a short write as OSError("360001 requested and 64480
# written") without an errno: measured on a full tmpfs, where it is the disk that is full.
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def storage_refusal(error: OSError, path=None, what: str = "write") -> SpecbenchError | None:
    """The one-line error for a filesystem that refused a ``what`` (``write``, ``create``, ``lock``) at ``path``
    (default: the path the error names; without one the sentence names no path), or None when ``error`` is not
    such a refusal (a bug keeps its traceback). Callers raise it ``from error`` after removing anything
    half-written."""
    name = errno.errorcode.get(error.errno or -1)
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


def refusal_of(error: BaseException, path=None, what: str = "write") -> SpecbenchError | None:
    """``storage_refusal`` for the OSError behind ``error`` (``os_error_of``: itself, what it was raised from,
    safetensors' quoted errno, numpy's short write): the one line naming ``path`` (default: the path the error
    names), or None for a bug."""
    os_error = os_error_of(error)
    return storage_refusal(os_error, path, what) if os_error is not None else None


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and those it was raised from or while handling: a library reports a refused write in its own
    exception type, raised from (torch, safetensors) or while handling (torch's stream writer given a file) the
    OSError of the write."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def refusal_in_chain(error: BaseException, path=None, what: str = "write") -> SpecbenchError | None:
    """``refusal_of`` for the first error of ``error``'s whole chain (raised from, or while handling) that is a
    refusal: a library's own exception raised while handling the OSError of a write; None when there is none."""
    for link in _chain(error):
        refusal = refusal_of(link, path, what)
        if refusal is not None:
            return refusal
    return None
