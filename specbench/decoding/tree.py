"""Pure functions over draft trees.

A draft of n tokens is a forest under the *root*, the last committed token, which the target has not
seen yet. Verification feeds root + draft in one forward pass; the indices below are "node" indices into
that pass: node 0 is the root and node i (1..n) is draft token i-1. ``parents[i]`` is the node index of
draft token i's parent in the *draft* numbering, -1 meaning the root; parents always precede children.

Worked example: draft tokens [a, b, c, d] with parents [-1, 0, -1, 2] are two branches root->a->b and
root->c->d. As nodes: 0=root, 1=a, 2=b, 3=c, 4=d; node_parents = [-1, 0, 1, 0, 3]; depths = [0, 1, 2, 1, 2].
"""

from __future__ import annotations

import numpy as np


def chain_parents(n: int) -> np.ndarray:
    """Parents of an n-token chain in draft numbering: [-1, 0, 1, ..., n-2]."""
    return np.arange(-1, n - 1, dtype=np.int64)


def node_parents(draft_parents: np.ndarray) -> np.ndarray:
    """Parents in node numbering (root = node 0, its parent -1), from parents in draft numbering."""
    draft_parents = np.asarray(draft_parents, dtype=np.int64)
    assert draft_parents.ndim == 1
    if draft_parents.size and np.any(draft_parents >= np.arange(draft_parents.size)):
        raise ValueError("draft parents must precede their children (parents[i] < i)")
    return np.concatenate(([-1], draft_parents + 1))


def node_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of every node (root = 0) from node-numbered parents."""
    depths = np.zeros(parents.size, dtype=np.int64)
    for node in range(1, parents.size):
        depths[node] = depths[parents[node]] + 1
    return depths


def is_chain(parents: np.ndarray) -> bool:
    """True when node-numbered parents describe a single chain root -> 1 -> 2 -> ..."""
    return bool(np.array_equal(parents, np.arange(-1, parents.size - 1)))


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """[n_nodes, n_nodes] bool: entry (i, j) is True when node j is node i itself or one of its ancestors.

    This is the block of the attention mask among the verified nodes: each node sees its own path only.
    """
    size = parents.size
    visible = np.zeros((size, size), dtype=bool)
    for node in range(size):
        parent = parents[node]
        if parent >= 0:
            visible[node] = visible[parent]
        visible[node, node] = True
    return visible


def best_chain(draft_parents: np.ndarray, scores: np.ndarray | None = None,
               candidates: np.ndarray | None = None) -> np.ndarray:
    """The draft indices of a tree's best chain, shallowest first: from the root, at each node its child with the
    highest score (``scores``, higher is better; among equal scores, and without scores, the child listed first,
    as drafters list their best first), never through a node that is not a candidate (``candidates`` False). What a serving
    engine that verifies one chain per request runs of a tree drafter (``engines.vllm_proposer``).

    Example: parents [-1, 0, -1, 2, 2] (root->a->b, root->c->{d, e}): the chain is [0, 1] without scores; with
    scores [1, 1, 3, 1, 2] it is [2, 4].
    """
    parents = np.asarray(draft_parents, dtype=np.int64)
    if parents.size and np.any(parents >= np.arange(parents.size)):
        raise ValueError("draft parents must precede their children (parents[i] < i)")
    allowed = np.ones(parents.size, dtype=bool) if candidates is None else np.asarray(candidates, dtype=bool)
    ranking = np.zeros(parents.size) if scores is None else np.asarray(scores, dtype=np.float64)
    chain, at = [], -1
    while True:
        children = np.flatnonzero((parents == at) & allowed)
        if children.size == 0:
            return np.asarray(chain, dtype=np.int64)
        at = int(children[np.argmax(ranking[children])])  # argmax keeps the first of equal scores
        chain.append(at)


def select_nodes(
    draft_parents: np.ndarray, candidates: np.ndarray | None, max_depth: int, max_nodes: int,
    depths: np.ndarray | None = None,
) -> np.ndarray:
    """Indices (draft numbering) of the nodes to verify: candidates no deeper than ``max_depth`` (deeper
    ones could only yield more tokens than the budget allows), every non-candidate, and nothing whose parent
    was dropped; then the first ``max_nodes`` of those. Parents precede children, so any prefix of a valid
    order stays a valid tree. ``depths``: the draft nodes' depths (root children = 1), when the caller has them."""
    if depths is None:
        depths = node_depths(node_parents(draft_parents))[1:]
    keep = depths <= max_depth
    if candidates is not None:
        keep |= ~candidates
    for node, parent in enumerate(draft_parents.tolist()):
        if parent >= 0 and not keep[parent]:
            keep[node] = False
    return np.flatnonzero(keep)[:max_nodes]


def trie_from_sequences(sequences, labels=None) -> tuple[np.ndarray, np.ndarray, list]:
    """Merge token sequences that share prefixes into one tree: (tokens [n], parents [n] in draft numbering,
    label of each node). A node's label is that of the first sequence that created it.

    Example: [1 2 3] from "a" and [1 2 4], [5] from "b" -> tokens [1 2 3 4 5], parents [-1 0 1 1 -1],
    labels [a a a b b].
    """
    index: dict[tuple[int, int], int] = {}
    tokens, parents, node_labels = [], [], []
    for sequence, label in zip(sequences, labels if labels is not None else [None] * len(sequences)):
        node = -1
        for token in sequence:
            key = (node, int(token))
            child = index.get(key)
            if child is None:
                child = len(tokens)
                index[key] = child
                tokens.append(int(token))
                parents.append(node)
                node_labels.append(label)
            node = child
    return np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64), node_labels


