"""Every number a user can type is checked against what the code can take, before anything loads: the run
group's ranges, tiny-random's shapes (heads that divide the hidden size, an even head size, the memory the
weights need), token counts against the context, thread counts against the cores, the task selection. Each
key has bad values (refused in one line naming the key) and a good one (accepted)."""

import math

import pytest

from conftest import refusal

from specbench.measure import machine
from specbench.config import check_config, compose
from specbench.models.tiny import build_tiny_random, check_tiny_random, tiny_parameter_count
from specbench.settings import MAX_SEED, RunSettings


# the run group: key -> (bad values, a good value)
RUN_VALUES = {
    "max_new_tokens": ([0, -1, 1.5, True, "8", None], 1),
    "warmup_runs": ([-1, 0.5, False, "1"], 0),
    "warmup_max_new_tokens": ([-1, 2.5, True], 0),
    "state_warmup_runs": ([-1, 1.5, True], 0),
    "state_warmup_max_new_tokens": ([0, -3, 1.5, True], None),
    "max_draft_tokens": ([0, -1, 2.0, True], 1),
    "verify_padding_max": ([0, -4, 1.5], 1),
    "verify_padding_min_gain": ([-0.1, 1, 1.5, math.nan, "0.1", True], 0.0),
    "calibration_repeats": ([0, -1, 1.5], 1),
    "calibration_sizes": ([[], [0], [-1, 2], [1.5], [True], 4, "1,2", None], [1, 3]),
    "verify_cost_smoothing": ([0, -0.5, 1.01, math.inf], 1.0),
    "draft_budget_prior": ([0, 1, -0.2, 1.2, math.nan], 0.01),
    "draft_budget_prior_weight": ([0, -1, math.inf, True], 0.5),
    "draft_budget_explore": ([-0.01, 1.01, math.nan], 1.0),
    "draft_budget_memory": ([0, 0.5, -1, math.inf], 1),
    "draft_budget_max_depth": ([0, -1, 1.5], 1),
    "draft_budget_max_rank": ([0, -2, 2.5], 1),
    "target_top_k": ([-1, 1.5, True], 0),
    "mismatch_top_k": ([1, 0, -1, 2.5], 2),
    "near_tie_tolerance": ([-0.001, "big", math.nan, True], 0.0),
    "temperature": ([-0.5, 1e-5, 1e-38, 1e-300, math.inf, "hot", True], 1e-4),
    "top_p": ([0, -0.1, 1.01, math.nan], 1e-9),
    "seed": ([-1, MAX_SEED + 1, 2**70, 1.5, True], MAX_SEED),
    "threads": ([0, -1, 1.5, True], 1),
    "stall_factor": ([1, 0.5, -3, math.inf, math.nan, "3", True], 1.01),
    "stall_min_s": ([-0.01, math.inf, "0.02", True, None], 0),
    "stall_share": ([0, -0.1, 1.01, math.nan, True], 1),
    "baseline": ([1, "yes", None], False),
    "alternate_order": ([0, "no"], False),
    "verify_padding": (["on", True, None], "auto"),
    "draft_budget": (["yes", 1], "auto"),
    "state_warmup_turns": (["last", 2], "first"),
    "regime": (["jit", None, True], "compiled"),
    "compile_buckets": ([[], [2, 4], [1, 1], [1, 4, 2], [1.5], [1, True], 4, "1,2", None], [1, 3]),
    "compile_mode": (["fast", None, 1], "default"),
}


@pytest.mark.parametrize("key, value", [(key, value) for key, (bad, _) in RUN_VALUES.items() for value in bad])
def test_a_bad_run_value_is_refused_naming_the_key(key, value):
    message = refusal(RunSettings.from_config, {key: value})
    assert message.startswith(f"run.{key}") and repr(value) in message, message


@pytest.mark.parametrize("key", RUN_VALUES)
def test_a_good_run_value_is_accepted(key):
    assert getattr(RunSettings.from_config({key: RUN_VALUES[key][1]}), key) == RUN_VALUES[key][1]


def test_every_run_key_has_cases():
    import dataclasses

    assert set(RUN_VALUES) >= {field.name for field in dataclasses.fields(RunSettings)} - {
        "linear_backend", "device"}  # strings checked by the loaders (test_devices.py)


