"""Graph-Structured Speculative Decoding (drafter=gsd): its graph (merging, leaves, siblings), the unfolding into a
tree and its settings, each pinned against the original (gzhch/gsd @9ab6cf6, utils/graph_decoding.py; docs/
fidelity.md). Its losslessness is the contract tests' (every drafter config, every Target)."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import refusal

from specbench.config import compose
from specbench.decoding.loop import Decoder
from specbench.drafters.gsd import GraphDrafter, TokenGraph
from specbench.testing import configured_drafter, greedy_reference


def _graph():
    """0 root(1); 1 a(5) under root; 2 b(7) under a; 3 c(9) under b; 4 d(7) under root; 5 e(5) under d."""
    graph = TokenGraph(1)
    a = graph.add(5, 0, False)
    b = graph.add(7, a, False)
    graph.add(9, b, False)
    d = graph.add(7, 0, False)
    graph.add(5, d, False)
    return graph


def test_merging_finds_the_first_node_off_the_own_path_after_as_many_equal_tokens():
    # graph_decoding.py:81-111: the same token after repeat_threshold equal tokens, any depth, off the candidate's own
    # path, the first in creation order; -1: never
    graph = _graph()
    assert graph.repeated(9, 4, 0) == 3  # a 9 under d: c, anywhere
    assert graph.repeated(9, 4, 1) == 3  # c follows 7 (b), as the candidate follows 7 (d)
    assert graph.repeated(9, 4, 2) is None  # ... but b follows 5 (a) and d follows the root (1)
    assert graph.repeated(9, 5, 1) is None  # the candidate follows 5 (e), c follows 7
    assert graph.repeated(5, 4, 0) == 1  # a, the first 5 made
    assert graph.repeated(7, 5, 0) == 2  # d holds 7 too but is on the candidate's own path
    assert graph.repeated(7, 0, 1) == 4  # a 7 under the root: d follows the root's 1, b follows 5
    assert graph.repeated(7, 0, 2) is None  # the chains reach the root's parent (-1): no match
    assert graph.repeated(1, 3, 0) is None  # the root is on every path
    assert graph.repeated(5, 4, -1) is None


def test_the_graph_unfolds_breadth_first_children_then_the_pseudo_child_until_the_cap():
    graph = _graph()
    graph.nodes[3].pseudo_child = 4  # c -> d: d's subtree reused after c
    order, parents = graph.unfold(100)
    assert order == [0, 1, 4, 2, 5, 3, 4, 5] and parents == [-1, 0, 0, 1, 2, 3, 5, 6]
    # graph_decoding.py:1060-1068: the cap is checked before a node is expanded, so the last expansion may pass it
    order, _ = graph.unfold(2)
    assert order == [0, 1, 4]


def test_siblings_below_the_fraction_are_dropped_and_unlikely_nodes_are_leaves(tiny):
    drafter = GraphDrafter(tree_decoding=4, sibling_threshold=0.3, prob_threshold=0.2, repeat_threshold=-1)
    graph = TokenGraph(1)
    # probabilities 0.5, 0.25, 0.14, 0.11 (after softmax of these logits): 0.14 < 0.3 x 0.5 is dropped
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.14, 0.11] + [1e-9] * 4]))
    added, all_leaves = drafter._grow(graph, [0], logits)
    assert [graph.nodes[node].token for node in added] == [0, 1]  # 0.14 < 0.3 x 0.5: dropped
    assert [graph.nodes[node].leaf for node in added] == [False, False] and not all_leaves
    graph.nodes[1].leaf = True  # a leaf's children are leaves (graph_decoding.py:1010-1011), and still added
    added, all_leaves = drafter._grow(graph, [1], logits)
    assert len(added) == 2 and all_leaves


def test_the_config_restates_the_originals_grid_and_uses_spss_drafts():
    config = compose(["drafter=gsd"]).drafter
    # gsd.py:261-264 grid; graph_decoding.py:893 MAX_TOKEN, :1060 max_token 100
    assert (config.tree_decoding, config.repeat_threshold, config.prob_threshold, config.sibling_threshold) == (4, 0,
                                                                                                               0.3, 0.1)
    assert (config.max_tree_tokens, config.max_nodes, config.max_step_draft) == (100, 10000, 12)
    assert config.drafts_by_family == compose(["drafter=sps"]).drafter.drafts_by_family
    import yaml

    grid = yaml.safe_load(Path("conf/experiment/gsd_grid.yaml").read_text())["hydra"]["sweeper"]["params"]
    assert grid == {"drafter.tree_decoding": "4", "drafter.repeat_threshold": "0,1,-1",
                    "drafter.prob_threshold": "0.3,0.4", "drafter.sibling_threshold": "0.1,0.2,0.3,0.4"}


def test_settings_out_of_range_are_one_line():
    assert "repeat_threshold must be -1" in refusal(GraphDrafter, repeat_threshold=-2)
    assert "drafter.sibling_threshold" in refusal(GraphDrafter, sibling_threshold=1.5)


@torch.inference_mode()
def test_a_merged_path_is_fed_again_and_decoding_stays_greedys(tiny, prompt_ids):
    """Merging on every repeated token (threshold 0) on a model whose output repeats: drafts go through pseudo edges,
    the draft's cache keeps only the nodes fed along the accepted path, and the answer is greedy's."""
    drafter = configured_drafter("gsd", tiny)
    decoder = Decoder(tiny.target, frozenset(), 64)
    for ids in prompt_ids:
        generation = decoder.generate(ids, drafter, 48)
        assert generation.token_ids == greedy_reference(tiny.weights.module, ids, 48)
        assert max(step.accepted_tokens for step in generation.steps) > 1
