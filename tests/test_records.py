import json

import pandas as pd
import pytest
from conftest import answer

from specbench.questions import Prompt
from specbench.errors import SpecbenchError
from specbench.measure.mismatch import Mismatch
from specbench.results.console import format_summary_table, violation_report
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import SCHEMA_VERSION, STEP_COLUMNS, Answer, StepRecord
from specbench.results.summary import summarize


def record(question_id, task, tokens, seconds, accepted, identical=True, category=None, mismatch=None):
    prompt = Prompt(question_id, category or task, task, ("q",) * len(tokens))
    return answer(tokens, seconds, accepted).to_record(prompt, "m", identical, mismatch)


def test_summary_averages_per_question_speeds_like_spec_bench():
    method = [record(1, "qa", [100], [1.0], [1, 3, 3]), record(2, "qa", [50], [1.0], [1, 1])]
    baseline = [record(1, "qa", [100], [2.0], [1], None), record(2, "qa", [50], [2.0], [1], None)]
    tasks = summarize(method, baseline)
    qa = tasks["qa"]
    assert qa["tokens_per_s"] == pytest.approx(75.0)          # mean(100, 50)
    assert qa["baseline_tokens_per_s"] == pytest.approx(37.5)  # mean(50, 25)
    assert qa["speedup"] == pytest.approx(2.0)
    assert qa["mean_accepted_tokens"] == pytest.approx((1 + 3 + 3 + 1 + 1) / 5)
    assert qa["identical_to_baseline"] == 2 and qa["near_ties"] == 0 and qa["violations"] == 0
    # drafted: steps 1.. verify accepted + 1 candidates each: (4 + 4) + 2 = 10; accepted drafts: 2 + 2 + 0
    assert qa["acceptance_rate"] == pytest.approx(4 / 10)
    assert tasks["overall"]["questions"] == 2
    assert "qa" in format_summary_table({"tasks": tasks})


def test_summary_without_baseline_has_no_speedup():
    tasks = summarize([record(1, "rag", [10], [1.0], [1])], None)
    assert tasks["rag"]["speedup"] is None and tasks["rag"]["identical_to_baseline"] is None


def test_records_follow_spec_bench_model_answer_schema():
    line = record(81, "mt_bench", [3, 4], [0.5, 0.25], [1, 2], category="writing")
    assert line["category"] == "writing" and line["question_id"] == 81
    choice = line["choices"][0]
    assert choice["new_tokens"] == [3, 4]
    assert choice["wall_time"] == [0.5, 0.25]
    assert choice["decoding_steps"] == [2, 2]
    assert choice["accept_lengths"] == [1, 2, 1, 2]
    assert line["specbench"] == {"task": "mt_bench", "identical_to_baseline": True, "drafted_tokens": 6,
                                 "draft_depths": [0, 3, 0, 3], "mismatch": None,
                                 # vLLM's per-request histogram: both turns' 3-deep drafts accepted 1 token
                                 "acceptance_histogram": [0, 2, 0, 0],
                                 # each turn's first step (its prefill): draft, verify and overhead seconds
                                 "prefill_s": [0.01, 0.01]}


def test_step_columns_are_pinned_to_the_schema_version():
    """A change to StepRecord changes steps.parquet: it must come with a new SCHEMA_VERSION (add it here)."""
    columns_by_version = {
        2: ["question_id", "turn", "step", "draft_tokens", "verify_tokens", "accepted_tokens", "draft_s", "verify_s",
            "overhead_s", "context_len", "draft_depth", "source", "candidate_tokens"],
    }
    columns_by_version[3] = columns_by_version[2]  # 3 changed run.json and summary.json, not the steps
    assert STEP_COLUMNS == columns_by_version[SCHEMA_VERSION]


def test_near_ties_and_violations_are_counted_and_violations_reported():
    near = Mismatch(0, 5, 11, 12, 0.01, 0.02, "near_tie")
    bad = Mismatch(0, 3, 40, 41, -2.5, 3.0, "violation")
    method = [record(1, "qa", [10], [1.0], [1, 2]), record(2, "qa", [10], [1.0], [1, 2], False, mismatch=near),
              record(3, "rag", [10], [1.0], [1, 2], False, mismatch=bad)]
    baseline = [record(i, task, [10], [2.0], [1], None) for i, task in ((1, "qa"), (2, "qa"), (3, "rag"))]
    tasks = summarize(method, baseline)
    assert (tasks["qa"]["identical_to_baseline"], tasks["qa"]["near_ties"], tasks["qa"]["violations"]) == (1, 1, 0)
    assert (tasks["overall"]["identical_to_baseline"], tasks["overall"]["near_ties"],
            tasks["overall"]["violations"]) == (1, 1, 1)
    table = format_summary_table({"tasks": tasks})
    overall_row = next(row for row in table.splitlines() if row.startswith("overall"))
    assert "1/1/1" in overall_row
    report = violation_report({"tasks": tasks}, method)
    assert "VIOLATION" in report and "question 3" in report and "method 40 vs baseline 41" in report
    assert violation_report({"tasks": tasks}, method[:2]) is None


def add_question(run_dir, question_id):
    result = answer([5], [1.0], [1, 2, 2])
    prompt = Prompt(question_id, "qa", "qa", ("q",))
    run_dir.add(result.to_record(prompt, "m", True), result.to_record(prompt, "b", None),
                result.step_rows(question_id))


def test_resume_keeps_finished_questions_and_drops_a_half_written_one(tmp_path):
    settings = {"model": "m", "drafter": {"name": "pld"}}
    run_dir = RunDirectory(tmp_path, with_baseline=True)
    assert run_dir.open(settings) == set()
    add_question(run_dir, 1)
    add_question(run_dir, 2)
    # an interruption after the baseline line of question 3, before its method line and steps
    with (tmp_path / "baseline_answers.jsonl").open("a") as handle:
        handle.write(json.dumps(record(3, "qa", [5], [1.0], [1])) + "\n")
    with (tmp_path / "answers.jsonl").open("a") as handle:
        handle.write('{"question_id": 3, "categ')  # cut mid-line
    reopened = RunDirectory(tmp_path, with_baseline=True)
    assert reopened.open(settings) == {1, 2}
    assert len((tmp_path / "answers.jsonl").read_text().splitlines()) == 2
    assert len((tmp_path / "baseline_answers.jsonl").read_text().splitlines()) == 2
    add_question(reopened, 3)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert sorted(steps["question_id"].unique()) == [1, 2, 3]
    assert len(steps) == 9


def test_resume_refuses_other_settings(tmp_path):
    RunDirectory(tmp_path, True).open({"model": "m", "max_new_tokens": 128})
    with pytest.raises(SpecbenchError, match="max_new_tokens: 128 -> 64"):
        RunDirectory(tmp_path, True).open({"model": "m", "max_new_tokens": 64})
