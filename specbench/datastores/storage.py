"""Writing a database directory so that a reader never sees a half-written one."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def replace_directory(directory: str | Path, write: Callable[[Path], None], manifest: dict) -> None:
    """Call ``write(staging)`` on an empty staging directory next to ``directory``, add ``manifest.json``
    (written last, since loaders take its presence for a whole database), then swap it into place."""
    directory = Path(directory)
    staging = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write(staging)
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if directory.exists():
        shutil.rmtree(directory)
    staging.replace(directory)
