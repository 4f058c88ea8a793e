import numpy as np
import pytest
from conftest import ScriptedDrafter

from specbench.decoding.budget import (
    DraftBudget,
    VerifyCost,
    node_kinds,
)
from specbench.decoding.contract import Draft
from specbench.decoding.loop import Decoder
from specbench.decoding.tree import chain_parents
from specbench.settings import RunSettings
from specbench.testing import greedy_reference


def test_verify_cost_interpolates_extrapolates_and_learns():
    cost = VerifyCost({1: 1.0, 3: 2.0, 5: 4.0}, smoothing=0.5)
    assert cost(2) == pytest.approx(1.5) and cost(5) == pytest.approx(4.0) and cost(7) == pytest.approx(6.0)
    assert cost(np.array([1, 2, 7])).tolist() == pytest.approx([1.0, 1.5, 6.0])
    cost.observe(3, 4.0)  # moves halfway towards what was observed
    assert cost(3) == pytest.approx(3.0)
    cost.observe(4, 3.5)  # a new size becomes a point of its own
    assert cost(4) == pytest.approx(3.5)
    grid = RunSettings().calibration_grid
    assert grid(18) == list(range(1, 17)) + [18]
    assert grid(33)[-3:] == [28, 32, 33]
    assert RunSettings(calibration_sizes=[4, 1, 2]).calibration_grid(3) == [1, 2, 3]


def test_kinds_are_source_depth_and_sibling_rank():
    parents = np.array([-1, -1, 0, 0])
    kinds = node_kinds(parents, np.array([1, 1, 2, 2]), ("a", "b", "a", "a"))
    assert kinds == [("a", 1, 0), ("b", 1, 1), ("a", 2, 0), ("a", 2, 1)]
    capped = node_kinds(parents, np.array([1, 1, 2, 2]), ("a", "b", "a", "a"), max_depth=1, max_rank=0)
    assert capped == [("a", 1, 0), ("b", 1, 0), ("a", 1, 0), ("a", 1, 0)]


def test_flat_cost_keeps_everything_and_steep_cost_keeps_nothing():
    parents = chain_parents(4)
    kinds = node_kinds(parents, np.arange(1, 5), None)
    flat = DraftBudget(lambda sizes: np.ones(len(sizes)))
    assert flat.select("d", parents, kinds, None).tolist() == [0, 1, 2, 3]
    steep = DraftBudget(lambda sizes: np.asarray(sizes, dtype=float) ** 2, explore=0.0)
    assert steep.select("d", parents, kinds, None).tolist() == []


def test_learned_rates_prune_the_unreliable_source_first():
    # two chains of 3 from sources "good" and "bad"; a step costs 1 + 0.1 per extra token
    parents = np.array([-1, 0, 1, -1, 3, 4])
    sources = ("good",) * 3 + ("bad",) * 3
    kinds = node_kinds(parents, np.array([1, 2, 3, 1, 2, 3]), sources)
    budget = DraftBudget(lambda sizes: 1.0 + 0.1 * (np.asarray(sizes) - 1), explore=0.0)
    for _ in range(50):  # the good chain is always fully accepted, the bad one never
        budget.observe("d", parents, kinds, None, [0, 1, 2])
    assert budget.select("d", parents, kinds, None).tolist() == [0, 1, 2]


def test_non_candidates_are_always_kept_and_never_counted():
    parents = np.array([-1, 0, -1])
    candidates = np.array([True, True, False])
    kinds = node_kinds(parents, np.array([1, 2, 1]), None)
    budget = DraftBudget(lambda sizes: np.asarray(sizes, dtype=float) ** 2, explore=0.0)
    assert budget.select("d", parents, kinds, candidates).tolist() == [2]
    budget.observe("d", parents, kinds, candidates, [])
    assert sum(trials for _, trials in budget.counts["d"].values()) == 1  # only node 0 had its parent accepted


def test_exploration_retries_a_pruned_kind():
    parents = chain_parents(1)
    kinds = node_kinds(parents, np.array([1]), None)
    budget = DraftBudget(lambda sizes: 1.0 + 0.6 * (np.asarray(sizes) - 1), prior_rate=0.5, explore=0.3)
    assert budget.select("d", parents, kinds, None).tolist() == [0]  # untried: 0.5 + 0.3 beats the cost
    for _ in range(20):
        budget.observe("d", parents, kinds, None, [])
    assert budget.select("d", parents, kinds, None).tolist() == []  # learned: never right


def test_a_budget_changes_speed_never_output(tiny, prompt_ids):
    """With a cost that grows steeply, drafts are cut (the always-wrong drafter ends up drafting nothing)
    and the output stays exactly greedy."""
    budget = DraftBudget(lambda sizes: 1.0 + 0.5 * (np.asarray(sizes) - 1))
    decoder = Decoder(tiny.target, frozenset(), 64, draft_budget=budget)
    for ids in prompt_ids:
        expected = greedy_reference(tiny.weights.module, ids, 40)
        wrong = decoder.generate(ids, ScriptedDrafter(expected, 6, mode="wrong"), 40)
        assert wrong.token_ids == expected
        assert wrong.steps[-1].draft_tokens == 0
        right = decoder.generate(ids, ScriptedDrafter(expected, 6), 40)
        assert right.token_ids == expected
        assert max(s.accepted_tokens for s in right.steps) > 3


def test_what_the_budget_learned_belongs_to_one_question(tiny, prompt_ids):
    """A question decodes the same whether other questions ran before it (answer_question resets the budget's
    estimates), so an interrupted and resumed run measures what an uninterrupted one does."""
    from specbench.questions import Prompt
    from specbench.engines.conversation import answer_question

    def budget_decoder():
        return Decoder(tiny.target, frozenset(), 64,
                       draft_budget=DraftBudget(lambda sizes: 1.0 + 0.4 * (np.asarray(sizes) - 1), explore=0.1))

    class Constant(ScriptedDrafter):  # the same six tokens every step: rarely right, so the budget learns to cut
        def propose(self, context_ids):
            return Draft.chain(np.arange(10, 16))

    questions = [Prompt(question_id=n, category="qa", task="qa", turns=(f"Question {n}: what is {n} + {n}?",))
                 for n in range(3)]
    drafter = Constant([], 6)
    shared = budget_decoder()
    after_others = [answer_question(tiny, shared, drafter, question, 24) for question in questions][-1]
    alone = answer_question(tiny, budget_decoder(), drafter, questions[-1], 24)
    assert [s.draft_tokens for s in after_others.steps[0]] == [s.draft_tokens for s in alone.steps[0]]
    assert alone.steps[0][1].draft_tokens > 0  # a fresh question starts from the prior: the draft is tried


def test_a_non_candidate_under_a_dropped_candidate_is_dropped_with_it():
    # Lookahead's guess chains end in a token that is verified but never accepted (a non-candidate); when the
    # budget drops the chain's candidates, their tail must go too, or the verified nodes are not a tree.
    parents = np.array([-1, 0, -1, 2])
    candidates = np.array([True, False, True, False])
    kinds = node_kinds(parents, np.array([1, 2, 1, 2]), None)
    budget = DraftBudget(lambda sizes: np.asarray(sizes, dtype=float) ** 3, explore=0.0)
    kept = budget.select("d", parents, kinds, candidates)
    assert all(parents[node] < 0 or parents[node] in kept for node in kept)
    assert kept.tolist() == []
