"""The test kit (specbench/testing.py) that tests/ and scripts/gpu_check.py share: the counting Target counts what
it says and changes nothing it wraps; the throw-away cache is isolated and recorded; the tiny model, the greedy
reference and the drafter factory are the configured ones."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from specbench import testing
from specbench.decoding.loop import Decoder
from specbench.drafters.ar import NoDraft
from specbench.testing import CountingTarget, greedy_reference, greedy_reference_with_top


def test_the_counting_target_counts_a_transformers_targets_transfers_and_changes_nothing(tiny, prompt_ids):
    ids = prompt_ids[1]
    counted = CountingTarget(tiny.target)
    generation = Decoder(counted, frozenset(), 8).generate(ids, NoDraft(), 6)
    assert generation.token_ids == greedy_reference(tiny.weights.module, ids, 6)
    passes = len(generation.steps)  # the prefill and one verify per step
    # One blocking read per pass; uploads: the prompt, then each verify's ids, positions and mask block; the
    # default clock fences at every phase boundary, through the wrapper.
    assert counted.counts["passes"] == counted.counts["reads"] == passes
    assert counted.counts["uploads"] == 1 + 3 * (passes - 1)
    assert counted.counts["syncs"] >= passes
    # The wrapped target is untouched: nothing patched on it, its transfers count nowhere, it decodes the same.
    assert "_download" not in vars(tiny.target) and "_upload_to" not in vars(tiny.target)
    before = dict(counted.counts)
    assert Decoder(tiny.target, frozenset(), 8).generate(ids, NoDraft(), 6).token_ids == generation.token_ids
    assert counted.counts == before


def test_the_counting_target_counts_any_other_target_at_its_interface(tiny, prompt_ids):
    inner = CountingTarget(tiny.target)
    outer = CountingTarget(inner)  # a CountingTarget is no TransformersTarget: counted at the interface
    generation = Decoder(outer, frozenset(), 8).generate(prompt_ids[0], NoDraft(), 4)
    assert outer.counts["passes"] == outer.counts["reads"] == inner.counts["passes"] == len(generation.steps)
    assert outer.counts["uploads"] == 0 and outer.counts["syncs"] == inner.counts["syncs"] > 0
    earlier = dict(outer.counts)
    uploaded = outer.upload(np.arange(3, dtype=np.int64), "test")
    assert uploaded.tolist() == [0, 1, 2]
    assert outer.since(earlier) == {"passes": 0, "syncs": 0, "reads": 0, "uploads": 1}
    assert (outer.vocab_size, outer.num_layers, outer.device) == (tiny.target.vocab_size, tiny.target.num_layers,
                                                                  tiny.target.device)


def test_the_isolated_cache_is_new_recorded_named_by_the_environment_and_holds_the_test_corpus(tmp_path,
                                                                                             monkeypatch):
    real = tmp_path / "real"
    monkeypatch.setenv("SPECBENCH_CACHE", str(real))  # restored after the test: the session's cache stays
    made = []
    cache = testing.isolated_cache("specbench-kit-test-", share_models=False, on_made=made.append)
    try:
        assert made == [cache] and cache.name.startswith("specbench-kit-test-")
        assert os.environ["SPECBENCH_CACHE"] == str(cache)
        corpus = cache / "corpora" / "python-docs" / "corpus.txt"
        assert corpus.read_text() == testing.TEST_CORPUS.read_text()
        assert not (cache / "models").exists() and not real.exists()
    finally:
        shutil.rmtree(cache)
    monkeypatch.setenv("SPECBENCH_CACHE", str(real))
    shared = testing.isolated_cache("specbench-kit-test-", share_models=True)
    try:
        assert (shared / "models").is_symlink() and (shared / "models").resolve() == (real / "models").resolve()
        assert (real / "models").is_dir()
    finally:
        shutil.rmtree(shared)


def test_the_tiny_model_is_the_configured_one_and_refuses_a_setting_it_does_not_have(tiny):
    again = testing.tiny_random()
    assert again.name == "tiny-random" and again.weights.architecture["num_hidden_layers"] == 2
    reference = dict(tiny.weights.module.state_dict())
    assert all(bool((tensor == reference[name]).all()) for name, tensor in again.weights.module.state_dict().items())
    with pytest.raises(TypeError, match="no setting"):
        testing.tiny_random(hidden_layers=3)


def test_the_greedy_reference_with_top_gives_greedys_tokens_and_each_steps_best(tiny, prompt_ids):
    ids = prompt_ids[2]
    tokens, (top_ids, top_logits) = greedy_reference_with_top(tiny.weights.module, ids, 5, top_k=4)
    assert tokens == greedy_reference(tiny.weights.module, ids, 5)
    assert top_ids.shape == top_logits.shape == (5, 4)
    assert top_ids[:, 0].tolist() == tokens and (np.diff(top_logits, axis=1) <= 0).all()


def test_the_drafter_factory_composes_the_config_with_overrides_and_a_small_model_database(tiny):
    assert testing.small_model_db(8, 64) == ["drafter.model_db_build.max_prompts=8",
                                             "drafter.model_db_build.max_new_tokens=64"]
    assert testing.SMALL_MODEL_DB == testing.small_model_db()
    assert testing.configured_drafter("pld", tiny).num_draft_tokens == 10  # conf/drafter/pld.yaml
    assert testing.configured_drafter("pld", tiny, overrides=["drafter.num_draft_tokens=3"]).num_draft_tokens == 3


def test_the_kit_imports_no_pytest():
    """scripts/gpu_check.py runs the kit on a GPU machine that has no pytest."""
    source = Path(testing.__file__).read_text()
    assert "import pytest" not in source and "from pytest" not in source
