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
