import dataclasses
import random

import numpy as np
import pytest

from specbench.datastores.ngram_pool import NGramPool
from specbench.datastores.suffix_array import TokenDatastore
from specbench.decoding.contract import Draft, StepOutcome
from specbench.decoding.loop import Decoder
from specbench.decoding.tree import node_depths, node_parents
from specbench.datastores.model_db import count_document_ngrams, load_model_db, save_model_db
from specbench.drafters.hd import HierarchyDrafting, generated_ngrams, statistics_candidates
from specbench.drafters.jacobi import JacobiWindow
from specbench.drafters.lookahead import Lookahead
from specbench.drafters.rest import RetrievalDrafter
from specbench.errors import SpecbenchError
from specbench.testing import greedy_reference


def test_window_is_laid_out_as_lades_with_the_root_as_column_zero():
    window = JacobiWindow(width=3, levels=3, seed=0)
    window.levels = [np.array([10, 11]), np.array([20, 21, 22]), np.array([30, 31, 32])]
    tokens, parents = window.nodes()
    assert tokens.tolist() == [10, 11, 20, 21, 22, 30, 31, 32]
    # level 0 is a chain from the root; level 1, column 0 hangs off the root itself
    assert parents.tolist() == [-1, 0, -1, 0, 1, 2, 3, 4]
    # lade's positions: level 0 column c at lst_id + c, level l column c at lst_id + l + c
    assert node_depths(node_parents(parents))[1:].tolist() == [1, 2, 1, 2, 3, 2, 3, 4]


def test_window_starts_from_lades_seeded_prompt_draws_and_fills_one_level_per_pass():
    prompt = np.arange(100, 140)
    window = JacobiWindow(width=7, levels=4, seed=10)
    window.reset(prompt)
    lade = random.Random(10)  # lade: random.seed(10); [random.choice(all_old_tokens) for _ in range(W + N - 3)]
    assert window.levels[0].tolist() == [lade.choice(prompt.tolist()) for _ in range(9)]
    sizes = []
    for _ in range(5):
        tokens, _ = window.nodes()
        assert window.iterate(np.arange(tokens.size), root=1) == [] or window.full
        sizes.append([level.size for level in window.levels])
    assert sizes == [[8, 9], [7, 8, 8], [6, 7, 7, 7], [6, 7, 7, 7], [6, 7, 7, 7]]
    assert window.nodes()[0].size == 27  # lade's 28 window tokens include the root


def test_a_full_window_harvests_one_ngram_per_column_keyed_by_the_root_first():
    window = JacobiWindow(width=2, levels=2, seed=0)
    window.levels = [np.array([10]), np.array([20, 21])]
    # outputs aligned with nodes [10 20 21]: the choices after the top level are 30, 31
    assert window.iterate(np.array([7, 30, 31]), root=5) == [(5, 20, 30), (10, 21, 31)]
    assert [level.tolist() for level in window.levels] == [[21], [30, 31]]
    # an unverified column keeps its guess and yields no n-gram
    assert window.iterate(np.array([0, -1, 9]), root=6) == [(21, 31, 9)]
    assert [level.tolist() for level in window.levels] == [[31], [30, 9]]


def test_hd_harvests_the_pass_that_completes_the_window_misaligned_as_its_code_does():
    def filled(fill_step_ngrams):
        window = JacobiWindow(width=3, levels=3, seed=0, fill_step_ngrams=fill_step_ngrams)
        window.levels = [np.array([10, 11, 12]), np.array([20, 21, 22, 23])]
        return window
    # the pass that adds the top level: choices [40 41 42 43] after level 1
    assert filled(False).iterate(np.array([0, 0, 0, 40, 41, 42, 43]), root=5) == []
    window = filled(True)
    # decoding.py: p3 = new[1:] stands where the level below the choices should be: (.., new[c + 1], new[c])
    assert window.iterate(np.array([0, 0, 0, 40, 41, 42, 43]), root=5) == [(5, 21, 41, 40), (11, 22, 42, 41),
                                                                          (12, 23, 43, 42)]
    assert [level.tolist() for level in window.levels] == [[11, 12], [21, 22, 23], [41, 42, 43]]


def full_window():
    window = JacobiWindow(width=2, levels=2, seed=0)
    window.reset(np.arange(100, 200))
    window.levels = [np.array([10]), np.array([20, 21])]
    return window


