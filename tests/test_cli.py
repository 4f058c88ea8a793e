"""``python -m specbench`` as a user runs it: outputs, resume, and one-line errors for bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from specbench.results.schema import SCHEMA_VERSION, STEP_COLUMNS, SUMMARY_KEYS

TINY = ["model=tiny-random", "run.max_new_tokens=24"]


def specbench(*overrides, env=None):
    return subprocess.run(
        [sys.executable, "-m", "specbench", *overrides], capture_output=True, text=True, timeout=600,
        env={**os.environ, **(env or {})},
    )


def assert_a_resumed_run_continues_the_state(tmp_path, drafter: str, state_key: str) -> None:
    """A run of 2 questions, and the same run stopped after 1 and resumed, end with the same saved drafter state
    (``state_key`` of drafter_state.npz) and accept the same tokens: what carries across questions resumes."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    # One task, so that the split run answers the questions in the uninterrupted run's order.
    common = [*TINY, f"drafter={drafter}", "task.tasks=[qa]", "task.limit_per_task=2"]
    assert specbench(*common, f"hydra.run.dir={whole}").returncode == 0
    assert specbench(*common[:-1], "task.limit_per_task=1", f"hydra.run.dir={split}").returncode == 0
    # Extending the question set is not a settings change (task.limit_per_task is not compared): it resumes.
    result = specbench(*common, f"hydra.run.dir={split}")
    assert result.returncode == 0, result.stderr
    with np.load(whole / "drafter_state.npz") as a, np.load(split / "drafter_state.npz") as b:
        assert np.array_equal(a[state_key], b[state_key])
        assert sorted(a["_questions"].tolist()) == sorted(b["_questions"].tolist())
    lengths = [[json.loads(line)["choices"][0]["accept_lengths"] for line in (run / "answers.jsonl").open()]
               for run in (whole, split)]
    assert lengths[0] == lengths[1]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    result = specbench(*TINY, "task.limit_per_task=1", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    return run_dir, result


def test_run_writes_every_record(finished_run):
    run_dir, result = finished_run
    answers = read_jsonl(run_dir / "answers.jsonl")
    baseline = read_jsonl(run_dir / "baseline_answers.jsonl")
    assert [a["question_id"] for a in answers] == [b["question_id"] for b in baseline] == [1001, 1005, 1009, 1013, 1017, 1021]
    for record in answers:
        choice = record["choices"][0]
        assert set(choice) == {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}
        assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"])
        assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
        assert all(n <= 24 for n in choice["new_tokens"])
    assert len(answers[0]["choices"][0]["turns"]) == 2  # MT-bench has two turns

    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert list(steps.columns) == STEP_COLUMNS
    per_question = steps.groupby("question_id")["accepted_tokens"].sum().to_dict()
    assert per_question == {a["question_id"]: sum(a["choices"][0]["new_tokens"]) for a in answers}

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["schema_version"] == SCHEMA_VERSION
    assert summary["model"] == "tiny-random" and summary["drafter"] == "pld"
    assert {"torch", "transformers", "device", "dtype", "threads", "git_sha"} <= set(summary["environment"])
    assert list(summary["tasks"]) == ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "overall"]
    for stats in summary["tasks"].values():
        assert set(stats) == set(SUMMARY_KEYS)
    overall = summary["tasks"]["overall"]
    assert (overall["identical_to_baseline"], overall["near_ties"], overall["violations"]) == (6, 0, 0)
    assert all(record["specbench"]["mismatch"] is None for record in answers)
    drafted = steps[steps.step > 0].candidate_tokens.sum()
    assert sum(record["specbench"]["drafted_tokens"] for record in answers) == drafted > 0
    assert "overall" in result.stdout and "speedup" in result.stdout


