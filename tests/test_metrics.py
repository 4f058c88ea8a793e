"""The metrics of specbench.metrics on a hand-written run whose every number is worked out below, checked
directly (group_statistics) and through the analysis tables (run_task_stats, leaderboard)."""

import json

import pytest

from analysis.runs import load_questions, read_spec_bench
from analysis.tables import formatted, leaderboard, render, run_task_stats
from specbench import metrics


def line(question_id, category, turns, wall_time, drafted=None, identical=None, mismatch=None, task=None):
    """One model_answer record; ``turns`` holds each turn's accept lengths (the first, 1, is its prefill)."""
    record = {
        "question_id": question_id, "category": category, "answer_id": f"a{question_id}", "model_id": "m",
        "choices": [{"index": 0, "turns": ["text"] * len(turns), "decoding_steps": [len(t) for t in turns],
                     "new_tokens": [sum(t) for t in turns], "wall_time": wall_time,
                     "accept_lengths": [length for t in turns for length in t]}],
        "tstamp": 0.0,
    }
    if task is not None:
        record["specbench"] = {"task": task, "identical_to_baseline": identical, "drafted_tokens": drafted,
                               "mismatch": mismatch}
    return record


NEAR_TIE = {"turn": 0, "index": 4, "method_token": 7, "baseline_token": 9, "method_margin": 0.001,
            "baseline_margin": 0.001, "kind": "near_tie"}

# Method. Every decoding step verifies 5 drafted tokens, except q2's single step, which verifies 10.
#   q1 qa:       accept lengths 1,3,4,4 -> 12 tokens in 0.6 s = 20 tok/s; drafted 3*5 = 15, accepted 0+2+3+3 = 8
#   q2 qa:       accept lengths 1,8     ->  9 tokens in 0.3 s = 30 tok/s; drafted 10,    accepted 0+7 = 7
#   q3 writing:  turn 1: 1,4,5 -> 10 tokens in 0.3 s; turn 2: 1,2,3 -> 6 tokens in 0.5 s
#                (each turn starts with its own prefill)  -> 16 tokens in 0.8 s = 20 tok/s
#                drafted 4*5 = 20, accepted 0+3+4 + 0+1+2 = 10
METHOD = [
    line(1, "qa", [[1, 3, 4, 4]], [0.6], drafted=15, identical=True, task="qa"),
    line(2, "qa", [[1, 8]], [0.3], drafted=10, identical=False, mismatch=NEAR_TIE, task="qa"),
    line(3, "writing", [[1, 4, 5], [1, 2, 3]], [0.3, 0.5], drafted=20, identical=True, task="mt_bench"),
]
# The paired AR baseline: one token per step, same token counts.
#   q1: 12 tokens in 1.2 s = 10 tok/s;  q2: 9 tokens in 0.45 s = 20 tok/s;  q3: 16 tokens in 1.6 s = 10 tok/s
BASELINE = [
    line(1, "qa", [[1] * 12], [1.2], task="qa"),
    line(2, "qa", [[1] * 9], [0.45], task="qa"),
    line(3, "writing", [[1] * 10, [1] * 6], [0.6, 1.0], task="mt_bench"),
]

EXPECTED = {
    # qa: tokens/s mean(20, 30) = 25; baseline mean(10, 20) = 15; speedup 25 / 15 = 5/3
    #     (a mean of ratios would give mean(2, 1.5) = 1.75; total tokens over total time 1.833);
    #     MAT (12 + 9) / (4 + 2) steps = 3.5 (without the prefills: 19 / 4 = 4.75; mean of per-question
    #     MATs: mean(3, 4.5) = 3.75); acceptance (8 + 7) / (15 + 10) = 0.6
    "qa": {"questions": 2, "tokens_per_s": 25.0, "baseline_tokens_per_s": 15.0, "speedup": 5 / 3,
           "mean_accepted_tokens": 3.5, "acceptance_rate": 0.6},
    # mt_bench: tokens/s 16 / 0.8 = 20 (not the mean of the turns' rates, mean(33.3, 12) = 22.7); baseline
    #     16 / 1.6 = 10; speedup 2; MAT 16 / 6 steps = 8/3; acceptance 10 / 20 = 0.5
    "mt_bench": {"questions": 1, "tokens_per_s": 20.0, "baseline_tokens_per_s": 10.0, "speedup": 2.0,
                 "mean_accepted_tokens": 8 / 3, "acceptance_rate": 0.5},
    # overall: tokens/s mean(20, 30, 20) = 70/3; baseline mean(10, 20, 10) = 40/3; speedup 70/40 = 1.75
    #     (mean of ratios: mean(2, 1.5, 2) = 1.833); MAT 37 tokens / 12 steps; acceptance 25 / 45 = 5/9
    "overall": {"questions": 3, "tokens_per_s": 70 / 3, "baseline_tokens_per_s": 40 / 3, "speedup": 1.75,
                "mean_accepted_tokens": 37 / 12, "acceptance_rate": 5 / 9},
}


def subset(records, task):
    return [r for r in records if task == "overall" or r["specbench"]["task"] == task]


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_group_statistics_match_the_hand_worked_numbers(task):
    statistics = metrics.group_statistics(subset(METHOD, task), subset(BASELINE, task))
    assert statistics == pytest.approx(EXPECTED[task])


def test_speedup_is_a_ratio_of_means_not_a_mean_of_ratios():
    method, baseline = [20.0, 30.0], [10.0, 20.0]  # qa's per-question rates
    assert metrics.speedup(method, baseline) == pytest.approx(5 / 3)
    mean_of_ratios = sum(m / b for m, b in zip(method, baseline)) / len(method)
    assert mean_of_ratios == pytest.approx(1.75)  # the two really differ on these numbers


