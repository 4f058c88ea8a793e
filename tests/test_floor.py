"""The machine's floor for one target pass and the run's cost curve beside it (specbench.measure.floor): the bytes a
pass reads, the bandwidth probed once per machine and size, the curve in summary.json, the console and the report."""

from __future__ import annotations

import json
import logging
import math
from collections import namedtuple

import pytest
import torch

from specbench.config import compose
from specbench.measure import floor
from specbench.measure.floor import (bytes_read_per_pass, cost_curve, describe_curve, machine_bandwidth,
                                     probe_bandwidth, probe_size, verify_medians)
from specbench.runner import run_benchmark

CPU = torch.device("cpu")
Step = namedtuple("Step", "step verify_tokens verify_s")  # a row of steps.parquet, as much as the curve reads


def test_a_pass_reads_every_weight_once_and_of_an_untied_input_table_nothing():
    embedding = torch.zeros(100, 8)
    head_weight = torch.zeros(100, 8)
    # 1,000 parameters of 4 bytes; the tied table is the head, read whole
    assert bytes_read_per_pass(1000, 4, embedding, embedding) == 4000
    # untied: the 800-parameter input table is looked up row by row, not streamed
    assert bytes_read_per_pass(1000, 4, embedding, head_weight) == 4000 - 800 * 4
    assert bytes_read_per_pass(1000, 2, embedding, None) == 2000 - 800 * 2  # a packed head has no plain weight
    assert bytes_read_per_pass(1000, 4, None, head_weight) == 4000


def test_the_probe_reads_the_pass_s_own_size_within_its_bounds():
    assert probe_size(538_060_032) == 538_060_032  # SmolLM2-135M in float32: a read of its own size
    assert probe_size(10) == floor.PROBE_MIN_BYTES
    assert probe_size(14 << 30) == floor.PROBE_CAP_BYTES  # a 7B model in half precision: a gigabyte suffices


def test_the_probe_measures_a_finite_positive_rate():
    rate = probe_bandwidth(CPU, 4 << 20, repeats=2)
    assert math.isfinite(rate) and rate > 1e6  # any machine reads 4 MB at more than a megabyte a second


def test_the_bandwidth_is_probed_once_per_machine_and_size_and_kept(tmp_path):
    probed = []

    def probe(device, read_bytes):
        probed.append(read_bytes)
        return 2e10 + len(probed)

    first = machine_bandwidth(tmp_path, CPU, 2, 300 << 20, probe=probe)
    again = machine_bandwidth(tmp_path, CPU, 2, 300 << 20, probe=probe)
    assert (first["cached"], again["cached"]) == (False, True) and probed == [300 << 20]
    assert again["bytes_per_s"] == first["bytes_per_s"] == 2e10 + 1
    # other threads, another size: another entry beside the first
    other_threads = machine_bandwidth(tmp_path, CPU, 1, 300 << 20, probe=probe)
    other_size = machine_bandwidth(tmp_path, CPU, 2, 600 << 20, probe=probe)
    assert not other_threads["cached"] and not other_size["cached"] and len(probed) == 3
    assert len(json.loads((tmp_path / floor.BANDWIDTH_FILE).read_text())) == 3
    assert "threads=2" in first["key"] and "threads=1" in other_threads["key"]