def test_spec_bench_speed_py_gives_the_summarys_mat_on_the_answer_file(finished_run):
    """Spec-Bench's evaluation/speed.py, restated (scripts/compare_spec_bench.py imports the real one), on the
    run's answers.jsonl gives summary.json's MAT: PLD's first draft is verified in the pass that reads the
    prompt in its original, so the answer file has no entry for specbench's prefill, which settles nothing."""
    run_dir, _ = finished_run
    answers = read_jsonl(run_dir / "answers.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["drafter"] == "pld"
    mt_bench = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]  # :9
    for task, stats in summary["tasks"].items():
        # speed.py:13-22: overall takes every record, mt_bench its eight categories, any other task its own
        data = [record for record in answers if task == "overall"
                or (record["category"] in mt_bench if task == "mt_bench" else record["category"] == task)]
        lengths = [length for record in data for length in record["choices"][0]["accept_lengths"]]  # :29
        assert data and np.mean(lengths) == pytest.approx(stats["mean_accepted_tokens"], abs=1e-12), task  # :65
    steps = pd.read_parquet(run_dir / "steps.parquet")
    prefills = steps[steps.step == 0]
    assert (prefills.accepted_tokens == 0).all()  # steps.parquet keeps the prefill pass, which settles nothing
    for record in answers:
        choice = record["choices"][0]
        assert 0 not in choice["accept_lengths"]
        # One entry per pass of the original, and decoding_steps their count per turn (Spec-Bench eval.py:223)
        assert sum(choice["decoding_steps"]) == len(choice["accept_lengths"]) == len(record["specbench"]["draft_depths"])
        turns = len(prefills[prefills.question_id == record["question_id"]])
        assert len(choice["accept_lengths"]) == len(steps[steps.question_id == record["question_id"]]) - turns
    # vLLM's histogram: each answer's own, summed in the summary, one count per step that verified a draft.
    histograms = [record["specbench"]["acceptance_histogram"] for record in answers]
    width = max(map(len, histograms))
    summed = [sum(histogram[j] for histogram in histograms if j < len(histogram)) for j in range(width)]
    assert summary["tasks"]["overall"]["acceptance_histogram"] == summed
    assert sum(summed) == int((steps.draft_depth > 0).sum()) > 0


def test_rerun_resumes_without_redoing_or_duplicating(finished_run, tmp_path):
    run_dir, _ = finished_run
    before = read_jsonl(run_dir / "answers.jsonl")
    result = specbench(*TINY, "task.limit_per_task=2", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr
    after = read_jsonl(run_dir / "answers.jsonl")
    ids = [a["question_id"] for a in after]
    assert len(ids) == len(set(ids)) == 12
    assert after[:6] == before  # the finished questions were not redone
    assert len(read_jsonl(run_dir / "baseline_answers.jsonl")) == 12


def test_resume_with_other_settings_is_refused_and_keeps_the_results(finished_run):
    run_dir, _ = finished_run
    before = (run_dir / "answers.jsonl").read_text()
    result = specbench("model=tiny-random", "run.max_new_tokens=25", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2
    assert "max_new_tokens: 24 -> 25" in result.stderr
    assert (run_dir / "answers.jsonl").read_text() == before


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_a_resumed_budget_run_reuses_its_calibration_and_is_named_as_tuned(tmp_path):
    """The draft budget decides from the verify latencies calibrated at the start: a resumed run takes them from
    verify_latency.json instead of measuring another question on a machine in another state."""
    tuned = [*TINY, "run.max_new_tokens=12", "run.draft_budget=auto", "task.tasks=[qa]", f"hydra.run.dir={tmp_path}"]
    result = specbench(*tuned, "task.limit_per_task=1")
    assert result.returncode == 0, result.stderr
    calibration = (tmp_path / "verify_latency.json").read_text()
    result = specbench(*tuned, "task.limit_per_task=2")
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(tmp_path / "answers.jsonl")) == 2
    assert (tmp_path / "verify_latency.json").read_text() == calibration
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["drafter"], summary["method"]) == ("pld", "pld+budget")
    assert {record["model_id"] for record in read_jsonl(tmp_path / "answers.jsonl")} == {"tiny-random-pld+budget"}
    assert "tiny-random / pld+budget" in result.stdout


