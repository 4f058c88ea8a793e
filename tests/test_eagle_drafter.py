"""The EAGLE family's drafting, pinned against plain re-statements of the authors' algorithms.

A scripted head (its output a fixed function of the parent's output and the token, its logits a fixed matrix)
makes the trees computable by hand: EAGLE-1's static tree is each path's rank-th best token under its parent,
EAGLE-2's dynamic tree the best total_tokens - 1 candidates of a frontier of top_k expanded depth times.
"""

import heapq

import numpy as np
import pytest
import torch

from specbench.config import compose
from specbench.decoding.contract import StepOutcome, Draft
from specbench.drafters.eagle import STATIC_TREES, Eagle, StaticTreePlan, select_dynamic_tree
from specbench.errors import SpecbenchError

WIDTH, VOCAB = 8, 40

# EAGLE-1's static tree restated from its source, not from specbench's copy: Spec-Bench model/eagle/choices.py:1-3
# @fd2c1cd, the same list as SafeAILab/EAGLE eagle/model/choices.py:1-3 @cb7e084 (paths of sibling ranks).
MC_SIM_7B_63 = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
                [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
                [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


class ScriptedHead(torch.nn.Module):
    """out = tanh(hidden + E[token] + R[position]) for tree nodes (hidden = the parent's out; R, a vector per rotary
    position, makes the tree depend on the position each node is fed at, as a real head's rotary embedding does),
    hidden @ P for target features; logits = out @ W. It counts the cache like a real head, and records what it
    was fed."""

    def __init__(self, kind="eagle", seed=0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.E = torch.randn(VOCAB, WIDTH, generator=generator)
        self.P = torch.randn(3 * WIDTH, WIDTH, generator=generator) * 0.3
        self.W = torch.randn(WIDTH, VOCAB, generator=generator) * 2
        self.R = torch.randn(64, WIDTH, generator=generator)
        self.config = type("Config", (), {"kind": kind})()
        self.fed = []

    def node_out(self, parent_out, token, position):
        return torch.tanh(parent_out + self.E[token] + self.R[position])

    def new_cache(self, capacity):
        class Cache:
            length = 0

            def truncate(self, length):
                self.length = length
        return Cache()

    def forward(self, token_ids, hidden, positions, cache, visible, from_target):
        n = token_ids.numel()
        if visible is not None:
            assert visible.shape == (n, cache.length + n)
        self.fed.append((from_target, n, positions.tolist()))
        cache.length += n
        if from_target:
            return hidden @ self.P
        return self.node_out(hidden, token_ids, positions)

    def draft_logits(self, out):
        return out @ self.W

    def to_target_ids(self, draft_ids):
        return draft_ids

    def resolve_feature_layers(self, num_layers):
        return (2, num_layers // 2, num_layers - 3)


def drafter_with(head, **settings):
    drafter = Eagle(name="test", kind=head.config.kind, head={"path": "unused"}, **settings)
    drafter.head = head
    drafter.hidden_state_layers = (2, 3, 4)
    drafter.device = torch.device("cpu")
    if drafter.static is not None:
        drafter._static = drafter.static.on(drafter.device)
    return drafter


def first_draft(drafter, prompt, first_token):
    """The draft after the prefill: every prompt position's features paired with the next token."""
    drafter.begin(np.array(prompt))
    features = torch.randn(3, len(prompt), WIDTH, generator=torch.Generator().manual_seed(1))
    drafter.accept(np.array([first_token]), StepOutcome(step=0, draft=Draft.empty(), target_tokens=np.array([0]),
                                                        accepted_nodes=(), hidden_states=features))
    root_out = features.permute(1, 0, 2).reshape(len(prompt), -1)[-1] @ drafter.head.P
    return drafter.propose(np.array(prompt + [first_token])), root_out


def paths_of(draft):
    """The set of token paths from the root of a draft tree, checking parents precede children."""
    parents, tokens = draft.parents.tolist(), draft.token_ids.tolist()
    paths = []
    for node, parent in enumerate(parents):
        assert parent < node
        paths.append((paths[parent] if parent >= 0 else ()) + (tokens[node],))
    assert len(set(paths)) == len(paths)
    return set(paths)


def log_probs(head, out):
    return torch.log_softmax(head.draft_logits(out), dim=-1)


def reference_static_tree(head, root_out, rank_paths, stable):
    """EAGLE-1: the node at rank path (r1, ..., rd) is the rd-th best token after its parent's output; it is fed
    to the head at position stable + d - 1, the positions a depth's nodes share (the first after the ``stable``
    pairs the head's cache holds: model/eagle/cnets.py:762-845 @fd2c1cd, tree_position_ids)."""
    tokens, outs = {(): None}, {(): root_out}
    for path in sorted(rank_paths, key=lambda p: (len(p), p)):
        parent = path[:-1]
        token = int(torch.argsort(log_probs(head, outs[parent]), descending=True, stable=True)[path[-1]])
        tokens[path] = token
        outs[path] = head.node_out(outs[parent], torch.tensor(token), stable + len(path) - 1)
    return {tuple(tokens[path[:i]] for i in range(1, len(path) + 1)) for path in rank_paths}


def reference_dynamic_tree(head, root_out, total_tokens, depth, top_k, stable):
    """EAGLE-2 (model/eagle2/cnets.py topK_genrate): candidates are the root's top_k and, for each of depth
    rounds, all top_k children of the top_k frontier nodes of highest joint log-probability. Round i feeds its
    frontier at position len_posi + i, len_posi the ``stable`` pairs the head has read (:676, 706, 710)."""
    def children(path, out, score):
        values = log_probs(head, out)
        best = torch.argsort(values, descending=True, stable=True)[:top_k]
        return [(score + float(values[t]), path + (int(t),), out) for t in best]

    candidates = children((), root_out, 0.0)
    frontier = candidates
    for level in range(depth):
        grown = []
        for score, path, parent_out in frontier:
            out = head.node_out(parent_out, torch.tensor(path[-1]), stable + level)
            grown += children(path, out, score)
        candidates += grown
        frontier = heapq.nlargest(top_k, grown, key=lambda c: c[0])
    return {path for _, path, _ in heapq.nlargest(total_tokens - 1, candidates, key=lambda c: c[0])}


def test_mc_sim_7b_63_is_the_published_tree_path_by_path():
    # In the source's order: a swapped path is another numbering of the draft.
    assert STATIC_TREES["mc_sim_7b_63"] == [tuple(path) for path in MC_SIM_7B_63]


def test_mc_sim_7b_63_has_25_nodes_five_deep_and_feeds_only_nodes_with_children():
    plan = StaticTreePlan([tuple(path) for path in MC_SIM_7B_63])
    assert len(plan) == 25
    assert [level.size for level in plan.template.levels] == [4, 8, 8, 3, 2]
    assert [fed.size for fed in plan.fed] == [4, 4, 1, 1]  # 1 + 4 head passes per step, as EAGLE-1's buffers


def test_the_static_tree_is_each_paths_ranked_token_under_its_parent():
    head = ScriptedHead()
    draft, root_out = first_draft(drafter_with(head, tree="static"), [5, 6, 7, 8], 9)
    assert set(paths_of(draft)) == reference_static_tree(head, root_out, [tuple(path) for path in MC_SIM_7B_63], 4)
    # One pass over the 4 prompt pairs, then one per depth with children, each at the depth's position.
    assert head.fed == [(True, 4, [0, 1, 2, 3]), (False, 4, [4] * 4), (False, 4, [5] * 4), (False, 1, [6]),
                        (False, 1, [7])]


@pytest.mark.parametrize("total_tokens,depth,top_k", [(60, 5, 10), (12, 3, 4), (2, 1, 1), (31, 2, 5)])
def test_the_dynamic_tree_is_eagle2s_reranked_expansion(total_tokens, depth, top_k):
    head = ScriptedHead(seed=total_tokens)
    drafter = drafter_with(head, tree="dynamic", total_tokens=total_tokens, depth=depth, top_k=top_k)
    draft, root_out = first_draft(drafter, [5, 6, 7], 9)
    assert len(draft) == total_tokens - 1
    assert set(paths_of(draft)) == reference_dynamic_tree(head, root_out, total_tokens, depth, top_k, 3)
    # The 3 prompt pairs at positions 0..2, then round i's frontier all at position 3 + i (EAGLE-2's len_posi + i).
    assert [(fed[1], fed[2]) for fed in head.fed] == [(3, [0, 1, 2])] + [(top_k, [3 + i] * top_k)
                                                                        for i in range(depth)]


def test_the_tree_is_forgotten_and_the_next_step_reads_the_targets_features_for_what_it_settled():
    head = ScriptedHead()
    drafter = drafter_with(head, tree="dynamic", total_tokens=20, depth=3, top_k=4)
    draft, _ = first_draft(drafter, [5, 6, 7], 9)
    assert drafter.cache.length == 3  # the stable pairs only
    states = torch.randn(3, 3, WIDTH)  # root + two accepted nodes
    drafter.accept(np.array([11, 12, 13]), StepOutcome(step=1, draft=draft, target_tokens=np.zeros(20, int),
                                                        accepted_nodes=(0, 1), hidden_states=states))
    head.fed.clear()
    drafter.propose(np.array([5, 6, 7, 9, 11, 12, 13]))
    assert head.fed[0] == (True, 3, [3, 4, 5])
    assert drafter.cache.length == 6


def test_reranking_keeps_parents_and_renumbers_them():
    kept, parents = select_dynamic_tree(torch.tensor([-0.1, -2.0, -0.5, -3.0]), torch.tensor([-1, -1, 0, 2]), 2)
    assert kept.tolist() == [0, 2] and parents.tolist() == [-1, 0]
    # A child tied with its parent at the cut: the parent (earlier candidate) is kept first.
    kept, parents = select_dynamic_tree(torch.tensor([-1.0, -0.2, -1.0]), torch.tensor([-1, -1, 0]), 2)
    assert kept.tolist() == [0, 1] and parents.tolist() == [-1, -1]


def test_the_leaderboards_settings_are_the_configs():
    eagle = compose(["drafter=eagle"]).drafter
    eagle2 = compose(["drafter=eagle2"]).drafter
    eagle3 = compose(["drafter=eagle3"]).drafter
    assert (eagle.kind, eagle.tree, eagle.static_tree) == ("eagle", "static", "mc_sim_7b_63")  # inference_eagle.py
    for node in (eagle2, eagle3):  # inference_eagle2.py / inference_eagle3.py:65-82
        assert (node.tree, node.total_tokens, node.depth, node.top_k) == ("dynamic", 60, 5, 10)
    assert (eagle2.kind, eagle3.kind) == ("eagle", "eagle3")
    # EAGLE-2 drafts with EAGLE-1's checkpoint (eval.sh:19-20).
    assert eagle2.heads_by_model["vicuna-7b"] == eagle.heads_by_model["vicuna-7b"]
    assert eagle3.heads_by_model["vicuna-13b"]["hub_id"] == "yuhuili/EAGLE3-Vicuna1.3-13B"
    assert "vicuna-7b" not in eagle3.heads_by_model  # no EAGLE-3 head for Vicuna-7B is published


def test_bad_settings_and_unknown_targets_are_one_line_errors(tiny):
    with pytest.raises(SpecbenchError, match="drafter.tree='beam'.*static, dynamic"):
        Eagle(tree="beam")
    with pytest.raises(SpecbenchError, match="total_tokens=200 must be between 2 and 111"):
        Eagle(tree="dynamic", total_tokens=200, depth=1, top_k=10)
    with pytest.raises(SpecbenchError, match="knows no eagle3 head for model tiny-random.*train_head.py --model tiny-random --kind eagle3"):
        Eagle(kind="eagle3", tree="dynamic", heads_by_model={"vicuna-13b": {"hub_id": "x"}}).prepare(tiny)
