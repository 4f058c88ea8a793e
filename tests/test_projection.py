"""``python -m analysis project``: a run's steps through another device's verify curve (analysis/projection.py),
on hand-built steps whose projection is computed by hand, and on the GPU check's and a run's curve files."""

import json

import numpy as np
import pandas as pd
import pytest
from test_analysis import LATENCY, synthetic_run

from analysis.__main__ import main as analysis_main
from analysis.projection import Curve, project_run, read_curve
from specbench.errors import SpecbenchError

GPU = {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.016}


def steps(question, rows):
    """A question's steps: (step, verify_tokens, accepted_tokens, draft_s, overhead_s) each."""
    return pd.DataFrame([{"question_id": question, "step": step, "verify_tokens": verify, "accepted_tokens": accepted,
                          "draft_s": draft, "overhead_s": overhead, "verify_s": 1.0}
                         for step, verify, accepted, draft, overhead in rows])


def test_a_compiled_curve_runs_a_pass_at_the_smallest_bucket_that_holds_it():
    curve = Curve(GPU, bucketed=True, label="gpu")
    assert curve.target_seconds([1, 3, 4, 5, 8]).tolist() == [0.010, 0.012, 0.012, 0.016, 0.016]
    with pytest.raises(SpecbenchError, match="2 steps verify more than 8 tokens"):
        curve.target_seconds([9, 3, 12])
    eager = Curve(GPU, bucketed=False, label="gpu")  # interpolated, as the throughput model reads latencies
    assert eager.target_seconds([3, 6]).round(4).tolist() == [0.0115, 0.014]


def test_a_runs_projection_is_its_tokens_over_the_curves_passes_bracketed_by_the_host():
    # Question 1: the prefill (left out: AR pays it too), then 3 steps accepting 3, 2, 1 of 4, 3, 1 tokens verified.
    first = steps(1, [(0, 50, 1, 0.0, 0.0), (1, 4, 3, 0.001, 0.001), (2, 3, 2, 0.001, 0.001), (3, 1, 1, 0.0, 0.002)])
    # Question 2: one step accepting 4 of 8.
    second = steps(2, [(0, 40, 1, 0.0, 0.0), (1, 8, 4, 0.002, 0.0)])
    found = project_run(pd.concat([first, second]), Curve(GPU, bucketed=True, label="gpu"))
    free = [6 / (0.012 + 0.012 + 0.010), 4 / 0.016]  # buckets 4, 4, 1; then 8
    measured = [6 / (0.034 + 0.006), 4 / (0.016 + 0.002)]
    ar = [1 / 0.010, 1 / 0.010]  # one token per one-token pass
    assert found["questions"] == 2 and found["mat"] == pytest.approx(10 / 4)
    assert found["speedup_host_free"] == pytest.approx(np.mean(free) / np.mean(ar))
    assert found["speedup_host_measured"] == pytest.approx(np.mean(measured) / np.mean(ar))
    assert found["ar_tps"] == pytest.approx(100.0)


def check_file(tmp_path, curves, name="6 verify ms eager vs compiled at 1000 ctx, AR pass vs floor"):
    path = tmp_path / "check.json"
    data = {"curves": {mode: {str(q): s for q, s in curve.items()} for mode, curve in curves.items()},
            "device_name": "NVIDIA H200", "dtype": "float16", "context": 1000, "bytes_per_pass": 13_476_839_424}
    path.write_text(json.dumps({"rows": [{"name": "3 verify latency", "status": "PASS", "detail": ""},
                                         {"name": name, "status": "PASS", "detail": "", "data": data}]}))
    return path


def test_the_gpu_checks_fastest_compiled_curve_is_read_unless_a_mode_is_named(tmp_path):
    path = check_file(tmp_path, {"eager": {1: 0.03, 8: 0.04}, "none": {1: 0.012, 8: 0.02},
                                 "default": {1: 0.011, 8: 0.019}})
    chosen = read_curve(path)
    assert chosen.seconds == {1: 0.011, 8: 0.019} and chosen.bucketed and "NVIDIA H200, float16, default" in chosen.label
    assert chosen.bytes_per_pass == 13_476_839_424
    eager = read_curve(path, "eager")
    assert not eager.bucketed and eager.seconds[1] == 0.03
    with pytest.raises(SpecbenchError, match="--mode max: .* has curves for eager, none, default"):
        read_curve(path, "max")


@pytest.mark.parametrize("text,reason", [("{", "cannot be read as JSON"), ('{"rows": []}', "no verify curve in it"),
                                         ('{"latency_s": {"2": 0.1}}', "no one-token pass"),
                                         ('{"latency_s": {"1": -1}}', "out of range"),
                                         ('{"latency_s": {"one": 0.1}}', "not a number")])
def test_a_curve_file_that_cannot_be_used_is_one_line(tmp_path, text, reason):
    path = tmp_path / "curve.json"
    path.write_text(text)
    with pytest.raises(SpecbenchError, match=reason) as error:
        read_curve(path)
    assert "\n" not in str(error.value)


def test_the_command_projects_a_run_through_its_own_calibration_and_a_gpu_curve(tmp_path, capsys):
    run = synthetic_run(tmp_path / "runs" / "pld-1", "pld", accepted=2, verify_tokens=(3,), seed=1,
                        overhead_s=0.001)
    analysis_main(["project", str(run), "--curve", str(run / "verify_latency.json")])
    out = capsys.readouterr().out
    # Through the run's own latencies, host free: 2 tokens per 60 ms pass against 1 per 50 ms.
    line = next(line for line in out.splitlines() if " pld " in f" {line} ")
    assert [float(value) for value in line.split()[-3:-1]] == pytest.approx(
        [round(2 / 0.060 / 20, 2), round(2 / 0.061 / 20, 2)], abs=0.006)
    assert f"t(1) {LATENCY[1] * 1e3:.2f} ms" in out
    check = check_file(tmp_path, {"eager": {1: 0.02, 2: 0.022, 4: 0.024}, "none": {1: 0.008, 4: 0.01}})
    analysis_main(["project", str(run), "--curve", str(check)])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if " pld " in f" {line} ")
    assert float(line.split()[-3]) == pytest.approx(round(2 / 0.010 * 0.008, 2), abs=0.006)  # bucket 4, t(1) 8 ms


def test_the_command_needs_a_curve_and_only_project_takes_one(tmp_path, capsys):
    run = synthetic_run(tmp_path / "runs" / "pld-1", "pld", accepted=2, verify_tokens=(3,), seed=1)
    for argv, reason in ((["project", str(run)], "project needs --curve"),
                         (["tables", str(run), "--curve", "x.json"], "--curve is for project, not tables")):
        with pytest.raises(SystemExit) as exit_status:
            analysis_main(argv)
        assert exit_status.value.code == 2 and reason in capsys.readouterr().err
