import numpy as np
import pytest

from specbench.decoding.tree import (
    ancestor_matrix,
    chain_parents,
    greedy_accepted_path,
    is_chain,
    node_depths,
    node_parents,
    reindex_parents,
    select_nodes,
    trie_from_sequences,
)


def test_node_numbering_of_a_two_branch_tree():
    parents = node_parents(np.array([-1, 0, -1, 2]))
    assert parents.tolist() == [-1, 0, 1, 0, 3]
    assert node_depths(parents).tolist() == [0, 1, 2, 1, 2]
    assert not is_chain(parents)
    assert is_chain(node_parents(chain_parents(4)))


def test_parents_must_precede_children():
    with pytest.raises(ValueError):
        node_parents(np.array([1, -1]))


def test_ancestor_matrix_lets_each_node_see_only_its_path():
    visible = ancestor_matrix(node_parents(np.array([-1, 0, -1, 2])))
    expected = np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 0, 1, 1],
    ], dtype=bool)
    assert np.array_equal(visible, expected)


def test_chain_path_stops_at_first_mismatch_and_returns_bonus_position():
    parents = node_parents(chain_parents(4))
    node_tokens = np.array([0, 5, 6, 7, 8])
    target = np.array([5, 6, 9, 1, 2])  # node 3 (7) should have been 9
    assert greedy_accepted_path(parents, node_tokens, target) == [1, 2]


def test_nothing_accepted_when_first_token_wrong():
    parents = node_parents(chain_parents(3))
    assert greedy_accepted_path(parents, np.array([0, 4, 5, 6]), np.array([3, 5, 6, 7])) == []


def test_tree_path_takes_the_branch_the_target_follows():
    # root -> a(5) -> b(6) ; root -> c(7) -> d(8) -> e(9)
    parents = node_parents(np.array([-1, 0, -1, 2, 3]))
    node_tokens = np.array([0, 5, 6, 7, 8, 9])
    target = np.array([7, 0, 0, 8, 9, 4])
    assert greedy_accepted_path(parents, node_tokens, target) == [3, 4, 5]


def test_duplicate_branches_pick_the_deepest_then_the_lowest_index():
    # two children with the same token 5; only the second continues correctly
    parents = node_parents(np.array([-1, -1, 1]))
    node_tokens = np.array([0, 5, 5, 6])
    target = np.array([5, 1, 6, 2])
    assert greedy_accepted_path(parents, node_tokens, target) == [2, 3]
    # equally deep: lowest index wins
    parents = node_parents(np.array([-1, -1]))
    assert greedy_accepted_path(parents, np.array([0, 5, 5]), np.array([5, 1, 1])) == [1]


def test_non_candidate_nodes_are_never_accepted():
    parents = node_parents(chain_parents(2))
    candidates = np.array([True, True, False])
    assert greedy_accepted_path(parents, np.array([0, 5, 6]), np.array([5, 6, 7]), candidates) == [1]


def test_cutting_a_tree_by_depth_and_node_count_keeps_it_valid():
    draft_parents = np.array([-1, 0, 1, -1, 3])  # depths 1 2 3 1 2
    keep = select_nodes(draft_parents, None, max_depth=2, max_nodes=10)
    assert keep.tolist() == [0, 1, 3, 4]
    assert reindex_parents(draft_parents, keep).tolist() == [-1, 0, -1, 2]
    keep = select_nodes(draft_parents, None, max_depth=3, max_nodes=2)
    assert keep.tolist() == [0, 1]


def test_non_candidates_survive_the_depth_cut_but_not_their_cut_parents():
    # a candidate chain 0-1-2 and a non-candidate chain 3-4-5 whose last node has a candidate child 6
    draft_parents = np.array([-1, 0, 1, -1, 3, 4, 5])
    candidates = np.array([True, True, True, False, False, False, True])
    assert select_nodes(draft_parents, candidates, max_depth=2, max_nodes=10).tolist() == [0, 1, 3, 4, 5]
    assert select_nodes(draft_parents, candidates, max_depth=3, max_nodes=10).tolist() == [0, 1, 2, 3, 4, 5]
    assert select_nodes(draft_parents, candidates, max_depth=4, max_nodes=10).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert select_nodes(draft_parents, candidates, max_depth=0, max_nodes=10).tolist() == [3, 4, 5]


def test_trie_merges_shared_prefixes_and_keeps_the_first_label():
    tokens, parents, labels = trie_from_sequences([(1, 2, 3), (1, 2, 4), (5,), (1, 2, 3)], ["a", "b", "b", "c"])
    assert tokens.tolist() == [1, 2, 3, 4, 5]
    assert parents.tolist() == [-1, 0, 1, 1, -1]
    assert labels == ["a", "a", "a", "b", "b"]
    empty = trie_from_sequences([], [])
    assert empty[0].size == 0 and empty[1].size == 0
