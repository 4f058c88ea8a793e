"""N-gram pools: continuations of fixed length keyed by the token(s) before them.

``NGramPool`` is the mutable, recency-ordered kind (Lookahead's pool, HD's context database): each key
holds at most ``capacity`` distinct continuations and adding one more evicts the least recently added.
``RankedNGrams`` is the static kind (HD's model database): each key's continuations ranked once by how many
documents they occurred in.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class NGramPool:
    """Continuations of ``continuation_length`` tokens keyed by the 1..``key_tokens`` tokens before them.

    Example with key_tokens=2, continuation_length=2, fed [7 8 9 10]: under key (8,) -> (9, 10); under
    key (7, 8) -> (9, 10); under key (7,) -> (8, 9). Lookup after a context ending in [7 8] tries (7, 8) first,
    then (8,): [(9, 10)].
    """

    def __init__(self, key_tokens: int, continuation_length: int, capacity: int):
        assert key_tokens >= 1 and continuation_length >= 1
        self.key_tokens = key_tokens
        self.continuation_length = continuation_length
        self.capacity = capacity  # < 1 means unbounded
        self.table: dict[tuple[int, ...], OrderedDict] = {}

    def clear(self) -> None:
        self.table.clear()

    def add(self, key: tuple[int, ...], continuation: tuple[int, ...]) -> None:
        """Record ``continuation`` under ``key`` as the most recent one, evicting the oldest if full."""
        entries = self.table.get(key)
        if entries is None:
            entries = self.table[key] = OrderedDict()
        if continuation in entries:
            entries.move_to_end(continuation)
            return
        entries[continuation] = None
        if 0 < self.capacity < len(entries):
            entries.popitem(last=False)

    def add_sequence(self, tokens: np.ndarray, first_end: int = 0) -> None:
        """Add every n-gram of ``tokens`` whose continuation ends at index ``first_end`` or later."""
        values = tokens.tolist()
        span = self.continuation_length
        for end in range(max(first_end, span), len(values)):
            continuation = tuple(values[end - span + 1 : end + 1])
            key_end = end - span + 1
            for key_length in range(1, min(self.key_tokens, key_end) + 1):
                self.add(tuple(values[key_end - key_length : key_end]), continuation)

    def add_new_tokens(self, tail: np.ndarray, new_tokens: np.ndarray, keep: int) -> np.ndarray:
        """Add the n-grams that end in ``new_tokens``, which follow ``tail`` (the context's last tokens so
        far); return the new tail, the last ``keep`` tokens of both, which is all later calls need when
        ``keep`` >= key_tokens + continuation_length.

        Example with key_tokens=1, continuation_length=2: tail [7 8], new_tokens [9 10], keep=3 adds
        (7,) -> (8, 9) and (8,) -> (9, 10) and returns [8 9 10].
        """
        tokens = np.concatenate((tail, new_tokens))
        self.add_sequence(tokens, first_end=tail.size)
        return tokens[-keep:]

    def lookup(self, context: np.ndarray, limit: int, oldest_first: bool = False) -> list[tuple[int, ...]]:
        """Up to ``limit`` distinct continuations of ``context``: longest key first, most recent first (or, with
        ``oldest_first``, in the order lade's and HD's lists hold them: least recently added first)."""
        found: list[tuple[int, ...]] = []
        tail = context[-self.key_tokens:].tolist()
        for key_length in range(min(self.key_tokens, len(tail)), 0, -1):
            entries = self.table.get(tuple(tail[len(tail) - key_length:]))
            if not entries:
                continue
            for continuation in (entries if oldest_first else reversed(entries)):
                if continuation not in found:
                    found.append(continuation)
                    if len(found) == limit:
                        return found
        return found


class RankedNGrams:
    """Static continuations per key, best first (e.g. by document frequency), for keys of 1..key_tokens."""

    def __init__(self, table: dict[tuple[int, ...], list[tuple[int, ...]]], key_tokens: int,
                 source: dict | None = None):
        self.table = table
        self.key_tokens = key_tokens
        self.source = source or {}  # what it was built from (a model database's manifest: its prompt set), for records

    @staticmethod
    def from_counts(ngrams: np.ndarray, counts: np.ndarray, key_length: int, capacity: int,
                    table: dict | None = None) -> dict:
        """Add [m, key_length + continuation] n-grams with their counts to ``table``: each key keeps its
        ``capacity`` highest-count continuations, ties broken by first appearance."""
        table = {} if table is None else table
        order = np.argsort(-counts, kind="stable")
        for row in ngrams[order].tolist():
            entries = table.setdefault(tuple(row[:key_length]), [])
            if len(entries) < capacity:
                entries.append(tuple(row[key_length:]))
        return table

    def lookup(self, context: np.ndarray, limit: int) -> list[tuple[int, ...]]:
        found: list[tuple[int, ...]] = []
        tail = context[-self.key_tokens:].tolist()
        for key_length in range(min(self.key_tokens, len(tail)), 0, -1):
            for continuation in self.table.get(tuple(tail[len(tail) - key_length:]), ()):
                if continuation not in found:
                    found.append(continuation)
                    if len(found) == limit:
                        return found
        return found
