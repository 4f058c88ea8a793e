"""Autoregressive decoding: no draft, one token per step. The baseline runs through the same loop."""

from __future__ import annotations

import numpy as np

from specbench.decoding.contract import Draft, Drafter


class NoDraft(Drafter):
    """Proposes nothing, so each step verifies only the last token and yields the target's next token."""

    def __init__(self, name: str = "ar"):
        self.name = name
        self._empty = Draft.empty()

    def propose(self, context_ids: np.ndarray) -> Draft:
        return self._empty
