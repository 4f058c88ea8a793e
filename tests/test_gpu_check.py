"""scripts/gpu_check.py, the prepared GPU check (docs/gpu.md), keeps working: its CPU quick mode prints the table,
writes the JSON and passes every row it runs (the GPU-only rows are SKIP on a CPU).

A slow test (about 30 s, on the embedded model; CI runs it, as .ci/run runs the slow tests). On a CPU its rows
check what default tests also pin (lossless decoding on the embedded model: test_embedded; near-ties in
bfloat16: test_mismatch; the round trips per step and where each operation's time lands: test_loop_phases;
tensor parallelism: test_tensor_parallel); what this test adds is that the script which runs them on a GPU
keeps working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_passes_on_the_cpu(tmp_path):
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "result  seconds  detail" in done.stdout and ", 0 FAIL, " in done.stdout  # the table and its summary
    rows = json.loads(out.read_text())["rows"]
    assert {row["status"] for row in rows} <= {"PASS", "SKIP"}, [row for row in rows if row["status"] == "FAIL"]
    names = " ".join(row["name"] for row in rows)
    for row_kind in ("1 lossless float32 pld", "2 bfloat16", "3 verify latency", "3 round trips", "3 step shares",
                     "4 device_map=cpu", "4 tensor parallel"):
        assert row_kind in names
    skipped = [row for row in rows if row["status"] == "SKIP"]
    assert all(row["name"].startswith(("2 float16", "4 device_map=auto")) for row in skipped), skipped
    for row in rows:
        assert row["name"] in done.stdout  # the table is printed, every row in it
