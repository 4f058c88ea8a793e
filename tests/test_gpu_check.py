"""scripts/gpu_check.py, the prepared GPU check (docs/gpu.md), keeps working: its CPU quick mode prints the table,
writes the JSON and passes every row it runs (the GPU-only rows are SKIP on a CPU). Its rows live in the library
(specbench.device_check; the measurements in specbench.measure.passes, the training comparison in
specbench.training.device_check), whose verdicts are checked here on hand-built numbers.

A slow test (about 30 s, on the embedded model; CI runs it, as .ci/run runs the slow tests). On a CPU its rows
check what default tests also pin (lossless decoding on the embedded model: test_embedded; near-ties in
bfloat16: test_mismatch; the round trips per step and where each operation's time lands: test_loop_phases;
tensor parallelism: test_tensor_parallel); what this test adds is that the script which runs them on a GPU
keeps working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
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
                     "3 loop verify vs its own pass", "4 device_map=cpu", "4 tensor parallel", "5 eagle head trains",
                     "5 eagle3 head trains", "5 medusa head trains", "5 hydra head trains",
                     "float32 compiled default: prepare", "6 compiled tokens vs eager", "6 verify ms eager vs compiled",
                     "6 AR step-time spread"):
        assert row_kind in names
    skipped = [row for row in rows if row["status"] == "SKIP"]
    assert all(row["name"].startswith(("2 float16", "4 device_map=auto", "6 no synchronisation")) for row in skipped), \
        skipped
    curve = next(row for row in rows if row["name"].startswith("6 verify ms"))["data"]
    assert set(curve["curves"]) == {"eager", "default"} and curve["floor_s"] > 0  # what analysis project reads
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

    from specbench.device_check import Check, tensor_parallel_launch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)  # a CUDA machine, simulated
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker = ROOT / "scripts" / "gpu_check.py"
    check = Check(torch.device("cpu"), quick=True, worker=worker)
    check.cuda = True
    found, found_where, command, env = tensor_parallel_launch(check, tmp_path / "tp.json")
    assert (found, found_where) == (processes, where)
    assert command[command.index("--tp-worker") - 1] == str(worker)  # the script's worker, under torchrun
    assert command[command.index("--nproc-per-node") + 1] == str(processes)
    assert command[command.index("--device") + 1] == where
    # CPU processes see no GPU, so transformers binds none of them to one (a one-GPU machine has no second)
    assert env.get("CUDA_VISIBLE_DEVICES") == ("" if where == "cpu" else None)


# Runs a gpu_check call with hydra and omegaconf unimportable, as on a GPU machine without the bundle.
WITHOUT_HYDRA = """
import json, runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("hydra", "omegaconf"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Blocked())
gpu_check = runpy.run_path(sys.argv[1], run_name="gpu_check_without_hydra")
status = gpu_check["main"](["--device", "cpu", "--quick", "--rows", "1,2", "--out", sys.argv[2]])
import torch
model = gpu_check["testing"].tiny_random(torch.device("cpu"))  # what rows 1-4 build, without hydra's composition
print(json.dumps({"status": status, "tiny": model.name, "loaded": sorted(set(sys.modules) & {"hydra", "omegaconf"})}))
"""


@pytest.mark.slow  # a process that imports torch and transformers: 10-30 s
def test_gpu_check_prints_its_table_without_hydra_and_omegaconf(tmp_path):
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, "-c", WITHOUT_HYDRA, str(ROOT / "scripts" / "gpu_check.py"), str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"status": 1, "tiny": "tiny-random", "loaded": []}
    assert "result  seconds  detail" in done.stdout and "0 PASS, 2 FAIL, 1 SKIP" in done.stdout
    rows = {row["name"]: row for row in json.loads(out.read_text())["rows"]}
    for name in ("1 lossless float32", "2 bfloat16 vs AR (mismatch classes)"):
        assert rows[name]["status"] == "FAIL" and "needs hydra-core and omegaconf" in rows[name]["detail"]


def top(rows: list[dict[int, float]]) -> tuple:
    """(top_ids, top_logits) [n, 2] from one {token: logit} per position."""
    import numpy as np

    ids = np.array([list(row) for row in rows])
    return ids, np.array([list(row.values()) for row in rows], dtype=np.float32)


def test_row_1_reports_a_near_tie_as_such_and_fails_a_violation():
    from specbench.decoding.loop import Generation
    from specbench.device_check import lossless_verdict

    reference = ([5, 6, 7], top([{5: 9.0, 1: 1.0}, {6: 4.0, 8: 3.9996}, {7: 2.0, 1: 0.0}]))

    def decode(tokens, rows):
        return Generation(tokens, top_ids=top(rows)[0], top_logits=top(rows)[1])

    same = decode([5, 6, 7], [{5: 9.0, 1: 1.0}, {6: 4.0, 8: 3.9996}, {7: 2.0, 1: 0.0}])
    tie = decode([5, 8, 7], [{5: 9.0, 1: 1.0}, {8: 4.0, 6: 3.9995}, {7: 2.0, 1: 0.0}])  # both within 1e-3
    wrong = decode([5, 8, 7], [{5: 9.0, 1: 1.0}, {8: 4.0, 6: 3.0}, {7: 2.0, 1: 0.0}])  # a margin of 1.0
    row = lossless_verdict("pld", [same], [reference])
    assert row.status == "PASS" and "== generate()" in row.detail and "near-tie" not in row.detail
    row = lossless_verdict("pld", [same, tie], [reference, reference])
    assert row.status == "PASS" and "1 of 2 prompts" in row.detail and "near-tie" in row.detail
    assert "prompt 1 at token 1" in row.detail
    row = lossless_verdict("pld", [tie, wrong], [reference, reference])
    assert row.status == "FAIL" and "prompt 1 at token 1" in row.detail and "prompt 0" not in row.detail


def test_the_round_trip_row_counts_synchronisations_inside_torch(monkeypatch):
    """On CUDA the row asks torch to warn at every synchronisation it makes; a CPU makes none, so a fake gives
    torch's warning at each blocking read and, where ``hidden`` says so, once more inside each verify pass (as an
    ``.item()`` there would), which no wrapper of the row sees."""
    import torch

    from specbench import device_check as gpu_check
    from specbench.measure.passes import TorchSyncs, round_trip_verdict
    from specbench.targets.transformers import TransformersTarget
    from specbench.testing import tiny_random

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def warn():
        warnings.warn("called a synchronizing CUDA operation", UserWarning)

    class WarningTarget(TransformersTarget):
        hidden = 0

        def _download(self, tensor):
            warn()
            return super()._download(tensor)

        def verify(self, *args, **kwargs):
            for _ in range(self.hidden):
                warn()
            return super().verify(*args, **kwargs)

    model = tiny_random(torch.device("cpu"))
    ids = gpu_check.random_prompt(24, 3) * 2
    verdicts = {}
    for hidden in (0, 1):
        target = WarningTarget(model.weights.module)
        target.hidden = hidden
        steps = gpu_check.count_round_trips(target, gpu_check.no_draft(), ids, 6, TorchSyncs(True))
        assert {(step["torch_syncs"], step["torch_expected"]) for step in steps[1:-1]} == {(1 + hidden, 1)}
        verdicts[hidden] = round_trip_verdict([("ar", steps[1:-1])])
    assert modes == ["warn", "default", "warn", "default"]
    assert verdicts[0][0] == "PASS" and "torch syncs [1]" in verdicts[0][1]
    assert verdicts[1][0] == "FAIL" and "syncs inside torch" in verdicts[1][1]
    # On a CPU nothing is counted, and the row says so
    steps = gpu_check.count_round_trips(model.target, gpu_check.no_draft(), ids, 6, TorchSyncs(False))
    status, detail = round_trip_verdict([("ar", steps[1:-1])])
    assert status == "PASS" and "torch syncs n/a (CPU)" in detail and len(modes) == 4


def test_the_loop_verify_row_times_the_passes_inside_the_loop_and_judges_only_on_a_gpu():
    """Row 3's loop-vs-pass check: ``PassTimes`` sees every pass of a decode (the prefill first) and gives the
    target its own method back; the verdict fails a drafter whose loop verify is over 1.5x the pass inside it, on a
    GPU; each step is set beside its own pass (one pass a step, or the row says what it found)."""
    import torch

    from specbench import device_check as gpu_check
    from specbench.measure.passes import PassTimes, ratio_verdict
    from specbench.testing import tiny_random

    model = tiny_random(torch.device("cpu"))
    target = model.target
    with PassTimes(target, cuda=False) as passes:
        generation = gpu_check.decoder(target).generate(gpu_check.random_prompt(24, 3) * 2, gpu_check.no_draft(), 6)
    assert len(passes.launch_s) == len(generation.steps) and all(seconds > 0 for seconds in passes.launch_s)
    assert passes.device_s == [] and "_forward" not in vars(target)  # the class's method again
    assert ratio_verdict({"ar": 1.1, "pld": 1.4}, judged=True) == "PASS"
    assert ratio_verdict({"ar": 1.1, "pld": 3.1}, judged=True) == "FAIL"
    assert ratio_verdict({"ar": 1.1, "pld": 3.1}, judged=False) == "PASS"
    status, detail = gpu_check.loop_verify_verdict(gpu_check.Check(torch.device("cpu"), quick=True), model)
    assert status == "PASS" and detail.count("median ratio") == 2 and "not judged on a CPU" in detail
    assert detail.count("vs its pass") == 2 and detail.count("alone afterwards") == 2
    # On a CPU the pass runs as it is queued: the loop's verify_s is that pass plus reading the choices back
    ratios = [float(text.split("median ratio ")[1].split("x")[0]) for text in detail.split("; ") if "median ratio" in text]
    assert all(0.5 < ratio < 3.0 for ratio in ratios), detail


def test_the_training_row_compares_the_devices_run_with_the_hosts():
    import torch

    from specbench.training import device_check as gpu_check

    initial = {"w": torch.zeros(4)}
    host = {"losses": [2.0, 1.5, 1.0], "seconds": 1.0, "devices": {"cpu"}, "initial": initial,
            "trained": {"w": torch.tensor([1.0, -1.0, 0.5, 0.0])}, "chain": torch.tensor([[3, 4], [5, -1]])}
    close = {**host, "devices": {"cuda:0"}, "losses": [2.0, 1.5001, 1.0002],
             "trained": {"w": torch.tensor([1.0, -1.0, 0.5, 1e-4])}}
    cuda = torch.device("cuda")
    assert gpu_check.training_verdict(close, host, cuda)[0] == "PASS"
    status, detail = gpu_check.training_verdict({**close, "devices": {"cpu"}}, host, cuda)
    assert status == "FAIL" and "parameters are on ['cpu']" in detail  # a head left on the host
    status, detail = gpu_check.training_verdict({**close, "losses": [2.0, 1.5, 1.2]}, host, cuda)
    assert status == "FAIL" and "losses differ" in detail
    status, detail = gpu_check.training_verdict({**close, "losses": [2.0, float("nan"), 1.0]}, host, cuda)
    assert status == "FAIL" and "not finite" in detail
    # a device whose updates went nowhere: its weights are where they started, a whole training's movement away
    status, detail = gpu_check.training_verdict({**close, "trained": initial}, host, cuda)
    assert status == "FAIL" and "trained weights 1 of the training's own movement" in detail
    status, detail = gpu_check.training_verdict({**close, "chain": torch.tensor([[3, 4], [6, -1]])}, host, cuda)
    assert status == "FAIL" and "75.0% of the chain tokens alike" in detail
    status, detail = gpu_check.training_verdict(close, {**host, "trained": initial}, cuda)
    assert status == "FAIL" and "training did not move the head on the host" in detail
    assert gpu_check.training_verdict(host, host, torch.device("cpu"))[0] == "PASS"


def test_the_measurements_of_row_3_are_library_functions_with_values():
    """specbench.measure.passes on hand-built times (exact in binary): each step beside its own pass (the longer of
    the host's queuing and the device's span), the median of the ratios; where the steps' time went."""
    import doctest
    from types import SimpleNamespace as Step

    from specbench.measure import passes

    assert doctest.testmod(passes).failed == 0
    assert passes.own_pass_seconds([0.5, 0.5], [0.25, 2.0]) == [0.5, 2.0]
    assert passes.own_pass_seconds([0.5, 0.25], []) == [0.5, 0.25]  # a CPU: the queuing alone
    assert passes.loop_verify_ratio([0.75, 4.0, 1.0], [0.5, 0.5, 0.5], [0.25, 2.0, 0.25]) == 2.0  # 1.5, 2, 2
    assert passes.loop_verify_ratio([0.75, 1.0], [0.5, 0.5], []) == 1.75
    with pytest.raises(ValueError, match="^3 verify passes for 2 steps: one pass a step expected$"):
        passes.loop_verify_ratio([0.75, 1.0], [0.5, 0.5, 0.5], [])
    assert passes.pass_bound([0.5, 0.25, 0.5], [0.515625, 0.25, 0.75]) == "host-bound"  # medians within 5%
    assert passes.pass_bound([0.5, 0.25, 0.5], [0.53125, 0.25, 0.75]) == "device-bound"  # 6.25% over
    shares = passes.step_shares([Step(draft_s=0.5, verify_s=1.0, overhead_s=0.5, verify_tokens=81),
                                 Step(draft_s=0.0, verify_s=2.0, overhead_s=0.0, verify_tokens=11)])
    assert shares == {"draft": 0.125, "verify": 0.75, "overhead": 0.125, "steps": 2, "verify_s": 1.5,
                      "max_tokens": 81}
    one_fence = {"syncs": 1, "reads": 1, "uploads": 3, "torch_syncs": None, "torch_expected": 0}
    assert passes.round_trip_verdict([("ar", [one_fence, one_fence])])[0] == "PASS"
    assert passes.round_trip_verdict([("ar", [one_fence, {**one_fence, "syncs": 2}])])[0] == "FAIL"
    assert passes.round_trip_verdict([("ar", [])])[0] == "FAIL"  # no step: nothing was checked


