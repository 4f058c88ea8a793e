import numpy as np
import pytest
from conftest import greedy_reference

from specbench.datastores.suffix_array import TokenDatastore
from specbench.decoding.loop import Decoder
from specbench.decoding.tree import node_depths, node_parents
from specbench.drafters.base import StepOutcome
from specbench.drafters.hd import HierarchyDrafting
from specbench.drafters.lookahead import JacobiWindow, Lookahead
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
    assert window.update(np.array([1, 2, 3])) == []  # fill: levels move forward, a level is added
    assert window.levels[1].tolist() == [2, 3]
    first_level = window.levels[0].tolist()
    ngrams = window.update(np.array([7, 7, 5, 6]))  # outputs after level 0 (ignored) and the top level
    assert ngrams == [(first_level[0], 2, 5), (first_level[1], 3, 6)]
    assert [level.tolist() for level in window.levels] == [[2, 3], [5, 6]]
    # an unverified column keeps its guess and yields no n-gram
    assert window.update(np.array([0, 0, -1, 9])) == [(3, 6, 9)]
    assert [level.tolist() for level in window.levels] == [[5, 6], [5, 9]]


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
    drafter.accept(np.array([3, 4, 5]), StepOutcome(None, np.array([0]), ()))
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
