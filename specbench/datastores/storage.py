"""Writing a database directory so that a reader never sees a half-written one, checking on load that it is
still what was written, and keeping a damaged cached one from stopping a run."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from specbench.errors import SpecbenchError
from specbench.models.cache import file_records

log = logging.getLogger(__name__)

Loaded = TypeVar("Loaded")

CACHE_HINT = "set SPECBENCH_CACHE (or the drafter's cache_dir) to a writable directory"


def replace_directory(directory: str | Path, write: Callable[[Path], None], manifest: dict) -> None:
    """Call ``write(staging)`` on an empty staging directory next to ``directory``, add ``manifest.json``
    (written last, since loaders take its presence for a whole database) with a record of every file written
    (``file_records``), then swap it into place. An existing directory is replaced only if it holds a database
    (a manifest.json or arrays: .npy, .npz, a model's .safetensors), so that a mistyped output path never deletes other files."""
    directory = Path(directory)
    if directory.exists() and not _holds_database(directory):
        raise SpecbenchError(f"{directory} exists and holds no database (no manifest.json or arrays): not replacing "
                             "it; remove it or choose another directory")
    staging = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
    except OSError as error:
        raise SpecbenchError(f"cannot write the database {directory} ({error.strerror}); choose a writable "
                             f"directory, or {CACHE_HINT}") from None
    try:
        write(staging)
        manifest = {**manifest, "files": file_records(staging)}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        staging.replace(directory)
    except BaseException:  # a failed or interrupted build leaves nothing behind
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _holds_database(directory: Path) -> bool:
    if not directory.is_dir():
        return False
    names = [path.name for path in directory.iterdir()]
    return not names or "manifest.json" in names or any(name.endswith((".npy", ".npz", ".safetensors"))
                                                        for name in names)


def read_manifest(directory: Path, what: str, fix: str) -> dict:
    """The parsed ``manifest.json`` of a database directory, or a one-line SpecbenchError naming what is wrong
    and ``fix``."""
    manifest_file = directory / "manifest.json"
    if not manifest_file.is_file():
        raise SpecbenchError(f"{directory}: no {what} here (manifest.json missing); {fix}")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as error:
        raise SpecbenchError(f"{directory}: damaged {what} (manifest.json: {error}); {fix}") from None
    if not isinstance(manifest, dict):
        raise SpecbenchError(f"{directory}: damaged {what} (manifest.json is not a JSON object); {fix}")
    return manifest


def require_writable(directory: str | Path, hint: str = CACHE_HINT) -> None:
    """A one-line SpecbenchError unless a database can be built in ``directory``: the staging directory is
    created next to it, so its nearest existing ancestor (and the directory itself, if it exists, since the
    old one is removed) must be writable. Checked before the build, which may take minutes."""
    directory = Path(directory)
    existing = directory.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    for path in (existing, directory) if directory.is_dir() else (existing,):
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise SpecbenchError(f"cannot build {directory}: {path} is not a writable directory; {hint}")


def load_or_rebuild(directory: Path, what: str, load: Callable[[], Loaded], build: Callable[[], None]) -> Loaded:
    """A cached (``auto``) database: ``load()`` it if it is there and passes its checks; otherwise ``build()``
    it (first checking that the cache is writable) and load it. A cached database that fails its checks is
    damaged (the cache key covers everything it was built from), so it is rebuilt with one warning rather
    than stopping the run."""
    damaged = False
    if directory.exists():
        try:
            return load()
        except SpecbenchError as error:
            log.warning("the cached %s is damaged and is being rebuilt: %s", what, error)
            damaged = True
    else:
        log.info("building the %s (once; cached in %s)", what, directory)
    require_writable(directory)
    if damaged:  # the cache's own directory, whatever it now holds
        if directory.is_dir() and not directory.is_symlink():
            shutil.rmtree(directory)
        else:
            directory.unlink()
    build()
    return load()
