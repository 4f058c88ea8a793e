import dataclasses

import numpy as np
import pytest
from conftest import greedy_reference

from specbench.datastores.ngram_pool import NGramPool
from specbench.datastores.suffix_array import TokenDatastore
from specbench.decoding.contract import Draft, StepOutcome
from specbench.decoding.loop import Decoder
from specbench.decoding.tree import node_depths, node_parents
from specbench.drafters.hd import HierarchyDrafting
from specbench.drafters.jacobi import JacobiWindow
from specbench.drafters.lookahead import Lookahead
from specbench.drafters.rest import RetrievalDrafter
from specbench.errors import SpecbenchError


def test_window_is_a_tree_with_columns_on_a_chain():
    window = JacobiWindow(width=3, levels=3, seed=0)
    window.levels = [np.array([10, 11, 12]), np.array([20, 21, 22]), np.array([30, 31, 32])]
    tokens, parents = window.nodes()
    assert tokens.tolist() == [10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert parents.tolist() == [-1, 0, 1, 0, 1, 2, 3, 4, 5]
    # level j, column i sits at depth 1 + i + j: positions continue along every path
    assert node_depths(node_parents(parents))[1:].tolist() == [1, 2, 3, 2, 3, 4, 3, 4, 5]


def test_window_fills_then_harvests_columns_as_ngrams():
    window = JacobiWindow(width=2, levels=2, seed=0)
    window.reset(np.arange(100, 200))
    assert [level.size for level in window.levels] == [3]
    assert window.iterate(np.array([1, 2, 3])) == []  # fill: levels move forward, a level is added
    assert window.levels[1].tolist() == [2, 3]
    first_level = window.levels[0].tolist()
    ngrams = window.iterate(np.array([7, 7, 5, 6]))  # outputs after level 0 (ignored) and the top level
    assert ngrams == [(first_level[0], 2, 5), (first_level[1], 3, 6)]
    assert [level.tolist() for level in window.levels] == [[2, 3], [5, 6]]
    # an unverified column keeps its guess and yields no n-gram
    assert window.iterate(np.array([0, 0, -1, 9])) == [(3, 6, 9)]
    assert [level.tolist() for level in window.levels] == [[5, 6], [5, 9]]


def full_window():
    window = JacobiWindow(width=2, levels=2, seed=0)
    window.reset(np.arange(100, 200))
    window.levels = [np.array([10, 11]), np.array([20, 21])]
    return window


def test_window_rides_after_the_candidates_as_non_candidates():
    window = full_window()
    draft = window.attach(np.array([5, 6]), np.array([-1, 0]), ("context", "context"))
    assert draft.token_ids.tolist() == [5, 6, 10, 11, 20, 21]
    # the window's own parents [-1 0 0 1] shifted by the two candidates; level 0 hangs off the root
    assert draft.parents.tolist() == [-1, 0, -1, 2, 2, 3]
    assert draft.candidates.tolist() == [True, True, False, False, False, False]
    assert draft.sources == ("context", "context") + ("window",) * 4


def test_window_reads_only_the_outcome_of_the_draft_that_carried_it():
    window = full_window()
    draft = window.attach(np.array([5, 6]), np.array([-1, 0]))
    # root choice, choices after the 2 candidates, after level 0 (not read), after the top level
    target_tokens = np.array([1, 2, 3, 4, 4, 30, 31])
    levels = [[10, 11], [20, 21]]
    ignored = [
        StepOutcome(step=0, draft=Draft.empty(), target_tokens=np.array([1]), accepted_nodes=()),
        # the prefill is never read, whatever it carries
        StepOutcome(step=0, draft=draft, target_tokens=target_tokens, accepted_nodes=()),
        # an equal draft is not the draft: the contract hands back the very object, compared with ``is``
        StepOutcome(step=1, draft=dataclasses.replace(draft), target_tokens=target_tokens, accepted_nodes=()),
    ]
    for outcome in ignored:
        assert window.update(outcome) == []
        assert [level.tolist() for level in window.levels] == levels
    window.attach(np.array([5, 6]), np.array([-1, 0]))  # a newer draft carries the window now
    assert window.update(StepOutcome(step=1, draft=draft, target_tokens=target_tokens, accepted_nodes=(0,))) == []
    assert [level.tolist() for level in window.levels] == levels


def test_window_update_reads_its_columns_and_a_cut_column_keeps_its_guess():
    window = full_window()
    draft = window.attach(np.array([5, 6]), np.array([-1, 0]))
    # column 1's top node was cut from the verified draft (-1): no n-gram, and its guess 21 stays on top
    outcome = StepOutcome(step=3, draft=draft, target_tokens=np.array([1, 2, 3, 4, 4, 30, -1]), accepted_nodes=(0,))
    assert window.update(outcome) == [(10, 20, 30)]
    assert [level.tolist() for level in window.levels] == [[20, 21], [30, 21]]
    window.reset(np.arange(100, 200))  # a new question: the old draft's outcome is no longer read
    reset_levels = [level.tolist() for level in window.levels]
    assert window.update(outcome) == []
    assert [level.tolist() for level in window.levels] == reset_levels


def test_pool_adds_the_ngrams_ending_in_new_tokens():
    pool = NGramPool(key_tokens=1, continuation_length=2, capacity=0)
    tail = pool.add_new_tokens(np.array([7, 8]), np.array([9, 10]), keep=3)
    assert tail.tolist() == [8, 9, 10]
    assert pool.table == {(7,): {(8, 9): None}, (8,): {(9, 10): None}}


def test_lookahead_verifies_pool_ngrams_of_the_last_token():
    drafter = Lookahead(ngram_size=3, window_size=2, guess_set_size=2, pool_from_prompt=True)
    drafter.begin(np.array([4, 1, 2, 4, 3, 5, 4]))
    draft = drafter.propose(np.array([4, 1, 2, 4, 3, 5, 4]))
    candidates = draft.candidates.numpy()
    guesses = draft.token_ids.numpy()[candidates].tolist()
    assert guesses == [3, 5, 1, 2]  # most recent n-gram after 4 first: (3, 5), then (1, 2)
    assert (~candidates).sum() == 3  # the window starts as one level of width + levels - 1 = 3 guesses
    with pytest.raises(SpecbenchError, match="ngram_size"):
        Lookahead(ngram_size=1)


class FakeDatabase:
    def __init__(self, sequences):
        self.sequences = sequences

    def lookup(self, context, limit):
        return self.sequences[:limit]


def make_hd(order, num_candidates=3):
    drafter = HierarchyDrafting(order=order, key_tokens=1, draft_length=2, num_candidates=num_candidates,
                                context_from_prompt=True)
    drafter.model_db = FakeDatabase([(1, 1), (2, 2), (3, 3)])
    return drafter


def test_hd_visits_databases_in_order_until_enough_candidates():
    prompt = np.array([9, 5, 6, 9, 7, 8, 9])
    drafter = make_hd(["context", "model"])
    drafter.begin(prompt)
    draft = drafter.propose(prompt)
    assert draft.sources == ("context",) * 4 + ("model",) * 2
    assert draft.token_ids.tolist() == [7, 8, 5, 6, 1, 1]
    drafter = make_hd(["model", "context"])
    drafter.begin(prompt)
    assert drafter.propose(prompt).sources == ("model",) * 6
    drafter = make_hd(["context"], num_candidates=7)
    drafter.begin(prompt)
    assert len(drafter.propose(prompt)) == 4


def test_hd_learns_from_accepted_tokens():
    drafter = make_hd(["context"])
    drafter.begin(np.array([1, 2, 3]))
    assert len(drafter.propose(np.array([1, 2, 3, 3]))) == 0
    drafter.accept(np.array([3, 4, 5]),
                   StepOutcome(step=1, draft=Draft.empty(), target_tokens=np.array([0]), accepted_nodes=()))
    # context is now [1 2 3 3 4 5]: after a 3 came (3, 4) and, more recently, (4, 5)
    assert drafter.propose(np.array([1, 3])).token_ids.tolist() == [4, 5, 3, 4]


def test_hd_rejects_unknown_databases():
    with pytest.raises(SpecbenchError, match="drafter.order"):
        HierarchyDrafting(order=["context", "cache"])
    with pytest.raises(SpecbenchError, match="drafter.order"):
        HierarchyDrafting(order=["context", "context"])


def test_hd_statistics_prefers_the_longer_key():
    store = TokenDatastore.build([[1, 2, 3, 4], [5, 2, 6, 7], [9, 2, 6, 7]], {})
    drafter = HierarchyDrafting(order=["statistics"], key_tokens=2, draft_length=2, num_candidates=2)
    drafter.statistics_db = store
    assert drafter.statistics_lookup(np.array([0, 1, 2]), 2) == [(3, 4), (6, 7)]
    assert drafter.statistics_lookup(np.array([0, 0, 2]), 2) == [(6, 7), (3, 4)]


def test_rest_accepts_long_runs_when_the_datastore_holds_the_output(tiny, prompt_ids):
    answers = [greedy_reference(tiny.model, ids, 64) for ids in prompt_ids]
    drafter = RetrievalDrafter(max_suffix_length=8, min_suffix_length=2)
    drafter.datastore = TokenDatastore.build(answers, {})
    decoder = Decoder(tiny.model, frozenset(), 64)
    for ids, expected in zip(prompt_ids, answers):
        generation = decoder.generate(ids, drafter, 64)
        assert generation.token_ids == expected
        assert max(step.accepted_tokens for step in generation.steps) >= 5


def test_hd_inside_the_lookahead_window_stays_lossless(tiny, prompt_ids):
    drafter = HierarchyDrafting(order=["context"], lookahead_branch=True, window_size=4, draft_length=3)
    decoder = Decoder(tiny.model, frozenset(), 64)
    for ids in prompt_ids:
        generation = decoder.generate(ids, drafter, 48)
        assert generation.token_ids == greedy_reference(tiny.model, ids, 48)
        assert {step.source for step in generation.steps} <= {"", "context"}
        # the window (4 + 3 - 1 guesses at first) is verified every step alongside the candidates
        assert all(step.draft_tokens >= 4 for step in generation.steps[1:])
