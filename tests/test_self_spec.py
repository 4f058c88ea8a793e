"""Draft & Verify (drafter=self-spec): its threshold rule, chain, settings and offline skip-set search, each pinned
against the original (dilab-zju/self-speculative-decoding @688db8b; docs/fidelity.md). Its losslessness is the
contract tests' (every drafter config, every Target)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import first_draft, refusal

from specbench.artefacts.skip_set import SEARCH_DEFAULTS, search_settings, search_skip_set
from specbench.config import compose
from specbench.decoding.contract import Draft, StepOutcome
from specbench.decoding.loop import Decoder
from specbench.decoding.target import LayerSkip
from specbench.drafters.self_spec import SelfSpeculative, next_threshold
from specbench.testing import configured_drafter, greedy_reference
from specbench.training.layer_search import GaussianProcessUCB, Sublayers, threshold_skip_set

PARAMETERS = (1, 0.5, 0.9, 1e-2, 0.9)  # decoding.py:63, 191 auto_parameters


def test_the_threshold_moves_as_decoding_py_moves_it():
    # decoding.py:159-168: matchness = 0.5 m + 0.5 kept/drafted; below 0.9 the target is th + 0.01, at a full-length
    # draft th itself, else th - 0.01; th = 0.9 th + 0.1 target: a step of 0.001 either way, no bound.
    threshold, matchness = next_threshold(0.6, 0.0, 3, 4, 12, PARAMETERS)
    assert matchness == pytest.approx(0.375) and threshold == pytest.approx(0.601)
    threshold, matchness = next_threshold(0.6, 0.95, 12, 12, 12, PARAMETERS)  # full length, all kept
    assert matchness == pytest.approx(0.975) and threshold == pytest.approx(0.6)
    threshold, matchness = next_threshold(0.6, 0.95, 5, 5, 12, PARAMETERS)  # all kept, shorter than the most
    assert threshold == pytest.approx(0.599)
    threshold = 0.999
    for _ in range(5):  # nothing caps it at 1 (decoding.py has no clamp)
        threshold, _ = next_threshold(threshold, 0.0, 0, 3, 12, PARAMETERS)
    assert threshold > 1.0


def test_the_config_restates_the_originals_settings():
    config = compose(["drafter=self-spec"]).drafter
    # evaluate_sum.ipynb cell 9: max_step_draft=12, th_stop_draft 0.60 carried from prompt to prompt (decoding.py's
    # defaults, 8 and 0.8, are the search's: below)
    assert (config.max_step_draft, config.th_stop_draft, config.carry_threshold) == (12, 0.6, True)
    assert list(config.auto_parameters) == [1, 0.5, 0.9, 0.01, 0.9] and config.auto_th_stop_draft is True
    # skip_layers.json:2-16 "llama-2-13b-chat"
    published = config.published_skip_sets["llama2-13b-chat"]
    assert list(published.attention) == [7, 8, 9, 10, 11, 14, 15, 18, 22, 23, 24, 26, 27, 28, 29, 30, 31, 32, 33, 34,
                                         35, 36, 37, 38]
    assert list(published.mlp) == [7, 10, 11, 14, 27, 30, 32, 33, 37, 38]
    # searching.py:17, 29-33, 52-70, 84-86; search.ipynb cell 12 (search(1000)), cells 6-8 (8 prompts)
    assert dict(config.search) == SEARCH_DEFAULTS == {"iterations": 1000, "prompts": 8, "new_tokens": 32,
                                                      "kappa": 2.576, "alpha": 0.01, "seed": 1, "max_step_draft": 8,
                                                      "th_stop_draft": 0.8}


def test_the_search_reads_a_point_as_searching_py_does():
    # searching.py:36-45: x_i > 0.5 skips attention i, x_{L+i} > 0.5 skips MLP i; no bound on the count
    point = np.array([0.9, 0.5, 0.51, 0.0, 1.0, 0.2, 0.7, 0.6])
    assert threshold_skip_set(point, 4) == Sublayers(frozenset({0, 2}), frozenset({0, 2, 3}))
    assert "8 numbers for 4 layers" in refusal(threshold_skip_set, point[:6], 4)


def _self_spec(tiny, **settings):
    drafter = SelfSpeculative(skip={"attention": [1], "mlp": []}, **settings)
    drafter.prepare(tiny)
    return drafter


@torch.inference_mode()
def test_a_draft_stops_at_the_first_unlikely_token_and_keeps_it(tiny, prompt_ids):
    """A threshold above every probability: one token a step (decoding.py:120, 123 keep the token that stops it); a
    threshold of 0: max_step_draft tokens. The cache is as the drafter found it."""
    for threshold, length in ((1.0, 1), (0.0, 5)):
        drafter = _self_spec(tiny, max_step_draft=5, th_stop_draft=threshold, auto_th_stop_draft=False)
        draft, target = first_draft(drafter, tiny, prompt_ids[0])
        assert len(draft) == length and target.length == len(prompt_ids[0]) - 1
        target.release()


@torch.inference_mode()
def test_the_threshold_is_carried_to_the_next_question_unless_asked_not_to(tiny, prompt_ids):
    decoder = Decoder(tiny.target, frozenset(), max_draft_tokens=64)
    for carry in (True, False):
        drafter = _self_spec(tiny, carry_threshold=carry)
        decoder.generate(prompt_ids[0], drafter, 24)
        after_first = drafter.threshold
        assert after_first != 0.6
        drafter.begin(np.asarray(prompt_ids[1]))
        assert drafter.threshold == (after_first if carry else 0.6) and drafter.matchness == 0.0
        assert (drafter.state() is not None) == carry


@torch.inference_mode()
def test_a_sampled_draft_carries_its_distribution_and_stays_a_chain(tiny, prompt_ids):
    from specbench.decoding.sampling import Sampling

    drafter = SelfSpeculative(skip={"attention": [1], "mlp": []}, th_stop_draft=0.0, max_step_draft=3)
    drafter.prepare(tiny, Sampling(temperature=0.7, seed=3))
    drafter.seed_draws(5)
    draft, _ = first_draft(drafter, tiny, prompt_ids[0])
    assert draft.parents is None and draft.probs.shape == (3, tiny.vocab_size)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(3))


def test_a_skip_set_for_another_model_or_written_wrong_is_one_line(tiny):
    drafter = SelfSpeculative(skip={"attention": [0, 40], "mlp": []})
    assert "[40]" in refusal(drafter.prepare, tiny) and "another model" in refusal(drafter.prepare, tiny)
    assert "list of layer indices" in refusal(SelfSpeculative, skip={"attention": "3", "mlp": []})
    assert "attention: [layers]" in refusal(SelfSpeculative, skip=[1, 2])
    assert "5 numbers" in refusal(SelfSpeculative, auto_parameters=[1, 0.5])
    assert "no setting 'iteration'" in refusal(search_settings, {"iteration": 3}, None)
    assert "search.prompts must be a positive" in refusal(search_settings, {"prompts": 0}, None)


def test_a_target_without_skipping_passes_is_refused_when_decoding_starts(tiny, prompt_ids):
    from specbench.testing import CountingTarget

    drafter = _self_spec(tiny)

    class NoSkipping(CountingTarget):
        skipping_pass = CountingTarget.__mro__[1].skipping_pass  # the interface's refusal

    message = refusal(Decoder(NoSkipping(tiny.target), frozenset(), 8).generate, prompt_ids[0], drafter, 4)
    assert "drafter=self-spec drafts with the target's own layers" in message


def test_the_drafter_plans_a_search_only_without_a_given_or_published_set(tiny):
    assert [artefact.label for artefact in configured_drafter_plan("self-spec", tiny)] == ["skip set of tiny-random"]
    assert SelfSpeculative(skip={"attention": [1], "mlp": []}).artefacts(tiny) == []
    published = SelfSpeculative(published_skip_sets={"tiny-random": {"attention": [1], "mlp": [0]}})
    assert published.artefacts(tiny) == []
    published.prepare(tiny)
    assert published.sources()["skip_set"] == {"published": "tiny-random", "attention": [1], "mlp": [0]}


def configured_drafter_plan(name, target):
    from hydra.utils import instantiate

    return instantiate(compose([f"drafter={name}", "model=tiny-random"]).drafter).artefacts(target)


class Interrupted(Exception):
    pass


def _scripted_score(stop_at=None):
    """A deterministic objective (what a wall clock cannot be in a test): more skipped attentions score higher."""
    calls = []

    def score(skip):
        if stop_at is not None and len(calls) == stop_at:
            raise Interrupted
        calls.append(skip)
        return 10.0 + len(skip.attention) - 0.5 * len(skip.mlp)

    return score, calls


def test_an_interrupted_search_resumes_where_it_stopped_and_finds_what_an_uninterrupted_one_does(tiny, tmp_path):
    settings = search_settings({"iterations": 6}, None)
    whole, _ = _scripted_score()
    found, record = search_skip_set(tiny, settings, tmp_path / "a.jsonl", whole)
    progress = tmp_path / "b.jsonl"
    first, first_calls = _scripted_score(stop_at=3)
    with pytest.raises(Interrupted):
        search_skip_set(tiny, settings, progress, first)
    lines = progress.read_text().splitlines()
    assert len(lines) == 3
    progress.write_text("\n".join(lines) + "\n" + lines[-1][:20])  # the line being written when it was stopped
    rest, rest_calls = _scripted_score()
    resumed, resumed_record = search_skip_set(tiny, settings, progress, rest)
    assert len(rest_calls) == 3 and first_calls + rest_calls == whole_calls(settings, tiny, tmp_path)
    assert resumed == found and resumed_record["attention"] == record["attention"]
    assert len(progress.read_text().splitlines()) == 6
    other = search_settings({"iterations": 6, "seed": 2}, None)
    again, again_calls = _scripted_score()
    search_skip_set(tiny, other, progress, again)  # another search's progress is not read
    assert len(again_calls) == 6


def whole_calls(settings, tiny, tmp_path):
    score, calls = _scripted_score()
    search_skip_set(tiny, settings, tmp_path / "c.jsonl", score)
    return calls


def test_the_optimiser_leans_toward_what_scored_well():
    """With a clear optimum the upper bound's pick moves to it: after random points on a slope, the suggestion
    lies further up the slope than the random points' mean (bayes_opt's behaviour, not its numbers)."""
    optimizer = GaussianProcessUCB(4, kappa=0.1, alpha=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(30):
        point = rng.uniform(size=4)
        optimizer.register(point, float(point.sum()))
    suggestion = optimizer.suggest(np.random.default_rng(1))
    assert suggestion.sum() > np.mean([point.sum() for point in optimizer.points]) + 0.5
    assert optimizer.best()[1] == max(optimizer.scores)


@pytest.mark.slow
@torch.inference_mode()
def test_the_searched_set_is_built_once_published_and_read_back(tiny, tmp_path, prompt_ids):
    drafter = configured_drafter("self-spec", tiny, overrides=[f"drafter.cache_dir={tmp_path}"])
    source = drafter.sources()["skip_set"]
    record = json.loads((tmp_path / "skip-sets").glob("*/skip_set.json").__next__().read_text())
    assert source["attention"] == record["attention"] and record["iterations"] == 3
    generation = Decoder(tiny.target, frozenset(), 64).generate(prompt_ids[0], drafter, 32)
    assert generation.token_ids == greedy_reference(tiny.weights.module, prompt_ids[0], 32)