def test_mat_counts_the_prefill_step_as_spec_bench_does():
    lengths = [1, 3, 4, 4, 1, 8]  # qa's steps: each question starts with a prefill of accept length 1
    assert metrics.mean_accepted_tokens(lengths) == pytest.approx(21 / 6)
    # the prefill-free quantity of the throughput model is another number, under another name
    assert metrics.accepted_per_decoding_step(lengths, [0, 1, 2, 3, 0, 1]) == pytest.approx(19 / 4)
    assert metrics.mean_accepted_tokens([1] * 7) == 1.0  # plain decoding: MAT 1.00 exactly


def test_acceptance_rate_excludes_the_bonus_token_and_needs_the_counts():
    assert metrics.accepted_draft_tokens([1, 3, 4, 4]) == 8
    assert metrics.acceptance_rate(8, 15) == pytest.approx(8 / 15)
    assert metrics.acceptance_rate(0, 0) is None  # plain decoding drafts nothing
    without_counts = [{**r, "specbench": {"task": r["specbench"]["task"]}} for r in METHOD]
    assert metrics.group_statistics(without_counts, None)["acceptance_rate"] is None


def test_draft_seconds_per_step_leave_the_prefill_out():
    # the prefill's 0.5 s is not drafting; the two decoding steps took 2 and 4 ms
    assert metrics.draft_seconds_per_step([0.5, 0.002, 0.004], [0, 1, 2]) == pytest.approx(0.003)


def test_exactness_counts_say_what_they_cannot_know():
    assert metrics.exactness_counts([True, False, False, False], [None, "near_tie", "violation", "near_tie"]) == {
        "identical": 1, "near_ties": 2, "violations": 1}
    assert metrics.exactness_counts([True, False], [None, None]) == {  # written before kinds were recorded
        "identical": 1, "near_ties": None, "violations": None}
    assert metrics.exactness_counts([False, True], ["not_checked", None])["near_ties"] is None  # sampling
    assert metrics.exactness_counts([None, None], [None, None])["identical"] is None  # no baseline


def write_run(path, method, baseline):
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"schema_version": 2, "model": "m", "drafter": "pld", "tasks": {}}))
    for name, records in (("answers.jsonl", method), ("baseline_answers.jsonl", baseline)):
        (path / name).write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_the_analysis_tables_give_the_same_numbers(tmp_path):
    questions = load_questions([write_run(tmp_path / "run", METHOD, BASELINE)])
    assert list(questions.drafted) == [15, 10, 20]
    assert questions.mismatch.isna().tolist() == [True, False, True] and questions.mismatch[1] == "near_tie"
    assert list(questions.tokens_per_s) == pytest.approx([20.0, 30.0, 20.0])
    stats = run_task_stats(questions).set_index("task")
    for task, expected in EXPECTED.items():
        row = stats.loc[task]
        assert row.speedup == pytest.approx(expected["speedup"])
        assert row.mat == pytest.approx(expected["mean_accepted_tokens"])
        assert row.tokens_per_s == pytest.approx(expected["tokens_per_s"])
        assert row.baseline_tokens_per_s == pytest.approx(expected["baseline_tokens_per_s"])
        assert row.acceptance_rate == pytest.approx(expected["acceptance_rate"])
    assert stats.loc["overall", ["identical", "near_ties", "violations"]].tolist() == [2, 1, 0]
    shown = formatted(leaderboard(questions)).iloc[0]
    assert shown["qa speedup"] == "1.67x" and shown["overall MAT"] == "3.08"
    assert shown["identical"] == "2/3 (1 near-tie, 0 violation)"
    assert "2/3 (1 near-tie, 0 violation)" in render(leaderboard(questions), "md")
    assert "near_ties" in render(leaderboard(questions), "csv").splitlines()[0].split(",")


def test_spec_bench_files_without_specbench_keys(tmp_path):
    strip = [{key: value for key, value in record.items() if key != "specbench"} for record in METHOD]
    base = [{key: value for key, value in record.items() if key != "specbench"} for record in BASELINE]
    for name, records in (("method.jsonl", strip), ("base.jsonl", base)):
        (tmp_path / name).write_text("".join(json.dumps(record) + "\n" for record in records))
    frame = read_spec_bench(tmp_path / "method.jsonl", tmp_path / "base.jsonl", "m", "pld")
    assert list(frame.task) == ["qa", "qa", "mt_bench"]  # from the categories
    overall = run_task_stats(frame).set_index("task").loc["overall"]
    assert overall.speedup == pytest.approx(1.75) and overall.mat == pytest.approx(37 / 12)
    assert overall[["acceptance_rate", "identical", "near_ties", "violations"]].isna().all()
    assert formatted(leaderboard(frame)).iloc[0]["identical"] == "-"


def test_acceptance_by_position_counts_steps_whose_draft_reached_each_position():
    # Decoding steps (the prefill is left out): a 4-deep draft accepting 2, a 4-deep one accepting none, a
    # 2-deep one accepting 1; position 3 and 4 are reached by the two 4-deep drafts only.
    shares = metrics.acceptance_by_position([1, 3, 1, 2], [0, 4, 4, 2], [0, 1, 2, 3])
    assert shares == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    assert metrics.acceptance_by_position([1, 1], [0, 0], [0, 1]) == []  # plain decoding drafts nothing
