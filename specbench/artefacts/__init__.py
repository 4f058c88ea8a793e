"""Cached artefacts, one module per kind, each an ``artefacts.base.Artefact``: see base.py."""
