"""Prompt lookup decoding (PLD): draft the tokens that followed the last n-gram where it occurred before.

Needs no model and no training: prompts that are copied from (summaries, retrieval, editing, code) make the
output repeat spans of its own context, and those spans are found by exact n-gram match.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter
from specbench.drafters.base import (check_token_id, no_match_draft, require_flag, require_in_vocabulary,
                                     require_positive)
from specbench.errors import SpecbenchError

MATCH_PREFERENCES = ("earliest", "latest")


def prompt_lookup(
    context: np.ndarray, max_ngram: int, min_ngram: int, num_draft: int, prefer: str = "earliest",
    full_continuation: bool = True,
) -> tuple[np.ndarray, int]:
    """Up to ``num_draft`` tokens that followed an earlier occurrence of the context's final n-gram, and the
    n of that n-gram (0 when nothing matched).

    n goes from ``max_ngram`` down to ``min_ngram`` and the first n with a usable occurrence wins; among the
    usable occurrences ``prefer`` picks the earliest (Spec-Bench) or the latest (the most recent context).

    full_continuation=True is Spec-Bench's rule (model/pld/pld.py, ``find_candidate_pred_tokens``): an
    occurrence at i is usable only if all ``num_draft`` tokens after it lie inside the context
    (i + n + num_draft <= length) and the continuation starts before the final n-gram (i + n < length - n),
    so the draft is always exactly ``num_draft`` tokens. Both are upper bounds on i, so when the earliest
    occurrence is too late every later one is too and the search moves to a shorter n, never to the next
    occurrence. full_continuation=False (transformers' prompt lookup): any occurrence with at least one token
    after it, and the continuation is cut at the end of the context.

    context: [length] int64 token ids.

    Example, ``max_ngram=3``: context [5 1 2 3 9 1 2 3 7 1 2 3] ends in [1 2 3], which occurs at 1 and 5 (9 is
    the suffix itself). num_draft=4: earliest ([9 1 2 3], 3), latest ([7 1 2 3], 3). num_draft=5: the occurrence
    at 5 has only 4 tokens after it, so full_continuation gives ([9 1 2 3 7], 3) either way, and without it
    latest gives ([7 1 2 3], 3).
    """
    assert context.ndim == 1
    length = context.size
    if length < 2:
        return context[:0], 0
    # Positions (before the last) holding the final token: the candidate ends of a matching n-gram.
    ends = np.flatnonzero(context[: length - 1] == context[length - 1])
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        candidates = ends[ends >= n - 1]
        if full_continuation:
            # occurrence start i = end - n + 1; i + n + num_draft <= length and i + n < length - n
            candidates = candidates[(candidates + 1 + num_draft <= length) & (candidates + 1 < length - n)]
        for back in range(1, n):
            if candidates.size == 0:
                break
            candidates = candidates[context[candidates - back] == context[length - 1 - back]]
        if candidates.size:
            start = (candidates[0] if prefer == "earliest" else candidates[-1]) + 1
            return context[start : start + num_draft], n
    return context[:0], 0


class PromptLookup(Drafter):
    """PLD as Spec-Bench ran it (model/pld/pld.py): n-grams of 3 down to 1 token, exactly 10 draft tokens from
    the earliest occurrence with a full continuation, and a one-token dummy draft (id 100) when nothing
    matches. docs/fidelity.md traces every setting to the original."""

    def __init__(
        self,
        name: str = "pld",
        max_ngram_size: int = 3,
        min_ngram_size: int = 1,
        num_draft_tokens: int = 10,
        prefer: str = "earliest",
        full_continuation: bool = True,
        no_match_token: int | None = 100,
        first_draft_from_prompt: bool = True,
    ):
        require_flag(first_draft_from_prompt=first_draft_from_prompt)
        self.first_draft_from_prompt = first_draft_from_prompt
        require_positive(max_ngram_size=max_ngram_size, min_ngram_size=min_ngram_size,
                         num_draft_tokens=num_draft_tokens)
        if min_ngram_size > max_ngram_size:
            raise SpecbenchError(
                f"drafter.min_ngram_size ({min_ngram_size}) must not exceed drafter.max_ngram_size ({max_ngram_size})"
            )
        if prefer not in MATCH_PREFERENCES:
            raise SpecbenchError(f"drafter.prefer must be one of {', '.join(MATCH_PREFERENCES)}, got {prefer!r}")
        if not isinstance(full_continuation, bool):
            raise SpecbenchError(f"drafter.full_continuation must be true or false, got {full_continuation!r}")
        self.name = name
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size
        self.num_draft_tokens = num_draft_tokens
        self.prefer = prefer
        self.full_continuation = full_continuation
        self.no_match_token = check_token_id("no_match_token", no_match_token)

    def prepare(self, target, sampling=None) -> None:
        require_in_vocabulary("no_match_token", self.no_match_token, target)

    def propose(self, context_ids: np.ndarray) -> Draft:
        tokens, ngram = prompt_lookup(context_ids, self.max_ngram_size, self.min_ngram_size, self.num_draft_tokens,
                                      self.prefer, self.full_continuation)
        if ngram == 0:
            return no_match_draft(self.no_match_token)
        # Labelled by the matched n-gram size, which predicts acceptance (a 3-gram match beats a 1-gram).
        return Draft(torch.from_numpy(np.ascontiguousarray(tokens)), sources=(f"{ngram}-gram",) * tokens.size)