def test_threads_beyond_the_usable_cores_are_refused_naming_the_cores():
    cores = machine.usable_cores()
    most = machine.max_threads(cores)
    assert RunSettings.from_config({"threads": most}).threads == most
    message = refusal(RunSettings.from_config, {"threads": most + 1})
    assert message.startswith(f"run.threads={most + 1} is more than the {cores:g} core(s) this process may use")
    assert f"choose 1 to {most}, or null" in message
    assert "other processes" not in refusal(RunSettings.from_config, {"threads": 1000})


@pytest.mark.parametrize("cores, most", [(1, 1), (2, 2), (1.5, 2), (0.25, 1), (15.4, 15), (16, 16)])
def test_the_most_threads_follow_the_contention_slack(cores, most):
    assert machine.max_threads(cores) == most
    assert not machine.is_contended(0.0, most, cores) or most == 1  # an idle machine does not flag the most


def test_a_timing_report_with_more_threads_than_cores_does_not_blame_other_processes():
    """A resumed run may bring a thread count beyond this machine's cores: the flag names the threads."""
    check = machine.TimingCheck(threads=8, usable_cores=2, other_load_at_start=0.0)
    answer = {"question_id": 1, "specbench": {"contention": {"other_cores": 0.0}}}
    report = check.report([answer], None)
    assert not report["trustworthy"]
    assert report["warnings"] == ["8 thread(s) ran on 2 usable core(s)"]


# tiny-random's arguments: key -> (bad values, a good value)
TINY_VALUES = {
    "hidden_size": ([0, -64, 64.0, True, "64", None], 32),
    "intermediate_size": ([0, -1, 1.5, None], 1),
    "num_layers": ([0, -2, 2.5, True], 1),
    "num_heads": ([0, -4, 3, 5, 128, 4.0], 2),
    "num_kv_heads": ([0, -2, 3, 8, 1.0], 1),
    "max_context": ([0, 1, -8, 2.5, True, None], 2),
    "initializer_range": ([0, -0.02, 1.5, 50, math.nan, math.inf, "0.02", True], 1.0),
    "seed": ([-1, MAX_SEED + 1, 0.5, True, "0"], MAX_SEED),
    "alphabet": ([123, "", "aab", ["a", "b"]], "abc"),
}


@pytest.mark.parametrize("key, value", [(key, value) for key, (bad, _) in TINY_VALUES.items() for value in bad])
def test_a_bad_tiny_random_value_is_refused_naming_the_key(key, value):
    message = refusal(check_tiny_random, **{key: value})
    assert f"model.{key}" in message, message


@pytest.mark.parametrize("key", TINY_VALUES)
def test_a_good_tiny_random_value_is_accepted(key):
    check_tiny_random(**{key: TINY_VALUES[key][1]})


@pytest.mark.parametrize("shape, message", [
    ({"num_heads": 3}, "model.num_heads=3 must divide model.hidden_size=64 (each head takes hidden_size / num_heads "
                       "dimensions); divisors: [1, 2, 4, 8, 16, 32, 64]"),
    ({"hidden_size": 12}, "model.hidden_size=12 / model.num_heads=4 = 3 dimensions per head, which must be even for "
                          "rotary position embeddings; numbers of heads that give an even size: [1, 2, 3, 6]"),
    ({"num_heads": 8, "num_kv_heads": 3}, "model.num_kv_heads=3 must divide model.num_heads=8"),
])
def test_architecture_constraints_name_both_keys(shape, message):
    assert refusal(check_tiny_random, **shape).startswith(message)


def test_weights_that_cannot_fit_in_memory_are_refused_before_building(monkeypatch):
    monkeypatch.setattr("specbench.models.tiny.available_memory_bytes", lambda: 10 * 2**30)
    message = refusal(check_tiny_random, hidden_size=2**16, num_layers=4)
    assert message.startswith("model.hidden_size=65536, model.intermediate_size=128 and model.num_layers=4 make ")
    assert "GiB in float32, more than the 10.0 GiB of memory available" in message
    check_tiny_random(hidden_size=1024, num_layers=4)
    monkeypatch.setattr("specbench.models.tiny.available_memory_bytes", lambda: None)  # unknown: not refused
    check_tiny_random(hidden_size=2**16, num_layers=4)