def test_the_training_checks_distances_and_build_verdict_have_values():
    import torch

    from specbench.training.device_check import build_verdict, weight_distance

    initial = {"w": torch.zeros(2)}
    here = {"initial": initial, "trained": {"w": torch.tensor([3.0, 4.0])}}  # moved 5
    assert weight_distance({"trained": {"w": torch.tensor([3.0, 4.0])}}, here) == 0.0
    assert weight_distance({"trained": {"w": torch.tensor([0.0, 4.0])}}, here) == 0.6  # 3 of 5
    assert weight_distance({"trained": initial}, here) == 1.0  # a device that never moved its head
    manifest = {"trained_on": "cuda:0 (NVIDIA H200)", "loss": {"first": 4.5, "last20": 2.25},
                "held_out_acceptance": {"acceptance": [0.5, 0.25, 0.125]}}
    assert build_verdict(manifest, torch.device("cuda")) == (
        "PASS", "trained on cuda:0 (NVIDIA H200), loss 4.5 -> 2.25, held out [0.5, 0.25]..., published and loaded back")
    assert build_verdict(manifest, torch.device("cpu")) == (
        "FAIL", "the manifest says it trained on cuda:0 (NVIDIA H200)")
    status, detail = build_verdict({**manifest, "loss": {"first": 4.5, "last20": float("nan")}}, torch.device("cuda"))
    assert (status, detail) == ("FAIL", "losses [4.5, nan]")


