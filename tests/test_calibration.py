"""The start-up calibration returns the policy the decoder follows (``DecodePolicy``) instead of setting the
decoder's attributes from outside; the padding and the budget it decides, and verify_latency.json, are pinned."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from specbench.decoding.loop import DecodePolicy, Decoder, VerifyShapes
from specbench.distributed import Processes
from specbench.drafters.ar import NoDraft
from specbench.engines.calibration import calibrate, calibrate_run
from specbench.settings import RunSettings

# 2 and 3 tokens cost more than 4 (as small products do on a 2-core CPU): both pad to 4.
LATENCIES = {1: 0.010, 2: 0.030, 3: 0.028, 4: 0.012, 5: 0.040}


def test_calibration_returns_the_policy_and_leaves_the_decoder_alone(tiny, prompt_ids):
    decoder = Decoder(tiny.target, frozenset(), 4)
    settings = RunSettings(verify_padding="auto", draft_budget="auto", verify_padding_max=5)
    latencies, policy = calibrate(settings, tiny, decoder, prompt_ids[0], measured=LATENCIES)
    assert latencies == LATENCIES
    assert [policy.verify_shapes.padded(size) for size in range(1, 6)] == [1, 4, 4, 4, 5]
    assert policy.verify_cost.latencies == LATENCIES and policy.draft_budget is not None
    # The budget prices a draft at its padded shape: 2 tokens cost what 4 do.
    assert policy.draft_budget.cost(np.array([2]))[0] == policy.verify_cost(np.array([4]))[0]
    assert decoder.verify_shapes.pad_to == [] and decoder.draft_budget is None and decoder.verify_cost is None
    decoder.use_policy(policy)
    assert decoder.verify_shapes is policy.verify_shapes and decoder.draft_budget is policy.draft_budget
    assert decoder.verify_cost is policy.verify_cost


def test_padding_alone_brings_no_budget_and_nothing_on_measures_nothing(tiny, prompt_ids):
    decoder = SimpleNamespace()  # no measure_verify_latency: nothing may be measured
    padding = RunSettings(verify_padding="auto", verify_padding_max=5)
    _, policy = calibrate(padding, tiny, decoder, prompt_ids[0], measured=LATENCIES)
    assert policy.verify_cost is None and policy.draft_budget is None and policy.verify_shapes.padded(2) == 4
    latencies, policy = calibrate(RunSettings(), tiny, decoder, prompt_ids[0])
    assert latencies == {} and policy.verify_shapes.pad_to == [] and policy.draft_budget is policy.verify_cost is None


def test_a_decoder_following_a_padding_policy_gives_the_same_answer(tiny, prompt_ids):
    prompt_ids = prompt_ids[0]
    plain = Decoder(tiny.target, frozenset(), 4).generate(prompt_ids, NoDraft(), 12)
    padded = Decoder(tiny.target, frozenset(), 4)
    padded.use_policy(DecodePolicy(verify_shapes=VerifyShapes([0, 3, 3, 3])))
    generation = padded.generate(prompt_ids, NoDraft(), 12)
    assert generation.token_ids == plain.token_ids
    assert {step.verify_tokens for step in generation.steps[1:]} == {3}  # one token verified, padded to three


def test_the_run_records_what_it_measured_and_a_resumed_run_reuses_it(tiny, prompt_ids, tmp_path, monkeypatch):
    prompt_ids = prompt_ids[0]
    decoder = Decoder(tiny.target, frozenset(), 4)
    measured = []
    monkeypatch.setattr(decoder, "measure_verify_latency",
                        lambda ids, sizes, repeats: measured.append(sizes) or {size: LATENCIES[size] for size in sizes})
    settings = RunSettings(verify_padding="auto", verify_padding_max=4, max_draft_tokens=4, calibration_repeats=1,
                           calibration_sizes=[1, 2, 3, 4])
    calibrate_run(settings, tiny, decoder, prompt_ids, tmp_path, Processes())
    assert json.loads((tmp_path / "verify_latency.json").read_text()) == {
        "latency_s": {str(size): LATENCIES[size] for size in measured[0]},
        "pad_to": {"2": 4, "3": 4}, "context_len": len(prompt_ids)}
    assert decoder.verify_shapes.padded(2) == 4
    resumed = Decoder(tiny.target, frozenset(), 4)
    monkeypatch.setattr(resumed, "measure_verify_latency", lambda *args, **kwargs: 1 / 0)  # must not measure
    calibrate_run(settings, tiny, resumed, prompt_ids, tmp_path, Processes())
    assert resumed.verify_shapes.pad_to == decoder.verify_shapes.pad_to
