"""REST: retrieval-based speculative decoding (He et al., 2024).

The longest suffix of the context that occurs in a large token datastore is looked up with a suffix array;
the tokens that followed its occurrences are merged into a trie and the most frequent prefixes become one
draft tree.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.datastores.suffix_array import SEPARATOR, prefix_group_starts
from specbench.decoding.contract import Draft, Drafter
from specbench.drafters.base import require_positive
from specbench.errors import SpecbenchError


def frequent_prefix_trie(continuations: np.ndarray, max_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``max_nodes`` most frequent prefixes of the rows of ``continuations`` as a tree: (tokens [n],
    parents [n] in draft numbering). Rows must be sorted lexicographically (as a suffix-array range gives
    them); SEPARATOR ends a row. A prefix's frequency is the number of rows that start with it. Ties go to the
    shorter, then the lexicographically smaller prefix, so a prefix is always chosen before its extensions
    and the result is a valid tree.

    Example: rows [1 2], [1 2], [1 3], [4 5] with max_nodes=3 -> prefixes [1] (3), [1 2] (2), then [1 3], [4],
    [4 5] tie at 1 and the shortest, [4], wins: tokens [1 4 2], parents [-1 -1 0].
    """
    rows, width = continuations.shape
    if rows == 0 or width == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    starts = prefix_group_starts(continuations)
    group_rows, depths, counts = [], [], []
    for depth in range(width):
        first = np.flatnonzero(starts[:, depth])
        size = np.diff(np.append(first, rows))
        valid = continuations[first, depth] != SEPARATOR
        group_rows.append(first[valid])
        depths.append(np.full(int(valid.sum()), depth))
        counts.append(size[valid])
    group_rows, depths, counts = map(np.concatenate, (group_rows, depths, counts))
    chosen = np.lexsort((group_rows, depths, -counts))[:max_nodes]
    chosen = chosen[np.lexsort((group_rows[chosen], depths[chosen]))]  # parents (shallower) first
    node_rows, node_depths = group_rows[chosen], depths[chosen]
    tokens = continuations[node_rows, node_depths].astype(np.int64)
    parents = np.full(chosen.size, -1, dtype=np.int64)
    for depth in range(1, width):
        children = np.flatnonzero(node_depths == depth)
        if children.size == 0:
            break
        candidates = np.flatnonzero(node_depths == depth - 1)
        # A child's parent is the group at depth-1 that starts at or before the child's first row.
        parents[children] = candidates[np.searchsorted(node_rows[candidates], node_rows[children], side="right") - 1]
    return tokens, parents


class RetrievalDrafter(Drafter):
    """REST with Spec-Bench's defaults: suffixes of 16 down to 2 tokens, 64 draft tokens."""

    def __init__(
        self,
        name: str = "rest",
        datastore: str = "auto",
        corpus: str = "python-docs",
        max_suffix_length: int = 16,
        min_suffix_length: int = 2,
        continuation_length: int = 10,
        max_matches: int = 1000,
        num_draft: int = 64,
        cache_dir: str | None = None,
    ):
        require_positive(max_suffix_length=max_suffix_length, min_suffix_length=min_suffix_length,
                         continuation_length=continuation_length, max_matches=max_matches, num_draft=num_draft)
        if min_suffix_length > max_suffix_length:
            raise SpecbenchError(f"drafter.min_suffix_length ({min_suffix_length}) exceeds max_suffix_length ({max_suffix_length})")
        self.name = name
        self.datastore_path = datastore
        self.corpus = corpus
        self.max_suffix_length = max_suffix_length
        self.min_suffix_length = min_suffix_length
        self.continuation_length = continuation_length
        self.max_matches = max_matches
        self.num_draft = num_draft
        self.cache_dir = cache_dir
        self.datastore = None

    def prepare(self, target, sampling=None) -> None:
        from specbench.datastores.build import statistics_datastore

        self.datastore = statistics_datastore(target, self.datastore_path, self.corpus, self.cache_dir)

    def propose(self, context_ids: np.ndarray) -> Draft:
        length, lo, hi = self.datastore.longest_suffix_match(context_ids, self.max_suffix_length, self.min_suffix_length)
        if length == 0:
            return Draft.empty()
        matrix = self.datastore.continuation_matrix(lo, hi, length, self.continuation_length, self.max_matches)
        tokens, parents = frequent_prefix_trie(matrix, self.num_draft)
        if tokens.size == 0:
            return Draft.empty()
        return Draft(torch.from_numpy(tokens), torch.from_numpy(parents))