def test_the_script_is_a_thin_command_line():
    """scripts/gpu_check.py parses, runs the library's rows and prints: no timing, row or verdict of its own."""
    import ast

    tree = ast.parse((ROOT / "scripts" / "gpu_check.py").read_text())
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert defined == {"isolated_cache", "resolve", "environment", "row_groups", "main", "print_table"}


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python in scripts/gpu_bundle.sh: records each pip call, 'downloads' an empty wheel.
if [ "$1" = -c ]; then echo 1.0; exit 0; fi
echo "$*" >> "$CALLS"
while [ $# -gt 0 ]; do case "$1" in -d|-w) touch "$2/fake-1.0-py3-none-any.whl"; shift;; esac; shift; done
"""


def test_the_bundle_accepts_every_manylinux_tag_the_gpu_machine_runs(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PYTHON": str(fake), "CALLS": str(calls)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_bundle.sh"), str(tmp_path / "bundle"), "3.12", "2.31"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    download = next(line.split() for line in calls.read_text().splitlines() if line.startswith("-m pip download"))
    platforms = [download[index + 1] for index, word in enumerate(download) if word == "--platform"]
    # manylinux_2_28 wheels (pydivsufsort's newest) and every tag from glibc 2.31 down to manylinux2014's 2.17
    assert platforms == [f"manylinux_2_{minor}_x86_64" for minor in range(31, 16, -1)] + [
        "manylinux2014_x86_64", "manylinux1_x86_64"]
    assert 'python3 scripts/gpu_check.py --rows 1,2,3,4,tp,5 --out "$OUT/gpu_check.json"' in done.stdout  # under $OUT
    # Row 6 runs apart, under the bundled newer transformers and its dependencies, downloaded with them
    assert 'PYTHONPATH=/tmp/site6:/tmp/site python3 scripts/gpu_check.py --rows 6 --out "$OUT/gpu_check_6.json"' \
        in done.stdout
    transformers = [line for line in calls.read_text().splitlines() if "transformers==" in line]
    assert len(transformers) == 1 and "--no-deps" not in transformers[0] and "/bundle/transformers" in transformers[0]
    refused = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_bundle.sh"), str(tmp_path / "b2"), "3.12", "new"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and "GLIBC=new is not a glibc version" in refused.stderr


def test_the_documented_gpu_commands_use_python3_and_write_under_out():
    """The device tool's image has python3 (no python, no bare pip) and brings back only what is written under
    $OUT: the commands of docs/gpu.md, the script's docstring and the bundle's usage say so."""
    import re

    docs = (ROOT / "docs" / "gpu.md").read_text()
    blocks = "\n".join(re.findall(r"```\n(.*?)```", docs, flags=re.S))
    docstring = gpu_check_module().__doc__
    bundle = (ROOT / "scripts" / "gpu_bundle.sh").read_text()
    for where, text in (("docs/gpu.md", blocks), ("gpu_check.py's docstring", docstring), ("gpu_bundle.sh", bundle)):
        commands = [line.strip() for line in text.splitlines() if "gpu_check.py" in line and "--out" in line
                    or "pip install" in line]
        assert commands, where
        for command in commands:
            assert not re.search(r"(^|\s)(python|pip)\s", command.replace("-m pip", "")), (where, command)
        assert any('--out "$OUT/' in command or '--out "\\$OUT/' in command for command in commands), where


def test_row_6_under_a_transformers_before_the_compiled_regimes_floor_is_one_skip_naming_the_bundle(monkeypatch):
    """The GPU image's transformers (5.17) cannot run the compiled regime: row 6 says so in one SKIP row, pointing
    at the bundle's newer transformers, instead of failing every measurement after it."""
    import torch
    import transformers

    from specbench.compiled_check import compiled_rows
    from specbench.device_check import Check

    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    rows = compiled_rows(Check(torch.device("cpu"), quick=True))
    assert [(row.name, row.status) for row in rows] == [("6 compiled regime", "SKIP")]
    assert "transformers 5.17.0 is before 5.24" in rows[0].detail and "scripts/gpu_bundle.sh" in rows[0].detail
