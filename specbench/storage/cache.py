"""The cache's ground floor: where artefacts live and what their names are keyed by (nothing here knows what
any artefact is; specbench.artefacts does)."""

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


def settings_key(settings: dict) -> str:
    """A short hash of ``settings`` (JSON, keys sorted): the part of a cached artefact's name that keeps it from
    being reused for other settings."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]


def cached_path(cache_dir: str | None, kind: str, stem: str, settings: dict, suffix: str = "") -> Path:
    """Where the cache keeps an artefact of ``kind`` built with ``settings`` (``settings_key`` is in its name)."""
    return cache_root(cache_dir) / kind / f"{stem}-{settings_key(settings)}{suffix}"



def versions_dir(directory: str | Path) -> Path:
    """Where the versions (and the locks) of the published directory ``directory`` are kept: beside it
    (``storage.publish``)."""
    directory = Path(directory)
    return directory.with_name(f".{directory.name}.versions")
