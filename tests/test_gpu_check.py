"""scripts/gpu_check.py, the prepared GPU check (docs/gpu.md), keeps working: its CPU quick mode prints the table,
writes the JSON and passes every row it runs (the GPU-only rows are SKIP on a CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
