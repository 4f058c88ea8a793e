"""Writes that a reader never sees half of: a file replaced whole (``write_atomically``) and a line appended
whole (``append_line``), each one line naming the file when the filesystem refuses.

A temporary home: these are storage, not results, and join ``specbench.storage`` (its one atomic write and its
refusal module) when the two packages meet."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np

from specbench.errors import SpecbenchError, storage_refusal


def _refused(error: BaseException, path: Path) -> SpecbenchError | None:
    """The one-line error for a filesystem that refused a write to ``path``, or None (a bug keeps its traceback)."""
    return storage_refusal(error, path) if isinstance(error, OSError) else None


def write_atomically(path: Path, write) -> None:
    """``write(staging)`` then rename over ``path``: a reader sees the old file or the new one, never half of one.
    On any failure the staging file is removed; a filesystem that refuses (a full disk, a read-only mount, a
    quota) is one line naming ``path`` (``specbench.errors.storage_refusal``)."""
    staging = path.with_name(path.name + ".partial")
    try:
        write(staging)
        os.replace(staging, path)
    except BaseException as error:  # an interrupt too: a .partial left behind is half of a result file
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
        refusal = _refused(error, path)
        if refusal:
            raise refusal from error
        raise


def append_line(path: Path, record: dict) -> None:
    """Append ``record`` to the .jsonl file ``path`` as one line, in one write call, then sync it. A write that
    fails part-way (a disk filling up) is cut back to where the file ended, so no half line is left for the
    next append to run into; if even that fails, the readers' check of every line leaves it out
    (``read_result_lines``). A filesystem that refuses is one line naming ``path``."""
    data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    try:
        handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as error:
        refusal = _refused(error, path)
        if refusal:
            raise refusal from error
        raise
    try:
        start = os.fstat(handle).st_size
        try:
            written = os.write(handle, data)
            while written < len(data):  # a short write: the rest goes through, or the disk's refusal comes
                written += os.write(handle, data[written:])
            os.fsync(handle)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.ftruncate(handle, start)
            refusal = _refused(error, path)
            if refusal:
                raise refusal from error
            raise
    finally:
        os.close(handle)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with path.open("wb") as handle:  # a handle: np.savez would add ".npz" to the staging name
        np.savez(handle, **arrays)
