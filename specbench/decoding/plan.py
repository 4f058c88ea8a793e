"""What one verification pass feeds the target, and the one place that maps between its numberings.

Three numberings meet in a step:

* *draft* index: position in the drafter's ``Draft`` (0 .. len(draft) - 1);
* *kept* index: position among the draft tokens that are verified, after the draft is cut to the remaining
  token budget, to ``run.max_draft_tokens`` and by the draft budget;
* *node* index: position in the verification pass: node 0 is the root (the last committed token, which the
  target has not seen yet), node k (k >= 1) is kept token k - 1.

Worked example: a draft [a, b, c, d, e] with parents [-1, 0, 1, -1, 3] (two branches a-b-c and d-e), of which
only one token per branch may be verified (depth 1). Kept: draft indices [0, 3] (a and d). Nodes: 0 = root,
1 = a, 2 = d, with node parents [-1, 0, 0]. So ``to_draft(2) == 3``, and ``scatter([x0, x1, x2])`` gives
[x0, x1, -1, -1, x2, -1]: index 0 for the root, index i + 1 for draft token i, -1 where nothing was verified.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from specbench.decoding.budget import DraftBudget
from specbench.decoding.contract import Draft
from specbench.decoding.target import VerifyInputs
from specbench.decoding.tree import (
    ancestor_matrix,
    chain_parents,
    node_depths,
    node_parents,
    reindex_parents,
    select_nodes,
)


@dataclass(frozen=True)
class VerifyPlan:
    """The nodes of one verification pass.

    draft_indices: [n_kept] draft index of each verified draft token (kept numbering).
    node_tokens:   [n_nodes] the root's token, then the kept draft tokens.
    parents:       [n_nodes] node-numbered parents (root: -1).
    candidates:    [n_nodes] bool, False for nodes that may never be accepted (the root counts as True);
                   None when every node may be.
    depths:        [n_nodes] depth of every node (root: 0), the position offset each node is verified at.
    kinds:         the draft budget's kind of every kept token (kept numbering), None without a budget.
    draft_size:    len(draft), the size of the drafter's numbering.
    """

    draft_indices: np.ndarray
    node_tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    candidates: np.ndarray | None
    kinds: list[tuple] | None
    draft_size: int

    @property
    def n_nodes(self) -> int:
        return int(self.parents.size)

    @property
    def draft_parents(self) -> np.ndarray:
        """Parents of the kept tokens in kept numbering (-1 = the root)."""
        return self.parents[1:] - 1

    def to_draft(self, node: int) -> int:
        """Draft index of node ``node`` (>= 1)."""
        return int(self.draft_indices[node - 1])

    def scatter(self, per_node: np.ndarray, fill: int = -1) -> np.ndarray:
        """[n_nodes, ...] values per node -> [1 + draft_size, ...] values in the drafter's numbering shifted by
        one (index 0 = root, i + 1 = draft token i), ``fill`` where a draft token was not verified."""
        if self.draft_indices.size == self.draft_size:
            return per_node
        out = np.full((1 + self.draft_size, *per_node.shape[1:]), fill, dtype=per_node.dtype)
        out[0] = per_node[0]
        out[self.draft_indices + 1] = per_node[1:]
        return out

    def candidate_tokens(self) -> int:
        """Verified draft tokens that could be accepted (the root and non-candidates excluded)."""
        return self.n_nodes - 1 if self.candidates is None else int(self.candidates[1:].sum())

    def candidate_depth(self) -> int:
        """Length of the longest path of candidate draft tokens (a chain's length); 0 for an empty draft."""
        if self.n_nodes == 1:
            return 0
        return int(self.depths.max() if self.candidates is None else self.depths[self.candidates].max())


def plan_verification(draft: Draft, root_token: int, max_depth: int, max_nodes: int,
                      budget: DraftBudget | None = None, drafter_name: str = "") -> VerifyPlan:
    """The part of ``draft`` to verify after ``root_token``: candidate paths cut to ``max_depth`` tokens (the
    rest of the token budget), the draft to ``max_nodes`` nodes, and then, with a draft budget, to the nodes
    worth their verification time."""
    tokens = draft.token_ids.numpy()
    if budget is None and draft.parents is None and draft.candidates is None:
        count = min(tokens.size, max_depth, max_nodes)
        return VerifyPlan(np.arange(count), np.concatenate(([root_token], tokens[:count])),
                          node_parents(chain_parents(count)), np.arange(count + 1), None, None, tokens.size)
    parents = draft.parents.numpy() if draft.parents is not None else chain_parents(tokens.size)
    candidates = draft.candidates.numpy() if draft.candidates is not None else None
    depths = node_depths(node_parents(parents))[1:]  # draft numbering; computed once, used three times
    kept = select_nodes(parents, candidates, max_depth, max_nodes, depths)
    kinds = None
    if budget is not None and kept.size:
        all_kinds = budget.kinds(parents, depths, draft.sources)
        chosen = budget.select(drafter_name, reindex_parents(parents, kept), [all_kinds[i] for i in kept],
                               None if candidates is None else candidates[kept])
        kept = kept[chosen]
        kinds = [all_kinds[i] for i in kept]
    kept_parents = reindex_parents(parents, kept) if kept.size < tokens.size else parents
    node_candidates = None if candidates is None else np.concatenate(([True], candidates[kept]))
    # A kept node's parent is kept too, so its depth is the same in the cut tree.
    return VerifyPlan(kept, np.concatenate(([root_token], tokens[kept])), node_parents(kept_parents),
                      np.concatenate(([0], depths[kept])), node_candidates, kinds, tokens.size)


def verification_inputs(plan: VerifyPlan, start: int, padded_size: int) -> VerifyInputs:
    """The host side of a pass over the plan's nodes written from cache position ``start``, padded to
    ``padded_size`` (q) tokens with copies of the root that nothing attends to and whose outputs are dropped:
    token ids [q], position ids [q] and the [q, q] block of the attention mask that the nodes add (a node sees
    its ancestors and itself; every cached position is visible to all)."""
    n_nodes = plan.n_nodes
    assert padded_size >= n_nodes
    tokens = np.empty(padded_size, dtype=np.int64)
    tokens[:n_nodes] = plan.node_tokens
    tokens[n_nodes:] = plan.node_tokens[0]
    positions = np.full(padded_size, start, dtype=np.int64)
    positions[:n_nodes] += plan.depths
    visible = np.zeros((padded_size, padded_size), dtype=bool)
    visible[:n_nodes, :n_nodes] = ancestor_matrix(plan.parents)
    visible[np.arange(n_nodes, padded_size), np.arange(n_nodes, padded_size)] = True
    return VerifyInputs(tokens=tokens, positions=positions, visible=visible, start=start)