def one_line_error(result):
    """The error is one line, the last thing printed (progress bars may come before it), no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    errors = [line for line in lines if "error" in line.lower()]
    assert errors == [lines[-1]] and lines[-1].startswith("specbench: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[-1]


def test_unknown_choice_lists_the_valid_ones(tmp_path):
    line = one_line_error(specbench("drafter=nope", f"hydra.run.dir={tmp_path}"))
    assert line.startswith("specbench: error: drafter=nope: no such config in conf/drafter/; choose one of ar, ")
    assert ", pld, " in line


def test_missing_question_file(tmp_path):
    line = one_line_error(specbench(*TINY, f"task.path={tmp_path}/none.jsonl", f"hydra.run.dir={tmp_path}"))
    assert "none.jsonl: no such file" in line


def test_malformed_question_line(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n{"question_id": 2,\n')
    line = one_line_error(specbench(*TINY, f"task.path={questions}", f"hydra.run.dir={tmp_path / 'r'}"))
    assert "q.jsonl, line 2: not valid JSON" in line


@pytest.mark.parametrize("override, message", [
    # the run settings' checks run in check_config, pinned without a process of their own in
    # tests/test_typed_values.py; run.max_new_tokens=0 stands for them here, the others are slow
    ("run.max_new_tokens=0", "run.max_new_tokens must be a positive integer, got 0"),
    ("drafter.num_draft_tokens=0", "drafter.num_draft_tokens must be a positive integer"),
    ("run.device=tpu", "run.device='tpu' is not a device"),
    pytest.param("run.temperature=-0.5", "run.temperature must be 0 (greedy) or at least 0.0001, got -0.5",
                 marks=pytest.mark.slow),
    pytest.param("run.top_p=0", "run.top_p must be in (0, 1], got 0", marks=pytest.mark.slow),
    pytest.param("run.top_p=1.5", "run.top_p must be in (0, 1], got 1.5", marks=pytest.mark.slow),
])
@pytest.mark.slow  # three CLI processes: moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_bad_settings(tmp_path, override, message):
    assert message in one_line_error(specbench(*TINY, override, f"hydra.run.dir={tmp_path}"))


def test_prompts_longer_than_the_context_are_skipped_and_named(tmp_path):
    """They used to stop the whole run at that question, on every resume."""
    result = specbench(*TINY, "model.max_context=128", "task=summarization", "task.limit_per_task=2",
                       f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "skipped 2 question(s)" in result.stdout and "more than tiny-random's context of 128" in result.stdout
    assert "a prompt may have at most 127 tokens" in result.stdout
    assert len(read_jsonl(tmp_path / "skipped.jsonl")) == 2


@pytest.mark.parametrize("override, message", [
    ("model.num_heads=3", "model.num_heads=3 must divide model.hidden_size=64"),
    # the others are one case each of checks tests/test_typed_values.py pins without a process of their own
    pytest.param("model.hidden_size=0", "model.hidden_size must be a positive integer, got 0", marks=pytest.mark.slow),
    pytest.param("run.threads=1000", "run.threads=1000 is more than the", marks=pytest.mark.slow),
    pytest.param("run.max_new_tokens=100000", "run.max_new_tokens=100000 must be less than model.max_context=8192",
                 marks=pytest.mark.slow),
])
def test_values_the_code_cannot_take_are_refused_before_loading(tmp_path, override, message):
    """They used to fail inside instantiate or mid-run in the attention, with a traceback (or, for threads, to
    run and blame other processes for the slowdown)."""
    line = one_line_error(specbench(*TINY, override, f"hydra.run.dir={tmp_path / 'run'}"))
    assert message in line


# What conf/config.yaml is to enable by default (hydra.callbacks); passed here so the test holds either way.
NEW_DIRECTORIES = "++hydra.callbacks.new_run_directories._target_=specbench.config.NewRunDirectories"


def test_a_refused_run_leaves_no_new_directory(tmp_path):
    """Hydra creates the run directory and its parents before the settings are checked; a refused run used to
    leave them behind, empty."""
    run_dir = tmp_path / "new" / "deeper" / "run"
    one_line_error(specbench(NEW_DIRECTORIES, *TINY, "run.max_new_tokens=-1", f"hydra.run.dir={run_dir}"))
    assert list(tmp_path.iterdir()) == []


def test_a_refused_run_keeps_a_directory_that_was_there(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(specbench(NEW_DIRECTORIES, *TINY, "model.num_heads=3", f"hydra.run.dir={tmp_path / 'empty'}"))
    one_line_error(specbench(NEW_DIRECTORIES, *TINY, "model.num_heads=3", f"hydra.run.dir={tmp_path / 'empty' / 'a'}"))
    assert [path.name for path in tmp_path.iterdir()] == ["empty"] and list((tmp_path / "empty").iterdir()) == []


def test_a_refused_sweep_cell_leaves_no_new_directory(tmp_path):
    sweep = tmp_path / "sweep"
    result = specbench("-m", NEW_DIRECTORIES, *TINY, "run.max_new_tokens=-1,-2", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 2, result.stderr
    assert [path.name for path in sweep.iterdir()] == ["multirun.yaml"]  # Hydra's own record of the sweep


def test_the_default_configuration_removes_a_refused_runs_new_directory(tmp_path):
    one_line_error(specbench(*TINY, "run.max_new_tokens=-1", f"hydra.run.dir={tmp_path / 'new'}"))
    assert list(tmp_path.iterdir()) == []


def test_hub_model_unavailable_offline(tmp_path):
    line = one_line_error(specbench("model=vicuna-7b", f"hydra.run.dir={tmp_path}", env={"HF_HUB_OFFLINE": "1"}))
    assert "lmsys/vicuna-7b-v1.3" in line and "model.path=" in line


def test_missing_local_model_path(tmp_path):
    line = one_line_error(specbench("model=vicuna-7b", f"model.path={tmp_path}/nowhere", f"hydra.run.dir={tmp_path}"))
    assert "is not a directory" in line


def test_analysis_reads_the_run_back(finished_run):
    from analysis.runs import load_steps, load_summaries

    run_dir, _ = finished_run
    table = load_summaries([run_dir])
    overall = table[(table.run_dir == str(run_dir)) & (table.task == "overall")].iloc[0]
    assert overall.drafter == "pld" and overall.questions >= 6
    steps = load_steps([run_dir])
    assert set(steps["drafter"]) == {"pld"} and len(steps) == len(pd.read_parquet(run_dir / "steps.parquet"))


def rest_refusal(*overrides) -> str:
    """The one-line refusal of REST's set-up on the tiny model with ``overrides``, in process (what the CLI prints
    after ``specbench: error: ``, as the first case of the test below shows through a real run)."""
    from hydra.utils import instantiate

    from specbench.config import compose
    from specbench.errors import SpecbenchError

    target = instantiate(compose(["model=tiny-random"]).model, device="cpu", linear_backend="auto")
    drafter = instantiate(compose(["model=tiny-random", "drafter=rest", *overrides]).drafter)
    with pytest.raises(SpecbenchError) as refused:
        drafter.prepare(target)
    assert "\n" not in str(refused.value)
    return str(refused.value)


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_datastore_problems_name_the_file_and_the_fix(tmp_path):
    missing = one_line_error(specbench(*TINY, "drafter=rest", f"drafter.datastore={tmp_path}/none",
                                       f"hydra.run.dir={tmp_path / 'r1'}"))
    assert f"{tmp_path}/none" in missing and "build_datastore.py" in missing
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps({"format_version": 1, "tokens": 3,
                                                     "tokenizer": {"fingerprint": "someone-else", "name": "other"}}))
    np.save(store / "tokens.npy", np.array([1, 2, -1], dtype=np.int32))
    np.save(store / "suffixes.npy", np.array([2, 0, 1], dtype=np.int32))
    other = rest_refusal(f"drafter.datastore={store}")
    assert "built with another tokenizer" in other and str(store) in other
    (store / "suffixes.npy").write_bytes(b"not numpy")
    assert "damaged datastore" in rest_refusal(f"drafter.datastore={store}")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    nothing = rest_refusal(f"drafter.corpus={empty}", f"drafter.cache_dir={tmp_path / 'cache'}")
    assert "holds no text" in nothing and "empty.txt" in nothing


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_hd_records_which_database_supplied_the_accepted_tokens(tmp_path):
    from specbench.testing import SMALL_MODEL_DB

    result = specbench(*TINY, "drafter=hd", *SMALL_MODEL_DB, "task=translation", "task.limit_per_task=1",
                       f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    accepted_more = steps[steps.accepted_tokens > 1]
    assert len(accepted_more) and set(accepted_more.source) <= {"context", "model", "statistics"}
    assert (steps[steps.accepted_tokens == 1].source == "").all()
