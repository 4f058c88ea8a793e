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
