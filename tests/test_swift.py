"""SWIFT (drafter=swift): its tree, its on-the-fly skip-set search and its settings, each pinned against the original
(hemingkx/SWIFT @88caed7; docs/fidelity.md). Its losslessness is the contract tests' (every drafter config, every
Target); here also with the search changing the skip set mid-answer."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from conftest import refusal
from hydra.utils import instantiate

from specbench.config import compose
from specbench.decoding.loop import Decoder
from specbench.decoding.target import LayerSkip
from specbench.drafters.swift import Swift, initial_skip_set, sibling_count, tree_of
from specbench.testing import greedy_reference
from specbench.training.layer_search import point_of, random_skip_set, swift_skip_count, top_skip_set

GREEDY = (3, 5, 8, 10)
BOUNDS = (0.95, 0.8, 0.5)


@functools.cache
def six_layers():
    """tiny-random with 6 layers: 4 inner ones for SWIFT to search (it never skips the first and last)."""
    return instantiate(compose(["model=tiny-random", "model.num_layers=6"]).model, device="cpu",
                       linear_backend="auto")


def test_the_config_restates_the_originals_settings():
    config = compose(["drafter=swift"]).drafter
    # utils.py:9 (TOPK), 414, 416 (max_step_draft, stop_threshold), 75-88 (siblings)
    assert (config.top_k, config.max_step_draft, config.stop_threshold) == (10, 25, 0.8)
    assert list(config.siblings) == [3, 5, 8, 10] and list(config.siblings_sampling) == [1, 3, 5, 10]
    assert list(config.confidence_bounds) == [0.95, 0.8, 0.5]
    # eval_llama.sh:11-17, 27 and inference_swift.py:293-295
    assert (config.skip_ratio, config.context_window, config.max_score) == (0.45, 50, 0.93)
    assert (config.opt_interval, config.bayes_interval, config.max_opt_iter, config.max_tolerance_iter) == (1, 25, 1000,
                                                                                                            300)
    assert (config.optimization, config.bayes, config.kappa, config.alpha, config.seed) == (True, True, 2.5, 0.01, 2024)
    # skip_layers.json "llama-2-13b_chat_cnndm" (18 + 16 = 34 = int(76 x 0.45))
    published = config.published_skip_sets["llama2-13b-chat"]
    assert list(published.attention) == [7, 10, 14, 15, 20, 23, 24, 25, 26, 27, 29, 30, 32, 34, 35, 36, 37, 38]
    assert list(published.mlp) == [7, 8, 9, 10, 12, 14, 16, 20, 24, 25, 29, 30, 31, 32, 33, 35]
    assert len(published.attention) + len(published.mlp) == swift_skip_count(40, 0.45) == 34


def test_the_skip_count_start_set_and_encodings_are_swifts():
    assert swift_skip_count(80, 0.45) == 70 and swift_skip_count(48, 0.45) == 41  # utils.py:807
    start = initial_skip_set(40)  # inference_swift.py:284-289: odd layers 1..37
    assert sorted(start.attention) == list(range(1, 39, 2)) == sorted(start.mlp) and len(start) == 38
    point = np.array([0.1, 0.9, 0.3, 0.8, 0.7, 0.2, 0.6, 0.0])  # 6 layers: attention 1-4, then MLP 1-4
    assert top_skip_set(point, 6, 3) == (frozenset({2, 4}), frozenset({1}))
    for seed in range(20):
        skip = random_skip_set(np.random.default_rng(seed), 6, 3)
        assert len(skip.attention) + len(skip.mlp) == 3 and not {0, 5} & (skip.attention | skip.mlp)
        assert top_skip_set(point_of(skip, 6), 6, 3) == skip


def test_siblings_follow_the_chain_tokens_confidence():
    assert [sibling_count(c, BOUNDS, GREEDY) for c in (0.99, 0.95, 0.9, 0.8, 0.6, 0.5, 0.1)] == [3, 5, 5, 8, 8, 10, 10]
    ranked = [np.arange(10) + 10 * depth for depth in range(3)]
    tokens, parents = tree_of(ranked, [0.97, 0.85, 0.3], BOUNDS, GREEDY)
    # depth 0: 3 under the root; depth 1: 5 under depth 0's first; depth 2: 10 under depth 1's first
    assert tokens == [0, 1, 2, 10, 11, 12, 13, 14, *range(20, 30)]
    assert parents == [-1] * 3 + [0] * 5 + [3] * 10


@torch.inference_mode()
def test_a_draft_is_a_chain_with_siblings_and_leaves_the_cache_as_it_was(tiny, prompt_ids):
    from conftest import first_draft

    drafter = Swift(stop_threshold=0.0, max_step_draft=4, optimization=False)
    drafter.prepare(tiny)
    draft, target = first_draft(drafter, tiny, prompt_ids[0])
    assert target.length == len(prompt_ids[0]) - 1 and draft.probs is None
    assert int((draft.parents == -1).sum()) >= 3 and len(set(draft.parents.tolist())) == 4  # 4 depths


@torch.inference_mode()
def test_the_search_scores_candidates_keeps_the_better_and_decoding_stays_greedys(prompt_ids):
    model = six_layers()
    drafter = Swift(context_window=8, bayes_interval=3, max_score=1.0)
    drafter.prepare(model)
    assert drafter.skip == initial_skip_set(6) and drafter.count == 3
    decoder = Decoder(model.target, frozenset(), 64)
    for ids in prompt_ids:
        assert decoder.generate(ids, drafter, 48).token_ids == greedy_reference(model.weights.module, ids, 48)
    assert drafter.opt_iter > 3 and len(drafter.optimizer.scores) == drafter.opt_iter
    assert drafter.best_score == max(drafter.optimizer.scores) > 0
    assert len(drafter.skip) == 3  # a scored candidate replaced the start set
    state = drafter.state()
    again = Swift(context_window=8, bayes_interval=3, max_score=1.0)
    again.prepare(model)
    again.restore(state)
    assert (again.skip, again.best_score, again.opt_iter, again.searching) == (drafter.skip, drafter.best_score,
                                                                              drafter.opt_iter, drafter.searching)


@torch.inference_mode()
def test_matchness_is_the_share_of_the_answers_next_tokens_a_pass_after_the_prompt_predicts(prompt_ids):
    model = six_layers()
    drafter = Swift(context_window=8)
    drafter.prepare(model)
    ids = np.asarray(prompt_ids[0], dtype=np.int64)
    answer = greedy_reference(model.weights.module, list(ids), 12)
    nothing = LayerSkip(frozenset(), frozenset())
    drafter.decodes_with(model.target)
    model.target.start(64)
    model.target.prefill(np.asarray(list(ids) + answer[:10], dtype=np.int64), False, 2)
    drafter.begin(ids)
    drafter.answer = answer
    assert drafter.matchness(nothing) == 1.0  # the full model predicts its own greedy answer
    assert model.target.length == ids.size + 10
    model.target.release()


def test_the_search_stops_at_a_score_above_the_maximum_or_after_the_limits():
    drafter = Swift(max_score=0.5, max_tolerance_iter=2, max_opt_iter=5)
    drafter.prepare(six_layers())
    scores = iter([0.4, 0.3, 0.2, 0.1])
    drafter.matchness = lambda candidate: next(scores)
    drafter._search_step()
    assert drafter.searching and drafter.best_score == 0.4
    for _ in range(3):
        drafter._search_step()
    assert not drafter.searching and drafter.tolerance_iter == 3  # > max_tolerance_iter
    drafter = Swift(max_score=0.5)
    drafter.prepare(six_layers())
    drafter.matchness = lambda candidate: 0.6
    drafter._search_step()
    assert not drafter.searching  # utils.py:842-846: above max_score, done for good


def test_cache_hit_needs_a_published_set_and_searches_nothing(tiny):
    assert "no published skip set for tiny-random" in refusal(Swift(cache_hit=True).prepare, tiny)
    drafter = Swift(cache_hit=True, published_skip_sets={"tiny-random": {"attention": [1], "mlp": []}})
    drafter.prepare(tiny)
    assert not drafter.searching and drafter.skip == LayerSkip(frozenset({1}), frozenset())


def test_settings_out_of_range_are_one_line():
    assert "one count per confidence bound" in refusal(Swift, siblings=[3, 5])
    assert "more than drafter.top_k=4" in refusal(Swift, top_k=4)
    assert "drafter.skip_ratio" in refusal(Swift, skip_ratio=1.5)
