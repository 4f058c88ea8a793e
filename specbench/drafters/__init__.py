"""Drafters: one file per method, each built from ``conf/drafter/<name>.yaml``."""
