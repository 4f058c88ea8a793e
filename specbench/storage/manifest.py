"""The checksums that tell a whole published directory from a damaged one: ``file_records`` at build time,
``verify_files`` at every load, and the content key that names a published version."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path

from specbench.errors import SpecbenchError, damage_reason
from specbench.storage.atomic import unique_suffix, write_atomically

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def file_digest(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 of a file's content, read in chunks (about 1 s per GB): caches built from a file are keyed by
    what it holds, not by its path, so an edited file never reuses what was built from its old content."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


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
    text = json.dumps({**manifest, "files": {**manifest["files"], **verified}}, indent=2) + "\n"
    try:
        write_atomically(directory / MANIFEST, lambda staging: staging.write_text(text))
    except (OSError, SpecbenchError) as error:
        log.debug("%s: could not record the verified file times (%s)", directory, error)


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