def test_window_rides_after_the_candidates_as_non_candidates():
    window = full_window()
    draft = window.attach(np.array([5, 6]), np.array([-1, 0]), ("context", "context"), root=9)
    assert draft.token_ids.tolist() == [5, 6, 10, 20, 21]
    # the window's own parents [-1 -1 0] shifted by the two candidates
    assert draft.parents.tolist() == [-1, 0, -1, -1, 2]
    assert draft.candidates.tolist() == [True, True, False, False, False]
    assert draft.sources == ("context", "context") + ("window",) * 3


def test_window_reads_only_the_outcome_of_the_draft_that_carried_it():
    window = full_window()
    draft = window.attach(np.array([5, 6]), np.array([-1, 0]), root=9)
    # root choice, choices after the 2 candidates, after level 0 (not read), after the top level
    target_tokens = np.array([1, 2, 3, 4, 30, 31])
    levels = [[10], [20, 21]]
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
    window.attach(np.array([5, 6]), np.array([-1, 0]), root=9)  # a newer draft carries the window now
    assert window.update(StepOutcome(step=1, draft=draft, target_tokens=target_tokens, accepted_nodes=(0,))) == []
    assert [level.tolist() for level in window.levels] == levels


def test_window_update_reads_its_columns_with_the_root_it_was_attached_with():
    window = full_window()
    draft = window.attach(np.array([5, 6]), np.array([-1, 0]), root=9)
    outcome = StepOutcome(step=3, draft=draft, target_tokens=np.array([1, 2, 3, 4, 30, -1]), accepted_nodes=(0,))
    assert window.update(outcome) == [(9, 20, 30)]
    assert [level.tolist() for level in window.levels] == [[21], [30, 21]]
    window.reset(np.arange(100, 200))  # a new turn: the old draft's outcome is no longer read
    reset_levels = [level.tolist() for level in window.levels]
    assert window.update(outcome) == []
    assert [level.tolist() for level in window.levels] == reset_levels


def test_pool_adds_the_ngrams_ending_in_new_tokens():
    pool = NGramPool(key_tokens=1, continuation_length=2, capacity=0)
    tail = pool.add_new_tokens(np.array([7, 8]), np.array([9, 10]), keep=3)
    assert tail.tolist() == [8, 9, 10]
    assert pool.table == {(7,): {(8, 9): None}, (8,): {(9, 10): None}}


def test_lookahead_waits_for_a_full_window_then_verifies_pool_ngrams_as_chains_oldest_first():
    drafter = Lookahead(ngram_size=3, window_size=2, guess_set_size=2)
    prompt = np.array([4, 1, 2, 4, 3, 5, 4])
    drafter.begin(prompt)
    drafter.pool.add((4,), (1, 2))
    drafter.pool.add((4,), (3, 5))
    assert not drafter.window.full
    assert drafter.propose(prompt).candidates.sum() == 0  # lade: no guesses while the window fills
    drafter.window.levels = [np.array([10]), np.array([20, 21])]
    draft = drafter.propose(prompt)
    guesses = draft.token_ids.numpy()[: 4].tolist()
    assert guesses == [1, 2, 3, 5]  # the oldest n-gram first, each its own chain
    assert draft.parents.tolist()[:4] == [-1, 0, -1, 2]
    # lade's match loop stops one short: a guess's last token is verified but never accepted
    assert draft.candidates.tolist()[:4] == [True, False, True, False]
    full = Lookahead(ngram_size=3, window_size=2, guess_set_size=2, accept_full_guess=True, merge_guesses=True)
    full.begin(prompt)
    full.pool.add((4,), (1, 2))
    full.pool.add((4,), (1, 5))
    full.window.levels = [np.array([10]), np.array([20, 21])]
    draft = full.propose(prompt)
    assert draft.token_ids.tolist()[:3] == [1, 2, 5] and draft.candidates.tolist()[:3] == [True] * 3
    with pytest.raises(SpecbenchError, match="ngram_size"):
        Lookahead(ngram_size=2)


def test_lookahead_fills_its_pool_from_the_window_only():
    drafter = Lookahead(ngram_size=3, window_size=2, guess_set_size=7)
    drafter.begin(np.array([4, 1, 2, 4, 3, 5, 4]))
    assert drafter.pool.table == {}  # not from the prompt
    drafter.accept(np.array([4, 1, 2]), StepOutcome(step=1, draft=Draft.empty(), target_tokens=np.array([0]),
                                                    accepted_nodes=()))
    assert drafter.pool.table == {}  # nor from the output
    chatty = Lookahead(ngram_size=3, window_size=2, guess_set_size=7, pool_from_prompt=True, pool_from_output=True)
    chatty.begin(np.array([4, 1, 2]))
    assert chatty.pool.lookup(np.array([4]), 7) == [(1, 2)]
    chatty.accept(np.array([4, 6]), StepOutcome(step=1, draft=Draft.empty(), target_tokens=np.array([0]),
                                                accepted_nodes=()))
    assert chatty.pool.lookup(np.array([2]), 7) == [(4, 6)]


