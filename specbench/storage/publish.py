"""The atomic publish of a built directory, which lets readers keep reading while it is replaced.

Layout of a published directory ``D`` (say ``<cache>/datastores/<key>``)::

    D -> .D.versions/<content key>     a symbolic link, swapped atomically (rename) by each publish
    .D.versions/<content key>/         one built version: its files and manifest.json, never written again
    .D.versions/.staging-<pid>-<random>-<host>/   a version being written
    .D.versions/build.lock             held by the one process building D (``artefacts.base.load_or_rebuild``)
    .D.versions/publish.lock           held for the milliseconds of a publish

Readers open ``D/<file>`` as before. A reader that has opened (or memory-mapped) a version keeps a complete
directory when a rebuild publishes, since the new version is written beside it and only the link changes; the
version a publish replaces is kept until the next publish, and older ones are removed then (best effort).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.storage.atomic import unique_suffix
from specbench.storage.cache import versions_dir
from specbench.storage.locks import artefact_lock, holder_is_dead
from specbench.storage.manifest import MANIFEST, content_key, file_records, read_manifest, verify_files
from specbench.storage.refusal import os_error_of, refusing_writes, storage_refusal

CACHE_HINT = "set SPECBENCH_CACHE (or the drafter's cache_dir) to a writable directory"


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

