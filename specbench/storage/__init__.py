"""The storage ground floor: atomic writes, the one-line refusal of a filesystem, locks, manifests and checksums,
the atomic publish of a built directory, and where the cache is. Imports nothing of specbench but errors.py."""
