"""``engine=vllm`` without vLLM: the pure parts of ``specbench.engines.vllm`` and ``vllm_requests`` (a turn's steps
from vLLM's per-request counts, stop tokens, the device check, start failures, token digests, the top
log-probabilities), that neither module imports vLLM until an engine starts, the CLI's one-line refusals in an
environment without vLLM, and the contention meter counting an engine's child processes as the run's own."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from specbench.engines.vllm import check_device, start_failure, steps_from_counts, as_loop_tokens
from specbench.results.load import token_digest
from specbench.engines.vllm_methods import VLLM_DRAFTERS
from specbench.engines.vllm_requests import top_arrays

from conftest import refusal

ROOT = Path(__file__).resolve().parent.parent


# --- a turn's steps from vLLM's counts --------------------------------------------------------------------------

def counts(drafted, accepted):
    """vLLM's per-request counts (``RequestSpecDecodeMetrics.to_dict()`` at the ``detailed`` level)."""
    return {"num_spec_steps": len(drafted), "num_draft_tokens": sum(drafted),
            "num_accepted_draft_tokens": sum(accepted), "num_spec_tokens": max(drafted, default=0),
            "per_step_drafted": list(drafted), "per_step_accepted": list(accepted)}


def as_tuples(steps):
    return [(step.step, step.draft_tokens, step.verify_tokens, step.accepted_tokens, step.context_len)
            for step in steps]


def test_steps_are_the_prefill_then_each_verify_step_then_the_undrafted_tokens():
    steps = steps_from_counts(prompt_length=4, tokens=10, spec=counts([3, 3, 3], [2, 0, 3]))
    # prefill: 1 token; verify steps: accepted + 1 each (3, 1, 4); one token decoded without a draft
    assert as_tuples(steps) == [(0, 0, 4, 1, 0), (1, 3, 4, 3, 5), (2, 3, 4, 1, 8), (3, 3, 4, 4, 9),
                                (4, 0, 1, 1, 13)]
    assert sum(step.accepted_tokens for step in steps) == 10
    assert [step.draft_depth for step in steps[1:4]] == [3, 3, 3]


def test_a_last_verify_step_that_overshoots_the_output_is_cut_to_what_was_kept():
    steps = steps_from_counts(4, 6, counts([3, 3, 3], [2, 0, 3]))  # the third step's 4 tokens: only 1 kept
    assert [step.accepted_tokens for step in steps] == [1, 3, 1, 1]
    steps = steps_from_counts(4, 4, counts([3, 3, 3], [2, 0, 3]))  # ended inside the first verify step
    assert [step.accepted_tokens for step in steps] == [1, 3]
    steps = steps_from_counts(4, 3, counts([5], [4]))
    assert [step.accepted_tokens for step in steps] == [1, 2] and steps[1].draft_tokens == 5


def test_steps_carry_no_times():
    for step in steps_from_counts(4, 10, counts([3, 3], [3, 1])):
        assert step.draft_s is None and step.verify_s is None and step.overhead_s is None


def test_without_speculation_every_step_decodes_one_token():
    for spec in (None, {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0}):
        steps = steps_from_counts(7, 3, spec)
        assert as_tuples(steps) == [(0, 0, 7, 1, 0), (1, 0, 1, 1, 8), (2, 0, 1, 1, 9)]
    assert steps_from_counts(7, 0, counts([3], [3])) == []


def test_the_eos_token_that_ends_a_turn_is_kept_as_the_specbench_loop_keeps_it():
    from specbench.decoding.loop import cut_at_eos

    generated = [5, 6, 2, 9]
    loop_tokens, ended = cut_at_eos(generated, frozenset({2}))
    assert ended and as_loop_tokens([5, 6, 2]) == loop_tokens == [5, 6, 2]  # vLLM's output, stopped at EOS
    assert as_loop_tokens((5, 6)) == [5, 6] and all(type(token) is int for token in as_loop_tokens((5, 6)))


# --- refusals and advice ----------------------------------------------------------------------------------------

def test_a_device_the_vllm_build_cannot_honour_is_refused_in_one_line():
    line = refusal(check_device, "cuda", "cpu")
    assert "run.device=cuda" in line and "CPU build" in line and "SPECBENCH_VLLM=gpu" in line
    line = refusal(check_device, "cpu", "cuda")
    assert "run.device=cpu" in line and "SPECBENCH_VLLM=cpu" in line
    for device, platform in (("auto", "cpu"), ("auto", "cuda"), ("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda")):
        check_device(device, platform)


def test_a_start_that_runs_out_of_memory_gets_advice():
    line = start_failure("target /models/x", ValueError("No available memory for the cache blocks.\nTry again"))
    assert "\n" not in line and line.startswith("vLLM could not start for target /models/x")
    assert "engine.max_model_len" in line and "engine.cpu_kv_cache_gib" in line
    assert "engine.gpu_memory_utilization" in line
    assert "engine.max_model_len" in start_failure("x", RuntimeError("KV cache is too small"))


def test_another_start_failure_says_what_could_not_load():
    line = start_failure("pld's ngram checkpoint /d", OSError("config.json\nnot found"))
    assert line == "vLLM could not load pld's ngram checkpoint /d: OSError: config.json not found"
    long = start_failure("x", RuntimeError("y" * 1000))
    assert len(long) < 400 and long.endswith("...")
    assert start_failure("x", RuntimeError("")).endswith("RuntimeError: RuntimeError")


