"""engine=vllm for real, in the vLLM environment scripts/vllm_env.sh builds (CI builds it once per machine; .ci/run).

A default test: when this machine has no such environment it is skipped, saying so (pytest's -rs, in
pyproject.toml, prints the reason). It runs the environment's python on this checkout (PYTHONPATH), over
tiny-random with heads of 32 dimensions (vLLM's CPU attention has no kernel for tiny-random's default 16), about
90 s: two vLLM engines start (the method's and AR's), with enforce_eager so that torch.compile does not add
minutes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def vllm_python() -> str:
    found = subprocess.run([str(ROOT / "scripts" / "vllm_env.sh"), "--find"], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip("engine=vllm not tested: this machine has no vLLM environment (scripts/vllm_env.sh builds it "
                    "once, about 4 min and 3.9 GB; CI does)")
    return found.stdout.strip().splitlines()[-1]


TINY = ["model=tiny-random", "model.hidden_size=128", "task.tasks=[mt_bench,translation,qa]", "task.limit_per_task=1",
        "run.max_new_tokens=24", "engine=vllm", "engine.enforce_eager=true", "engine.max_model_len=1024"]


def specbench(python: str, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, whichever checkout the environment points at
    return subprocess.run([python, "-m", "specbench", *overrides], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


@pytest.mark.slow  # about 90 s: moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_vllm_engine_runs_pld_paired_and_under_load_on_tiny_random(tmp_path):
    python = vllm_python()
    run = tmp_path / "pld"
    done = specbench(python, *TINY, "drafter=pld", "engine.concurrency=[2]", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-4000:]

    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == "pld@vllm" and summary["environment"]["engine"].startswith("vllm")
    overall = summary["tasks"]["overall"]
    assert overall["questions"] == 3 and overall["identical_to_baseline"] == 3  # lossless against vLLM's AR
    assert overall["mean_accepted_tokens"] > 1  # tiny-random's loops give n-gram matches: vLLM's counts, read back

    steps = pd.read_parquet(run / "steps.parquet")
    assert steps[["draft_s", "verify_s", "overhead_s"]].isna().all().all()  # no step time is invented
    per_turn = steps.groupby(["question_id", "turn"])["accepted_tokens"].sum()
    assert (per_turn > 0).all() and steps["draft_tokens"].max() == 10  # ngram's 10 draft tokens (PLD's setting)

    run_json = json.loads((run / "run.json").read_text())
    assert run_json["engine"]["max_model_len"] == 1024
    assert run_json["vllm"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 10,
                                                       "prompt_lookup_max": 3, "prompt_lookup_min": 1}

    levels = [json.loads(line) for line in (run / "load.jsonl").read_text().splitlines()]
    assert [(level["concurrency"], level["role"]) for level in levels] == [(2, "baseline"), (2, "method")]
    method = levels[1]
    assert method["identical_to_baseline"] == method["requests"] == 3
    assert method["mean_acceptance_length"] > 1 and method["tpot_s"]["p99"] > 0
    for level in levels:  # the first token comes before the last (tests/test_vllm_engine.py pins which is which)
        assert 0 < level["ttft_s"]["p50"] < level["latency_s"]["p50"]
        assert level["ttft_s"]["mean"] < level["latency_s"]["mean"]
        assert level["warm_up"] == {"runs": 1, "max_new_tokens": 32}  # each level warmed at its concurrency first
    assert not (run / "engine_processes.json").exists()  # the run's processes ended with it

    again = specbench(python, *TINY, "drafter=pld", "engine.concurrency=[2]", f"hydra.run.dir={run}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "nothing to run" in again.stdout + again.stderr  # a finished run resumes without starting vLLM
    assert "EngineCore" not in again.stdout + again.stderr


def test_vllm_engine_refuses_a_drafter_it_lacks_in_one_line(tmp_path):
    python = vllm_python()
    done = specbench(python, *TINY, "drafter=hd", f"hydra.run.dir={tmp_path / 'hd'}", timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("specbench: error")]
    assert len(lines) == 1 and "drafter=hd" in lines[0] and "pld" in lines[0] and "eagle3" in lines[0]
    assert not (tmp_path / "hd").exists()


@pytest.mark.slow  # about 90 s (CI runs it)
def test_medusa_runs_on_vllm_as_medusa_at_vllm_and_eagle_with_an_fc_bias_is_refused(tmp_path):
    """drafter=medusa maps onto vLLM's medusa (a chain of each head's best token) over a copy of the heads vLLM reads
    whole, lossless against vLLM's AR; drafter=eagle's trained head has EAGLE's fc bias, which vLLM's EAGLE head
    lacks: refused in one line before the head is trained."""
    python = vllm_python()
    run = tmp_path / "medusa"
    done = specbench(python, *TINY, "drafter=medusa", "engine.concurrency=[2]", f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == "medusa@vllm" and summary["tasks"]["overall"]["identical_to_baseline"] == 3
    spec = json.loads((run / "run.json").read_text())["vllm"]["speculative_config"]
    assert spec["method"] == "medusa" and spec["num_speculative_tokens"] == 4 and "vllm-medusa-" in spec["model"]
    copied = json.loads((Path(spec["model"]) / "config.json").read_text())
    assert copied["medusa_fc_bias"] is True and copied["num_heads"] == 4 and copied["hidden_size"] == 128
    method = [json.loads(line) for line in (run / "load.jsonl").read_text().splitlines()][1]
    assert method["identical_to_baseline"] == 3 and method["drafts"] > 0

    refused = specbench(python, *TINY, "drafter=eagle", f"hydra.run.dir={tmp_path / 'eagle'}", timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("specbench: error")]
    assert "drafter=eagle on engine=vllm: its head (trained for tiny-random" in line and "fc layer with a bias" in line
    assert not (tmp_path / "eagle").exists()


@pytest.mark.slow  # about 60 s each (CI runs it)
@pytest.mark.parametrize("kill", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_a_killed_or_interrupted_run_leaves_no_vllm_process(tmp_path, kill):
    """Once both engines run (two EngineCore processes of the run), the run's process is killed (SIGKILL: an
    out-of-memory kill; SIGTERM) or interrupted (SIGINT to it alone, as a Ctrl-C that reached only it): within
    seconds no process of the run remains, found by the run's token (its record in the run directory) and by
    being below the run's process when it was killed."""
    import signal
    import time

    from specbench.run.owned_processes import PROCESSES_FILE, descendants, is_alive, processes_with_token

    python = vllm_python()
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([python, "-m", "specbench", *TINY, "task.limit_per_task=3", "run.max_new_tokens=200",
                                "drafter=pld", "engine.concurrency=[2]", f"hydra.run.dir={run}"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, engines = time.monotonic() + 400, []
        while time.monotonic() < deadline and process.poll() is None:
            if (run / PROCESSES_FILE).is_file():
                token = json.loads((run / PROCESSES_FILE).read_text())["token"]
                engines = processes_with_token(token)
                if sum("EngineCore" in info.command for info in engines) >= 2:
                    break
            time.sleep(0.5)
        assert sum("EngineCore" in info.command for info in engines) >= 2, "vLLM's two engines never started"
        time.sleep(3)  # into the warm-up or the questions
        owned = {(info.pid, info.start) for info in processes_with_token(token) + descendants(process.pid)}
        os.kill(process.pid, getattr(signal, kill))
        status = process.wait(timeout=120)
        assert status == {"SIGKILL": -9, "SIGTERM": -15, "SIGINT": 130}[kill], process.stderr.read()[-3000:]
        deadline = time.monotonic() + 15
        def left():
            return [pid for pid, start in owned if is_alive({"pid": pid, "start": start})]

        while time.monotonic() < deadline and left():
            time.sleep(0.2)
        assert len(owned) >= 3 and left() == [] and processes_with_token(token) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --- engine=vllm-custom: specbench's drafters inside vLLM's step -------------------------------------------------

FAULTS = ROOT / "tests" / "fixtures" / "proposer_faults"  # a sitecustomize that injects a fault into the proposer


@pytest.mark.slow  # about 3 min: two runs, each starting two vLLM engines (CI runs it)
def test_specbench_drafters_run_inside_vllm_losslessly_batch_1_and_under_load(tmp_path):
    """drafter=pld and drafter=hd-chains through vLLM's custom_class proposer: every answer identical to vLLM's AR,
    batch 1 and with 2 requests in flight, under their names (hd-chains' trees cut to their best chain: +chain), the
    proposer's cost recorded per level, and vLLM given the proposer's longest chain."""
    python = vllm_python()
    for drafter, label, longest in (("pld", "pld", 10), ("hd-chains", "hd-chains+chain", 4)):
        run = tmp_path / drafter
        done = specbench(python, *TINY, "engine=vllm-custom", f"drafter={drafter}", "engine.concurrency=[2]",
                         *(["drafter.model_db_build.max_prompts=8", "drafter.model_db_build.max_new_tokens=32"]
                           if drafter == "hd-chains" else []), f"hydra.run.dir={run}")
        assert done.returncode == 0, done.stderr[-4000:]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["method"] == f"{label}@vllm-custom"
        assert summary["tasks"]["overall"]["identical_to_baseline"] == 3  # lossless against vLLM's AR
        run_json = json.loads((run / "run.json").read_text())
        assert run_json["vllm"]["speculative_config"] == {
            "method": "custom_class", "model": "specbench.engines.vllm_proposer.SpecbenchProposer",
            "num_speculative_tokens": longest}
        levels = [json.loads(line) for line in (run / "load.jsonl").read_text().splitlines()]
        baseline, method = levels
        assert baseline["method"] == "ar@vllm-custom" and baseline["proposer"] is None
        assert method["identical_to_baseline"] == 3 and method["drafts"] > 0
        proposer = method["proposer"]
        assert proposer["calls"] > 0 and proposer["requests"] >= proposer["calls"] and proposer["draft_s"] > 0
        assert proposer["forks_started"] == 3  # one fork per request, none rebuilt
        assert proposer["rebuilt"] == 0
        assert not (run / "engine_processes.json").exists()


@pytest.mark.slow  # about 3 min (CI runs it)
@pytest.mark.parametrize("fault, line", [
    ("raise:30", "drafter=pld failed while drafting inside vLLM's worker: RuntimeError: a fault injected into the drafter"),
    ("long:30", "drafter=pld failed while drafting inside vLLM's worker: pld proposed a chain of 11 tokens, more than "
                "the 10 vLLM was started to verify (num_speculative_tokens)")])
def test_a_drafter_that_fails_inside_vllm_stops_the_run_in_its_own_line_and_the_run_resumes(tmp_path, fault, line):
    python = vllm_python()
    run = tmp_path / "run"
    overrides = [*TINY, "engine=vllm-custom", "drafter=pld", f"hydra.run.dir={run}"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{FAULTS}", "SPECBENCH_TEST_PROPOSER_FAULT": fault}
    failed = subprocess.run([python, "-m", "specbench", *overrides], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=600)
    assert failed.returncode == 2, failed.stderr[-3000:]
    [error] = [text for text in failed.stderr.splitlines() if text.startswith("specbench: error")]
    assert line in error and "nothing of the question in flight was written" in error
    answered = (run / "answers.jsonl").read_text().splitlines() if (run / "answers.jsonl").exists() else []
    assert all(text.endswith("}") for text in answered)  # whole lines only
    assert not (run / "engine_processes.json").exists()  # vLLM's processes ended with the run

    resumed = specbench(python, *overrides)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tasks"]["overall"]["questions"] == 3 and summary["tasks"]["overall"]["identical_to_baseline"] == 3