@pytest.mark.parametrize("accept_full_guess, longest", [(False, 4), (True, 5)])
def test_lookahead_accepts_at_most_n_minus_1_tokens_a_step_as_lade_does(tiny, prompt_ids, accept_full_guess, longest):
    # a pool that holds the true continuation: the only cap on a step is the guess length (and lade's loop)
    ids = prompt_ids[0]
    expected = greedy_reference(tiny.weights.module, ids, 40)
    drafter = Lookahead(ngram_size=5, window_size=3, guess_set_size=7, accept_full_guess=accept_full_guess)
    context = ids + expected
    decoder = Decoder(tiny.target, frozenset(), 64)
    original_begin = drafter.begin

    def begin(prompt):
        original_begin(prompt)
        for end in range(len(ids), len(context) - 4):
            drafter.pool.add((context[end],), tuple(context[end + 1 : end + 5]))

    drafter.begin = begin
    generation = decoder.generate(ids, drafter, 40)
    assert generation.token_ids == expected
    assert max(step.accepted_tokens for step in generation.steps) == longest


class FakeDatabase:
    def __init__(self, sequences):
        self.sequences = sequences

    def lookup(self, context, limit):
        return self.sequences[:limit]


def make_hd(order, num_candidates=3, **settings):
    drafter = HierarchyDrafting(order=order, draft_length=2, num_candidates=num_candidates, lookahead_branch=False,
                                **settings)
    drafter.model_db = FakeDatabase([(1, 1), (2, 2), (3, 3)])
    return drafter


def test_hd_concatenates_databases_in_order_without_deduplication_and_cuts_at_num_candidates():
    prompt = np.array([9, 5, 6, 9, 7, 8, 9])
    drafter = make_hd(["context", "model"])
    drafter.begin(prompt)
    draft = drafter.propose(prompt)
    # the context database keys on the last token (9) and lists the oldest n-gram first: (5, 6), (7, 8)
    assert draft.token_ids.tolist() == [5, 6, 7, 8, 1, 1]
    assert draft.parents.tolist() == [-1, 0, -1, 2, -1, 4]  # separate chains
    assert draft.sources == ("context",) * 4 + ("model",) * 2
    drafter = make_hd(["model", "context"])
    drafter.begin(prompt)
    assert drafter.propose(prompt).sources == ("model",) * 6  # 3 candidates reached: context is not asked
    drafter = make_hd(["context", "model"], num_candidates=7)
    drafter.model_db = FakeDatabase([(5, 6), (2, 2)])
    drafter.begin(prompt)
    assert drafter.propose(prompt).token_ids.tolist() == [5, 6, 7, 8, 5, 6, 2, 2]  # (5, 6) twice: no dedup
    merged = make_hd(["context", "model"], num_candidates=7, merge_candidates=True)
    merged.model_db = FakeDatabase([(5, 6), (2, 2)])
    merged.begin(prompt)
    assert merged.propose(prompt).token_ids.tolist() == [5, 6, 7, 8, 2, 2]  # specbench's variant: each once


def test_hd_adds_generated_ngrams_as_its_code_does():
    assert generated_ngrams(np.array([1, 2, 3, 4, 5, 6]), 3, 3) == [(3, 4, 5), (2, 3, 4)]
    assert generated_ngrams(np.array([1, 2, 3, 4, 5, 6]), 1, 3) == []  # fewer than 2 accepted draft tokens
    drafter = make_hd(["context"], context_from_prompt=False)
    drafter.begin(np.array([7, 7, 7]))
    step = StepOutcome(step=1, draft=Draft.empty(), target_tokens=np.array([0]), accepted_nodes=())
    drafter.accept(np.array([1, 2, 3]), step)  # 2 draft tokens + bonus: one n-gram, ending before the bonus
    assert drafter.context_db.table == {(7,): {(1, 2): None}}
    every = make_hd(["context"], context_from_prompt=False, context_from_output="every")
    every.begin(np.array([7, 7, 7]))
    every.accept(np.array([1, 2, 3]), step)
    assert every.context_db.lookup(np.array([1]), 7) == [(2, 3)]