def test_token_digests_tell_outputs_apart():
    digest = token_digest([1, 2, 3])
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert token_digest(np.array([1, 2, 3])) == digest
    assert token_digest([1, 2, 3]) == digest
    assert len({digest, token_digest([3, 2, 1]), token_digest([1, 2]), token_digest([12, 3]), token_digest([])}) == 5


# --- the top log-probabilities ----------------------------------------------------------------------------------

@dataclass
class FakeLogprob:
    """What vLLM's ``Logprob`` carries that top_arrays reads."""

    logprob: float
    rank: int | None


def test_top_arrays_rank_vllms_logprobs_and_pad():
    positions = [
        {7: FakeLogprob(-0.1, 1), 3: FakeLogprob(-2.5, 2), 9: FakeLogprob(-3.0, 3)},
        {4: FakeLogprob(-9.0, 40), 5: FakeLogprob(-0.2, 1), 6: FakeLogprob(-1.0, 2)},  # sampled 4, outside the top
        {8: FakeLogprob(-0.5, 1)},
        {1: FakeLogprob(-4.0, None), 2: FakeLogprob(-0.7, 1)},
    ]
    ids, values = top_arrays(positions, 2)
    assert ids.shape == values.shape == (4, 2) and ids.dtype == np.int64 and values.dtype == np.float32
    assert ids.tolist() == [[7, 3], [5, 6], [8, -1], [2, 1]]
    assert values[0].tolist() == pytest.approx([-0.1, -2.5])
    assert values[1].tolist() == pytest.approx([-0.2, -1.0])
    assert values[2, 0] == pytest.approx(-0.5) and values[2, 1] == -np.inf
    ids, values = top_arrays([], 3)
    assert ids.shape == (0, 3)


# --- vLLM is imported only when an engine starts ----------------------------------------------------------------

def test_the_vllm_modules_import_without_vllm():
    """Both modules import in an environment without vLLM and import no vLLM at module level (the runner imports
    specbench.engines.vllm for engine=vllm before it checks that vLLM is there, so as to say so in one line)."""
    code = ("import sys\n"
            "import specbench.engines.vllm_requests, specbench.engines.vllm, specbench.run.load_sweep\n"
            "loaded = sorted(name for name in sys.modules if name == 'vllm' or name.startswith('vllm.'))\n"
            "assert not loaded, loaded\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# --- the CLI without vLLM ---------------------------------------------------------------------------------------

def specbench(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specbench", "model=tiny-random", "task.tasks=[qa]",
                           "task.limit_per_task=1", *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one error line a refused run prints (log lines aside), and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("specbench: error:")]
    return line


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_engine_vllm_without_vllm_is_one_line_naming_the_script_and_leaves_no_directory(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this python has vLLM; the refusal is for one without")
    run = tmp_path / "runs" / "run"
    result = specbench("engine=vllm", "drafter=pld", f"hydra.run.dir={run}")
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert "engine=vllm needs vLLM" in line and "scripts/vllm_env.sh" in line and sys.executable in line
    assert not (tmp_path / "runs").exists()  # refused after the directory was locked: what it made is removed

    run.mkdir(parents=True)  # a directory that was there stays, empty
    result = specbench("engine=vllm", "drafter=pld", f"hydra.run.dir={run}")
    assert result.returncode == 2 and list(run.iterdir()) == []


def test_a_drafter_vllm_lacks_is_one_line_naming_those_it_runs_before_vllm_is_needed(tmp_path):
    run = tmp_path / "runs" / "run"
    result = specbench("engine=vllm", "drafter=hd", f"hydra.run.dir={run}")
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert "drafter=hd runs on engine=specbench only" in line
    assert f"engine=vllm runs drafter={', '.join(VLLM_DRAFTERS)}" in line
    assert "vllm_env.sh" not in line  # refused by the configuration check, before vLLM is looked for
    assert not (tmp_path / "runs").exists()


# --- an engine's child processes are the run's own load ---------------------------------------------------------

def test_own_cpu_time_counts_a_live_child_process():
    from specbench.measure.machine import _own_cpu_s

    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nend = time.process_time() + 1.2\n"
                              "while time.process_time() < end: pass\nprint('done', flush=True)\n"
                              "sys.stdin.read()"],  # stays alive until the test lets it go
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = _own_cpu_s()
        assert child.stdout.readline() == "done\n"  # 1.2 s of the child's CPU time spent
        during = _own_cpu_s()
        assert child.poll() is None
        assert during - before >= 0.5
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_load_engine_picks_the_engine_the_config_names(monkeypatch):
    """specbench.engines.load_engine: engine.name=vllm loads VllmEngine (which refuses in one line without vLLM),
    anything else the specbench loop."""
    from omegaconf import OmegaConf

    from specbench.engines import load_engine
    from specbench.engines.specbench_loop import SpecbenchLoop
    from specbench.engines.vllm import VllmEngine

    picked = []
    monkeypatch.setattr(SpecbenchLoop, "load", classmethod(lambda cls, *args: picked.append("specbench") or "loop"))
    monkeypatch.setattr(VllmEngine, "load", classmethod(lambda cls, *args: picked.append("vllm") or "vllm"))
    assert load_engine(OmegaConf.create({"name": "specbench"}), None, None, None, None) == "loop"
    assert load_engine(None, None, None, None, None) == "loop"  # a config composed without the engine group
    assert load_engine(OmegaConf.create({"name": "vllm"}), None, None, None, None) == "vllm"
    assert picked == ["specbench", "specbench", "vllm"]
