"""Decoding core: draft trees, verification, the KV cache and the one decoding loop."""