def test_hd_context_database_is_keyed_by_one_token_with_an_lru_of_per_key_capacity():
    drafter = make_hd(["context"], per_key_capacity=2)
    drafter.begin(np.array([9, 1, 1, 9, 2, 2, 9, 3, 3, 8, 9]))
    assert drafter.lookup("context", np.array([8, 9]), 7) == [(2, 2), (3, 3)]  # (1, 1) evicted, oldest first


def test_hd_statistics_rows_are_longest_paths_cut_to_the_draft_length_without_prefixes():
    store = TokenDatastore.build([[5, 2, 6, 7, 8], [5, 2, 6, 7, 9], [0, 2, 3, 4], [1, 5, 2, 6]], {})
    # after [5 2]: continuations (6 7 8), (6 7 9), (6); after [2]: also (3 4)
    rows = statistics_candidates(store, np.array([5, 2]), key_tokens=2, draft_length=2, limit=7, choices=64,
                                 max_matches=5000, continuation_length=10)
    assert rows == [(6, 7), (3, 4)]
    rows = statistics_candidates(store, np.array([5, 2]), key_tokens=2, draft_length=3, limit=7, choices=64,
                                 max_matches=5000, continuation_length=10)
    assert rows == [(6, 7, 8), (6, 7, 9), (3, 4)]
    assert statistics_candidates(store, np.array([5, 2]), 2, 3, 1, 64, 5000, 10) == [(6, 7, 8)]


def test_hd_model_database_lists_the_most_frequent_continuations_least_frequent_first(tmp_path):
    documents = [[1, 2, 3]] * 3 + [[1, 4, 5]] * 2 + [[1, 6, 7]]
    tables = count_document_ngrams(documents, key_tokens=1, continuation_length=2, max_ngrams=10)
    save_model_db(tmp_path / "db", tables, {"tokenizer": {"fingerprint": "fp"}, "key_tokens": 1,
                                            "continuation_length": 2})
    hd_order = load_model_db(tmp_path / "db", "fp", 1, 2, capacity=2, least_frequent_first=True)
    assert hd_order.lookup(np.array([1]), 7) == [(4, 5), (2, 3)]
    assert load_model_db(tmp_path / "db", "fp", 1, 2, capacity=2).lookup(np.array([1]), 7) == [(2, 3), (4, 5)]
    # HD's build skips each answer's last n-gram
    assert count_document_ngrams([[1, 2, 3, 4]], 1, 1, 10, include_final=False)[1][0].tolist() == [[1, 2], [2, 3]]


def test_hd_rejects_unknown_databases():
    with pytest.raises(SpecbenchError, match="drafter.order"):
        HierarchyDrafting(order=["context", "cache"])
    with pytest.raises(SpecbenchError, match="drafter.order"):
        HierarchyDrafting(order=["context", "context"])
    with pytest.raises(SpecbenchError, match="drafter.context_from_output"):
        HierarchyDrafting(context_from_output="all")


def test_rest_accepts_long_runs_when_the_datastore_holds_the_output(tiny, prompt_ids):
    answers = [greedy_reference(tiny.weights.module, ids, 64) for ids in prompt_ids]
    drafter = RetrievalDrafter(max_suffix_length=8, min_suffix_length=2)
    drafter.datastore = TokenDatastore.build(answers, {})
    decoder = Decoder(tiny.target, frozenset(), 64)
    for ids, expected in zip(prompt_ids, answers):
        generation = decoder.generate(ids, drafter, 64)
        assert generation.token_ids == expected
        assert max(step.accepted_tokens for step in generation.steps) >= 5


def test_hd_inside_the_lookahead_window_stays_lossless_and_drafts_while_the_window_fills(tiny, prompt_ids):
    drafter = HierarchyDrafting(order=["context"], lookahead_branch=True, window_size=4, draft_length=3)
    decoder = Decoder(tiny.target, frozenset(), 64)
    for ids in prompt_ids:
        generation = decoder.generate(ids, drafter, 48)
        assert generation.token_ids == greedy_reference(tiny.weights.module, ids, 48)
        assert {step.source for step in generation.steps} <= {"", "context"}
        # the window (level 0 of 4 + 3 - 2 = 5 guesses, then levels of 4 and 5) rides on every step
        assert generation.steps[1].draft_tokens >= 5 and generation.steps[2].draft_tokens >= 9
    # HD verifies its candidates from the first step on, not only once the window is full (as lade does)
    drafter.begin(np.array([9, 5, 6, 7, 9]))
    assert not drafter.window.full
    assert drafter.propose(np.array([9, 5, 6, 7, 9])).candidates.tolist()[:3] == [True] * 3