def test_a_cache_that_cannot_be_written_costs_a_probe_per_run_not_the_run(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache directory would be")
    with caplog.at_level(logging.WARNING, logger="specbench"):
        found = machine_bandwidth(blocked / "machine", CPU, 2, 300 << 20, probe=lambda device, size: 3e10)
    assert found["bytes_per_s"] == 3e10 and not found["cached"]
    assert any("could not keep the bandwidth" in record.getMessage() and "SPECBENCH_CACHE" in record.getMessage()
               for record in caplog.records)


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", None, 0, -5.0, "NaN", True])
def test_a_damaged_bandwidth_cache_is_probed_again_never_trusted(tmp_path, damage):
    path = tmp_path / floor.BANDWIDTH_FILE
    key = floor.machine_key(CPU, 2, 300 << 20)
    if isinstance(damage, str) and damage.startswith(("{", "[")):
        path.write_text(damage)
    else:
        path.write_text(json.dumps({key: float("nan") if damage == "NaN" else damage}))
    found = machine_bandwidth(tmp_path, CPU, 2, 300 << 20, probe=lambda device, size: 3e10)
    assert found == {"bytes_per_s": 3e10, "key": key, "cached": False}
    assert json.loads(path.read_text())[key] == 3e10


def test_verify_medians_leave_out_prefills_unreadable_times_and_sizes_seen_too_rarely():
    rows = [(0, 300, 9.0)]  # a prefill
    rows += [(step, 4, 0.050 + 0.001 * step) for step in range(1, 6)]  # five of size 4
    rows += [(step, 2, 0.040) for step in range(1, 5)]  # four of size 2: too few
    rows += [(9, 4, None), (10, 4, float("nan")), (11, 4, -1.0), (12, 0, 0.1)]
    rows = [Step(*row) for row in rows]
    assert verify_medians(rows) == {4: pytest.approx(0.053)}


def test_the_curve_puts_each_size_over_ar_s_pass_and_ar_s_pass_over_the_floor():
    bandwidth = {"bytes_per_s": 2.0e10, "key": "k", "cached": True}
    curve = cost_curve({2: 0.060, 8: 0.090}, 0.050, 500_000_000, bandwidth)
    assert curve["floor_s"] == pytest.approx(0.025)
    assert curve["ar_pass_over_floor"] == pytest.approx(2.0)
    assert curve["relative_to_ar_pass"] == {"2": pytest.approx(1.2), "8": pytest.approx(1.8)}
    line = describe_curve(curve)
    assert line == ("AR's pass 50.0 ms, 2.0x the machine's floor (25.0 ms: 500 MB of weights at 20.0 GB/s); "
                    "verify of q tokens over AR's pass: 2:1.20 8:1.80")
    # what is unknown stays None and out of the line
    unknown = cost_curve({}, None, 0, None)
    assert unknown["floor_s"] is None and unknown["ar_pass_over_floor"] is None and unknown["relative_to_ar_pass"] is None
    assert describe_curve(unknown) is None
    assert describe_curve(cost_curve({2: 0.06}, 0.05, 500_000_000, None)) == "verify of q tokens over AR's pass: 2:1.20"


def test_a_run_records_its_curve_beside_the_floor_of_its_own_weights(tmp_path, monkeypatch):
    from analysis.report import cost_rows
    from specbench.results.console import format_summary_table

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    probed = []
    monkeypatch.setattr(floor, "probe_bandwidth", lambda device, size, repeats=5: probed.append(size) or 1e9)
    overrides = ["model=tiny-random", "run.max_new_tokens=24", "task.tasks=[qa,translation]", "task.limit_per_task=1",
                 "run.warmup_runs=0", "drafter=pld"]
    summary = run_benchmark(compose(overrides), str(tmp_path / "run"))
    curve = summary["cost_curve"]
    header = summary["pass_floor"]
    assert probed == [probe_size(header["bytes_per_pass"])] and header["bandwidth"]["bytes_per_s"] == 1e9
    assert curve["bytes_per_pass"] == header["bytes_per_pass"] > 0
    assert curve["floor_s"] == pytest.approx(header["bytes_per_pass"] / 1e9)
    assert curve["ar_pass_s"] > 0 and curve["ar_pass_over_floor"] == pytest.approx(curve["ar_pass_s"] / curve["floor_s"])
    assert curve["verify_s"] and set(curve["relative_to_ar_pass"]) == set(curve["verify_s"])
    assert "cost of a pass: AR's pass" in format_summary_table(summary)
    # the report's row reads the same summary; a second run on this machine does not probe again
    [row] = cost_rows([str(tmp_path / "run")]).to_dict("records")
    assert row["ar_over_floor"] == pytest.approx(curve["ar_pass_over_floor"])
    run_benchmark(compose(overrides), str(tmp_path / "again"))
    assert len(probed) == 1


def test_a_target_spread_over_processes_has_no_one_machine_floor(tiny):
    from specbench.engines.specbench_loop import SpecbenchLoop

    class TwoProcesses:
        world_size = 2

    engine = SpecbenchLoop.__new__(SpecbenchLoop)
    engine.model, engine.processes = tiny, TwoProcesses()
    assert engine.pass_floor() is None
