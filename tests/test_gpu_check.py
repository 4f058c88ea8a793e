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


def gpu_check_module():
    """scripts/gpu_check.py imported as a module (its command runs only as __main__)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_under_test", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpus,processes,where", [(1, 2, "cpu"), (2, 2, "cuda"), (4, 4, "cuda")])
def test_the_tensor_parallel_row_hides_cuda_from_its_cpu_processes(monkeypatch, tmp_path, gpus, processes, where):
    import torch

    gpu_check = gpu_check_module()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)  # a CUDA machine, simulated
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    check = gpu_check.Check(torch.device("cpu"), quick=True)
    check.cuda = True
    found, found_where, command, env = gpu_check.tensor_parallel_launch(check, tmp_path / "tp.json")
    assert (found, found_where) == (processes, where)
    assert command[command.index("--nproc-per-node") + 1] == str(processes)
    assert command[command.index("--device") + 1] == where
    # CPU processes see no GPU, so transformers binds none of them to one (a one-GPU machine has no second)
    assert env.get("CUDA_VISIBLE_DEVICES") == ("" if where == "cpu" else None)
