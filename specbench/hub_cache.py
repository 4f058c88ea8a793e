"""The Hugging Face cache and the hub as every loader of a named checkpoint sees them (a target, an EAGLE head):
what is cached already, and whether the hub answers at all. Called through this module (``hub_cache.hub_reachable()``),
so that one stand-in (a test's, an offline machine's) serves every loader."""

from __future__ import annotations

from pathlib import Path


def cached_snapshot(hub_id: str, revision: str | None) -> Path | None:
    """The directory of a hub model's files in the local Hugging Face cache, or None."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(hub_id, revision=revision, local_files_only=True))
    except Exception:  # not cached, or the cache is unreadable: nothing to point at
        return None


def hub_reachable(timeout_s: float = 5.0) -> bool:
    """Whether a TCP connection to the hub opens quickly; the hub client itself retries for a minute or more
    before giving up, which is no way to learn that a machine is offline."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False
