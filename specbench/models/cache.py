"""Where the specbench cache lives and how its artefacts (converted models, databases, answers) are named."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_root(cache_dir: str | None) -> Path:
    """Where converted model copies and built databases live: ``cache_dir``, else $SPECBENCH_CACHE, else
    ~/.cache/specbench."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def cached_path(cache_dir: str | None, kind: str, stem: str, settings: dict, suffix: str = "") -> Path:
    """Where the cache keeps an artefact of ``kind`` built with ``settings``: a hash of the settings is part
    of the name, so that an artefact is never reused for other settings."""
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return cache_root(cache_dir) / kind / f"{stem}-{digest}{suffix}"


def file_digest(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 of a file's content, read in chunks (about 1 s per GB): caches built from a file are keyed by
    what it holds, not by its path, so an edited file never reuses what was built from its old content."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def file_records(directory: Path) -> dict:
    """{file name: {bytes, mtime_ns, sha256}} of the files in ``directory`` but manifest.json, for
    ``verify_files``: written when a database or a converted model copy is built."""
    records = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != "manifest.json":
            stat = path.stat()
            records[path.name] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_digest(path)}
    return records


def verify_files(directory: Path, manifest: dict) -> str | None:
    """What is wrong with the files ``manifest["files"]`` records (``file_records`` at build time), or None.

    A file must have its recorded size; its content is hashed only when its modification time differs from the
    recorded one (a copied directory, or a file written over). Hashing on every load was measured on 2 cores at
    0.13-0.18 s for the 175 MB ShareGPT datastore but 0.3-0.5 s for python-docs' 256 MB suffix automaton, which
    loads in a few ms because it is memory-mapped (ShareGPT's, 1.9 GiB, would take seconds and be read in full),
    and UltraChat-size datastores are several GB; a stat costs 0.1 ms, and a truncated file shows in its size,
    an overwritten one in its time. A manifest without records (written before they existed) passes: the
    loaders' shape and dtype checks still apply."""
    records = manifest.get("files")
    if records is None:
        return None
    if not isinstance(records, dict):
        return "manifest.json: 'files' is not a table of files"
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
        if stat.st_mtime_ns != record.get("mtime_ns") and file_digest(path) != record.get("sha256"):
            return f"{name} is not the file that was written (its SHA-256 differs from manifest.json's)"
    return None
