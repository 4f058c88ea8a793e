"""Errors that reach the user as one line, without a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

USER_ERROR = 2  # the exit status of every error a user can cause, from every entry point and script


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
    # A cache or output path through a file (SPECBENCH_CACHE=/some/file): mkdir below it, or of it.
    "ENOTDIR": ("a part of the path is a file, not a folder", "choose a folder"),
    "EEXIST": ("a file is in the way", "remove it or choose another location"),
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


# ---- one line for every error a user can cause, in every entry point ---------------------------------------------


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and those it was raised from or while handling: a library reports a refused write in its own
    exception type, raised from (torch, safetensors) or while handling (torch's stream writer given a file) the
    OSError of the write."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def config_error_line(error: BaseException) -> str | None:
    """The one line of a config the composer refused (a group option or config file it cannot find, a key not in
    the config, an override it cannot parse), with the valid choices where Hydra lists them; None for any other
    error. Hydra and OmegaConf are looked up only if already imported (analysis never imports them)."""
    hydra_errors, omegaconf_errors = sys.modules.get("hydra.errors"), sys.modules.get("omegaconf.errors")
    if hydra_errors is not None and isinstance(error, hydra_errors.MissingConfigException):
        missing = error.missing_cfg_file
        if error.options and missing and "/" in missing:
            group, name = missing.rsplit("/", 1)
            return f"{group}={name}: no such config in conf/{group}/; choose one of {', '.join(error.options)}"
    kinds = tuple(module.__dict__[name] for module, name in ((hydra_errors, "HydraException"),
                                                            (omegaconf_errors, "OmegaConfBaseException"))
                  if module is not None)
    if not kinds or not isinstance(error, kinds):
        return None
    text = str(error).split("Config search path:")[0]
    cause = error.__cause__
    if omegaconf_errors is not None and isinstance(cause, omegaconf_errors.OmegaConfBaseException) \
            and str(cause) not in text:
        text += f" ({cause})"
    return " ".join(text.split())


def write_refused(error: BaseException, path=None, what: str = "write") -> SpecbenchError | None:
    """``storage_refusal``'s one line about ``path`` for a write the filesystem refused, wherever in ``error``'s
    chain its OSError is (a library's own exception raised from or while handling it, safetensors' quoted errno,
    numpy's short write); None when there is none (a bug)."""
    from specbench.artefacts import write_refusal  # not at import: artefacts imports this module

    for link in _chain(error):
        refusal = write_refusal(link, path, what)
        if refusal is not None:
            return refusal
    return None


def user_error_line(error: BaseException) -> str | None:
    """The one line for ``error`` if the user's input or environment caused it: a SpecbenchError, a config the
    composer refused, a write the filesystem refused wherever it was raised (a full disk inside torch's, numpy's
    or pyarrow's save; a cache path through a file), naming the path where the error does; None for a bug, which
    keeps its traceback."""
    if isinstance(error, SpecbenchError):
        return str(error)
    line = config_error_line(error)
    if line is not None:
        return line
    refusal = write_refused(error)
    return None if refusal is None else str(refusal)


def reporting_user_errors(program: str, main: Callable) -> Callable:
    """``main`` that ends with ``program: error: <one line>`` on stderr and exit status USER_ERROR for every error
    ``user_error_line`` recognises, and lets any other exception (a bug, an interrupt) through. Every entry point
    and script wraps its main in it (tests/test_errors.py lists them)::

        sys.exit(interrupts.run(reporting_user_errors("build_datastore", main)))
    """

    @functools.wraps(main)
    def reporting(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as error:
            from specbench.interrupts import follows_interrupt

            line = None if follows_interrupt(error) else user_error_line(error)
            if line is None:
                raise
            print(f"{program}: error: {line}", file=sys.stderr)
            sys.exit(USER_ERROR)

    return reporting
