"""Loading target (and draft) models: an embedded GGUF package, a GGUF file, a hub id or local directory, or a
tiny random model built in memory.

Each loader is a Hydra ``_target_`` (see ``conf/model/``) and returns a ``LoadedModel``.

- ``loaded.py``: ``LoadedModel``, ``tokenizer_fingerprint``, and ``finish_loading``, the steps all loaders share
- ``gguf.py``: ``load_embedded_gguf``, ``load_gguf`` (GGUF converted once to a checkpoint in the cache)
- ``hub.py``: ``load_pretrained`` (local directory, or hub id with an offline-first lookup)
- ``tiny.py``: ``build_tiny_random``
- ``devices.py``: ``resolve_device``, ``resolve_dtype``

The names are re-exported here, so ``from specbench.models import load_gguf`` works.
"""

from specbench.models.devices import DTYPES, resolve_device, resolve_dtype
from specbench.models.gguf import load_embedded_gguf, load_gguf
from specbench.models.hub import load_pretrained
from specbench.models.loaded import LoadedModel, finish_loading, tokenizer_fingerprint
from specbench.models.tiny import build_tiny_random

__all__ = [
    "DTYPES",
    "LoadedModel",
    "build_tiny_random",
    "finish_loading",
    "load_embedded_gguf",
    "load_gguf",
    "load_pretrained",
    "resolve_device",
    "resolve_dtype",
    "tokenizer_fingerprint",
]