@pytest.mark.parametrize("shape", [{}, {"hidden_size": 32, "intermediate_size": 48, "num_layers": 3, "num_heads": 8,
                                        "num_kv_heads": 1, "alphabet": "abcdef"}])
def test_the_parameter_count_is_the_built_models(shape):
    loaded = build_tiny_random(**shape, linear_backend="aten")
    vocab = 258 if "alphabet" not in shape else len(shape["alphabet"]) + 2
    arguments = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                 **{key: value for key, value in shape.items() if key != "alphabet"}}
    assert sum(p.numel() for p in loaded.weights.module.parameters()) == tiny_parameter_count(vocab, **arguments)


def test_the_builder_itself_refuses_before_building():
    """Scripts and tests call build_tiny_random directly, past the runner's check."""
    assert refusal(build_tiny_random, num_heads=3).startswith("model.num_heads=3 must divide")


# composed configurations, checked as the runner checks them before loading anything

@pytest.mark.parametrize("overrides, message", [
    (["model.num_heads=3"], "model.num_heads=3 must divide model.hidden_size=64"),
    (["model.hidden_size=0"], "model.hidden_size must be a positive integer, got 0"),
    (["model.max_context=1"], "model.max_context must be an integer >= 2"),
    (["run.max_new_tokens=8192"], "run.max_new_tokens=8192 must be less than model.max_context=8192"),
    (["model.max_context=100", "run.max_new_tokens=50", "run.max_draft_tokens=100"],
     "run.max_draft_tokens=100 must be less than model.max_context=100"),
    (["model.max_context=64", "run.max_new_tokens=16"], "run.max_draft_tokens=80 must be less than model.max_context=64"),
    (["model.max_context=40", "run.max_new_tokens=16", "run.max_draft_tokens=8", "run.warmup_max_new_tokens=40"],
     "run.warmup_max_new_tokens=40 must be less than model.max_context=40 (the context holds the prompt, at least "
     "1 token, and what is generated): at most 39"),
    (["model.max_context=40", "run.max_new_tokens=16", "run.max_draft_tokens=8", "run.state_warmup_max_new_tokens=99"],
     "run.state_warmup_max_new_tokens=99 must be less than model.max_context=40"),
    (["run.threads=1000"], "run.threads=1000 is more than the"),
    (["task.limit_per_task=0"], "task.limit_per_task must be a positive integer or null, got 0"),
    (["task.limit_per_task=true"], "task.limit_per_task must be a positive integer or null, got True"),
    (["task.limit_per_task=2.5"], "task.limit_per_task must be a positive integer or null, got 2.5"),
    (["task.tasks=qa"], "task.tasks must be a list of task names such as [qa, rag], got 'qa'"),
    (["task.tasks=[]"], "task.tasks is empty; choose one or more of mt_bench"),
    (["task.tasks=[qa,chess]"], "task.tasks has unknown task(s) chess"),
    (["task.tasks=[1]"], "task.tasks must be a list of task names"),
    (["run.max_new_tokens=0"], "run.max_new_tokens must be a positive integer, got 0"),
    (["run.temperature=-0.5"], "run.temperature must be 0 (greedy) or at least 0.0001, got -0.5"),
    (["run.top_p=0"], "run.top_p must be in (0, 1], got 0"),
    (["run.top_p=1.5"], "run.top_p must be in (0, 1], got 1.5"),
])
def test_a_composed_config_is_refused_before_loading(overrides, message):
    assert refusal(check_config, compose(["model=tiny-random", *overrides])).startswith(message)


@pytest.mark.parametrize("overrides", [
    [], ["model.max_context=100", "run.max_new_tokens=50", "run.max_draft_tokens=99", "run.warmup_max_new_tokens=99"],
    ["model.num_heads=8", "model.num_kv_heads=8"], ["task.limit_per_task=1", "task.tasks=[qa,rag]"],
])
def test_a_good_composed_config_passes(overrides):
    check_config(compose(["model=tiny-random", *overrides]))


def test_a_task_path_that_is_not_a_path_is_refused():
    from specbench.questions import read_questions

    assert refusal(read_questions, 5) == "task.path must be a question file, hf:owner/dataset[:file.jsonl] or null, got 5"
