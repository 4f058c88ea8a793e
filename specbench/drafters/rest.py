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
from specbench.decoding.tree import reindex_parents
from specbench.drafters.base import (check_token_id, no_match_draft, require_flag, require_in_vocabulary,
                                     require_positive)
from specbench.errors import SpecbenchError

MATCH_SAMPLING = ("first", "even")


def frequent_prefix_trie(continuations: np.ndarray, max_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``max_nodes`` most frequent prefixes of the rows of ``continuations`` as a tree: (tokens [n],
    parents [n] in draft numbering, counts [n]). Rows must be sorted lexicographically (as a suffix-array range gives
    them); SEPARATOR ends a row. A prefix's frequency is the number of rows that start with it. Ties go to the
    shorter, then the lexicographically smaller prefix, so a prefix is always chosen before its extensions
    and the result is a valid tree.

    Example: rows [1 2], [1 2], [1 3], [4 5] with max_nodes=3 -> prefixes [1] (3), [1 2] (2), then [1 3], [4],
    [4 5] tie at 1 and the shortest, [4], wins: tokens [1 4 2], parents [-1 -1 0].
    """
    rows, width = continuations.shape
    if rows == 0 or width == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
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
    node_rows, node_depths, node_counts = group_rows[chosen], depths[chosen], counts[chosen]
    tokens = continuations[node_rows, node_depths].astype(np.int64)
    parents = np.full(chosen.size, -1, dtype=np.int64)
    for depth in range(1, width):
        children = np.flatnonzero(node_depths == depth)
        if children.size == 0:
            break
        candidates = np.flatnonzero(node_depths == depth - 1)
        # A child's parent is the group at depth-1 that starts at or before the child's first row.
        parents[children] = candidates[np.searchsorted(node_rows[candidates], node_rows[children], side="right") - 1]
    return tokens, parents, node_counts.astype(np.int64)


def node_paths(tokens: np.ndarray, parents: np.ndarray) -> list[tuple[int, ...]]:
    """Every node's tokens from the root down (parents before children)."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(tokens.tolist(), parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths


def cut_to_choices(tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray, choices: int) -> np.ndarray:
    """REST's ``cut_to_choices`` (DraftRetriever lib.rs): each node stands for its root path, weighing the
    number of distinct tokens on it; paths are dropped heaviest first while the summed weight exceeds
    ``choices``, and the kept paths' prefixes are put back (``get_draft_choices``). Returns the kept node
    indices, ascending. The draft is therefore far smaller than ``choices`` nodes: a 10-deep chain alone
    weighs 55. Among equal weights DraftRetriever's order is a hash set's (it varies between processes);
    here the less frequent, then the later node goes first, so the cut is reproducible.

    Example: a chain of 3 distinct tokens (weights 1, 2, 3) and a sibling leaf (1), choices=4: total 7; drop
    the depth-3 node (7 -> 4), then stop: nodes 0, 1 and the leaf stay.
    """
    paths = node_paths(tokens, parents)
    weights = np.array([len(set(path)) for path in paths], dtype=np.int64)
    order = np.lexsort((-np.arange(len(paths)), counts, -weights))
    total = int(weights.sum())
    dropped = set()
    for node in order.tolist():
        if total <= choices:
            break
        total -= int(weights[node])
        dropped.add(node)
    kept = np.zeros(len(paths), dtype=bool)
    for node in range(len(paths)):
        if node not in dropped:
            while node >= 0 and not kept[node]:  # the path and all its prefixes
                kept[node] = True
                node = int(parents[node])
    return np.flatnonzero(kept)


def retrieved_tree(datastore, lo: int, hi: int, offset: int, continuation_length: int = 10, max_matches: int = 5000,
                   sampling: str = "first", choices: int = 64, cut: bool = True):
    """DraftRetriever's ``search`` on the suffix-array ranks [lo, hi) of a query of ``offset`` tokens, as REST
    and HD's statistics database call it: the ``continuation_length`` tokens after each of the first
    ``max_matches`` matches, the ``choices`` most frequent prefixes, then ``cut_to_choices``. Returns (tokens,
    parents, counts) of the tree (parents before children), empty when nothing matched."""
    empty = np.empty(0, dtype=np.int64)
    if hi <= lo:
        return empty, empty, empty
    matrix = datastore.continuation_matrix(lo, hi, offset, continuation_length, max_matches, sampling)
    tokens, parents, counts = frequent_prefix_trie(matrix, choices)
    if cut and tokens.size:
        keep = cut_to_choices(tokens, parents, counts, choices)
        tokens, parents, counts = tokens[keep], reindex_parents(parents, keep), counts[keep]
    return tokens, parents, counts


class RetrievalDrafter(Drafter):
    """REST as Spec-Bench ran it (model/rest, DraftRetriever): the longest context suffix of 16 down to 2
    tokens, its first 5,000 matches in suffix-array order, 10-token continuations, the 64 most frequent
    prefixes cut by ``cut_to_choices``, and a one-token dummy draft (id 100) when nothing matches.
    docs/fidelity.md traces every setting."""

    def __init__(
        self,
        name: str = "rest",
        datastore: str = "auto",
        corpus: str = "python-docs",
        max_suffix_length: int = 16,
        min_suffix_length: int = 2,
        continuation_length: int = 10,
        max_matches: int = 5000,
        match_sampling: str = "first",
        num_draft: int = 64,
        cut_to_choices: bool = True,
        no_match_token: int | None = 100,
        cache_dir: str | None = None,
    ):
        require_positive(max_suffix_length=max_suffix_length, min_suffix_length=min_suffix_length,
                         continuation_length=continuation_length, max_matches=max_matches, num_draft=num_draft)
        require_flag(cut_to_choices=cut_to_choices)
        if min_suffix_length > max_suffix_length:
            raise SpecbenchError(f"drafter.min_suffix_length ({min_suffix_length}) exceeds max_suffix_length ({max_suffix_length})")
        if match_sampling not in MATCH_SAMPLING:
            raise SpecbenchError(f"drafter.match_sampling must be one of {', '.join(MATCH_SAMPLING)}, got {match_sampling!r}")
        self.name = name
        self.datastore_path = datastore
        self.corpus = corpus
        self.max_suffix_length = max_suffix_length
        self.min_suffix_length = min_suffix_length
        self.continuation_length = continuation_length
        self.max_matches = max_matches
        self.match_sampling = match_sampling
        self.num_draft = num_draft
        self.cut = cut_to_choices
        self.no_match_token = check_token_id("no_match_token", no_match_token)
        self.cache_dir = cache_dir
        self.datastore = None

    def _cached(self, target) -> dict:
        from specbench.artefacts.base import prepare_command
        from specbench.artefacts.statistics_datastore import StatisticsDatastore

        if self.datastore_path != "auto":
            return {}
        return {"datastore": StatisticsDatastore(target, self.corpus, self.cache_dir, "datastore",
                                                 prepare_command(target.name, self.name))}

    def artefacts(self, target) -> list:
        return list(self._cached(target).values())

    def prepare(self, target, sampling=None) -> None:
        from specbench.artefacts.base import fetch
        from specbench.artefacts.statistics_datastore import given_datastore

        require_in_vocabulary("no_match_token", self.no_match_token, target)
        if self.datastore_path != "auto":
            self.datastore = given_datastore(target, self.datastore_path)
        else:
            self.datastore = fetch(self._cached(target))["datastore"]

    def propose(self, context_ids: np.ndarray) -> Draft:
        length, lo, hi = self.datastore.longest_suffix_match(context_ids, self.max_suffix_length, self.min_suffix_length)
        tokens, parents, counts = retrieved_tree(self.datastore, lo, hi, length, self.continuation_length,
                                                 self.max_matches, self.match_sampling, self.num_draft, self.cut)
        if tokens.size == 0:
            return no_match_draft(self.no_match_token)
        # counts rank the nodes where a tree is cut to its best chain: the most frequent continuation
        return Draft(torch.from_numpy(tokens), torch.from_numpy(parents), scores=torch.from_numpy(counts))