def chains(sequences, labels=None, accept_last: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """Sequences laid out as separate chains from the root, as lade and HD verify their guesses (no shared
    prefixes): (tokens [n], parents [n], candidates [n], labels [n]). With ``accept_last=False`` the last
    token of every sequence is verified but never accepted (lade's match loop stops one short).

    Example: [5 6] and [5 7] -> tokens [5 6 5 7], parents [-1 0 -1 2].
    """
    tokens, parents, candidates, node_labels = [], [], [], []
    for index, sequence in enumerate(sequences):
        for position, token in enumerate(sequence):
            parents.append(-1 if position == 0 else len(tokens) - 1)
            tokens.append(int(token))
            candidates.append(accept_last or position < len(sequence) - 1)
            node_labels.append(None if labels is None else labels[index])
    return (np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64), np.array(candidates, dtype=bool),
            node_labels)


def guess_layout(sequences, labels, merge: bool, accept_last: bool):
    """(tokens, parents, candidates, labels) of verified guesses: separate chains, or one trie with ``merge``
    (shared prefixes verified once). ``accept_last=False``: a sequence's last token is never accepted."""
    if not merge:
        return chains(sequences, labels, accept_last)
    tokens, parents, node_labels = trie_from_sequences(sequences, labels)
    candidates = np.ones(tokens.size, dtype=bool)
    if not accept_last and tokens.size:
        depth = np.zeros(tokens.size, dtype=np.int64)
        for node, parent in enumerate(parents.tolist()):  # parents come before their children
            depth[node] = 1 if parent < 0 else depth[parent] + 1
        candidates = depth < max(len(sequence) for sequence in sequences)
    return tokens, parents, candidates, node_labels


def reindex_parents(draft_parents: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Parents (draft numbering) of the kept nodes, renumbered to positions within ``keep``.

    ``keep`` must be closed under taking parents (every kept node's parent is kept or is the root).
    """
    new_index = np.full(draft_parents.size, -1, dtype=np.int64)
    new_index[keep] = np.arange(keep.size)
    old_parents = draft_parents[keep]
    renumbered = np.where(old_parents >= 0, new_index[np.maximum(old_parents, 0)], -1)
    if np.any((old_parents >= 0) & (renumbered < 0)):
        raise ValueError("kept nodes must include their parents")
    return renumbered


def greedy_accepted_path(
    parents: np.ndarray, node_tokens: np.ndarray, target_tokens: np.ndarray, candidates: np.ndarray | None = None
) -> list[int]:
    """The longest root-to-node path whose tokens are the target's greedy choices, as node indices
    (root excluded).

    parents, node_tokens, target_tokens: [n_nodes] in node numbering. ``target_tokens[i]`` is the target's
    argmax after node i, so node j is right when ``node_tokens[j] == target_tokens[parents[j]]``.
    candidates: [n_nodes] bool, False for nodes that may not be accepted (padding, lookahead windows).
    Ties between equally deep paths (duplicate branches) go to the lowest node index.

    Example: parents [-1, 0, 1, 0], node tokens [r, 5, 6, 7], target argmax [5, 6, 9, 1]: node 1 (5) and
    node 2 (6) match, node 3 (7 != 5) does not, so the path is [1, 2] and the bonus token is
    target_tokens[2] = 9.
    """
    n_nodes = parents.size
    on_path = np.zeros(n_nodes, dtype=bool)
    on_path[0] = True
    best, best_depth = 0, 0
    depth = np.zeros(n_nodes, dtype=np.int64)
    for node in range(1, n_nodes):
        parent = parents[node]
        if not on_path[parent] or (candidates is not None and not candidates[node]):
            continue
        if node_tokens[node] == target_tokens[parent]:
            on_path[node] = True
            depth[node] = depth[parent] + 1
            if depth[node] > best_depth:
                best, best_depth = node, depth[node]
    path = []
    while best > 0:
        path.append(int(best))
        best = parents[best]
    return path[::-1]


class TreeTemplate:
    """A draft-tree template: per node its parent (draft numbering, -1 = the root) and its rank among its
    siblings, plus the nodes grouped by depth so a draft is filled one level at a time."""

    def __init__(self, paths: list[tuple[int, ...]]):
        index = {path: i for i, path in enumerate(paths)}
        if len(index) != len(paths):
            raise ValueError("a tree template lists a node twice")
        parents = []
        for i, path in enumerate(paths):
            parent = index.get(path[:-1], -1) if len(path) > 1 else -1
            if len(path) > 1 and not 0 <= parent < i:
                raise ValueError(f"template node {list(path)} comes before its parent or has none")
            parents.append(parent)
        self.parents = np.array(parents, dtype=np.int64)
        self.ranks = np.array([path[-1] for path in paths], dtype=np.int64)
        depths = np.array([len(path) for path in paths], dtype=np.int64)
        self.levels = [np.flatnonzero(depths == depth) for depth in range(1, int(depths.max()) + 1)]
        self.width = int(self.ranks.max()) + 1

    def __len__(self) -> int:
        return int(self.parents.size)

    def expand(self, root_token: int, successors: np.ndarray) -> np.ndarray:
        """The template's tokens under ``root_token``: each node is its parent token's successor at its rank.

        Example: successors rows 5 -> [7, 8], 7 -> [9, 0], template [(0,), (1,), (0, 0)], root 5 -> [7, 8, 9].
        """
        tokens = np.empty(len(self), dtype=np.int64)
        for level in self.levels:
            parents = self.parents[level]
            parent_tokens = np.where(parents < 0, root_token, tokens[np.maximum(parents, 0)])
            tokens[level] = successors[parent_tokens, self.ranks[level]]
        return tokens
