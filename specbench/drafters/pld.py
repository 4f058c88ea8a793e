"""Prompt lookup decoding (PLD): draft the tokens that followed the last n-gram where it occurred before.

Needs no model and no training: prompts that are copied from (summaries, retrieval, editing, code) make the
output repeat spans of its own context, and those spans are found by exact n-gram match.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter
from specbench.drafters.base import require_positive
from specbench.errors import SpecbenchError

MATCH_PREFERENCES = ("earliest", "latest")


def prompt_lookup(
    context: np.ndarray, max_ngram: int, min_ngram: int, num_draft: int, prefer: str = "earliest"
) -> tuple[np.ndarray, int]:
    """Up to ``num_draft`` tokens that followed an earlier occurrence of the context's final n-gram, and the
    n of that n-gram (0 when nothing matched).

    n goes from ``max_ngram`` down to ``min_ngram`` and the first n with a match wins. An occurrence counts
    only if at least one token follows it, so the final n-gram never matches itself. Among occurrences,
    ``prefer`` picks the earliest (as Spec-Bench and transformers do) or the latest (the most recent
    context). The continuation stops at the end of the context, so it may be shorter than ``num_draft``.

    context: [length] int64 token ids.

    Example, ``max_ngram=3, num_draft=4``: context [5 1 2 3 9 1 2 3 7 1 2 3] ends in [1 2 3], which occurs at
    positions 1 and 5 (the occurrence at 9 is the suffix itself). Earliest: ([9 1 2 3], 3); latest:
    ([7 1 2 3], 3).
    """
    assert context.ndim == 1
    length = context.size
    if length < 2:
        return context[:0], 0
    # Positions (before the last) holding the final token: the candidate ends of a matching n-gram.
    ends = np.flatnonzero(context[: length - 1] == context[length - 1])
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        candidates = ends[ends >= n - 1]
        for back in range(1, n):
            if candidates.size == 0:
                break
            candidates = candidates[context[candidates - back] == context[length - 1 - back]]
        if candidates.size:
            start = (candidates[0] if prefer == "earliest" else candidates[-1]) + 1
            return context[start : start + num_draft], n
    return context[:0], 0


class PromptLookup(Drafter):
    """PLD with Spec-Bench's defaults: n-grams of 3 down to 1 token, 10 draft tokens."""

    def __init__(
        self,
        name: str = "pld",
        max_ngram_size: int = 3,
        min_ngram_size: int = 1,
        num_draft_tokens: int = 10,
        prefer: str = "earliest",
    ):
        require_positive(max_ngram_size=max_ngram_size, min_ngram_size=min_ngram_size,
                         num_draft_tokens=num_draft_tokens)
        if min_ngram_size > max_ngram_size:
            raise SpecbenchError(
                f"drafter.min_ngram_size ({min_ngram_size}) must not exceed drafter.max_ngram_size ({max_ngram_size})"
            )
        if prefer not in MATCH_PREFERENCES:
            raise SpecbenchError(f"drafter.prefer must be one of {', '.join(MATCH_PREFERENCES)}, got {prefer!r}")
        self.name = name
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size
        self.num_draft_tokens = num_draft_tokens
        self.prefer = prefer
        self._labels = {n: f"{n}-gram" for n in range(max_ngram_size + 1)}

    def propose(self, context_ids: np.ndarray) -> Draft:
        tokens, ngram = prompt_lookup(
            context_ids, self.max_ngram_size, self.min_ngram_size, self.num_draft_tokens, self.prefer
        )
        # Labelled by the matched n-gram size, which predicts acceptance (a 3-gram match beats a 1-gram).
        return Draft(torch.from_numpy(np.ascontiguousarray(tokens)), sources=(self._labels[ngram],) * tokens.size)
