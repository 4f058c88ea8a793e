"""The metrics of specbench.measure.metrics on a hand-written run whose every number is worked out below, checked
directly (group_statistics) and through the analysis tables (run_task_stats, leaderboard)."""

import json

import pandas as pd
import pytest

from analysis.runs import load_questions, read_spec_bench
from analysis.runs import fill_draft_depths
from analysis.tables import acceptance_table, formatted, leaderboard, render, render_acceptance, run_task_stats
from specbench.measure import metrics


def line(question_id, category, turns, wall_time, drafted=None, identical=None, mismatch=None, task=None, depth=None):
    """One model_answer record; ``turns`` holds each turn's accept lengths (the first, 1, is its prefill);
    ``depth``: every decoding step's draft depth (the prefill drafts nothing)."""
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
        if depth is not None:
            record["specbench"]["draft_depths"] = [0 if step == 0 else depth for t in turns for step in range(len(t))]
    return record


NEAR_TIE = {"turn": 0, "index": 4, "method_token": 7, "baseline_token": 9, "method_margin": 0.001,
            "baseline_margin": 0.001, "kind": "near_tie"}

# Method. Every decoding step verifies a chain of 5 drafted tokens, except q2's single step, which verifies 10.
#   q1 qa:       accept lengths 1,3,4,4 -> 12 tokens in 0.6 s = 20 tok/s; drafted 3*5 = 15, accepted 0+2+3+3 = 8
#   q2 qa:       accept lengths 1,8     ->  9 tokens in 0.3 s = 30 tok/s; drafted 10,    accepted 0+7 = 7
#   q3 writing:  turn 1: 1,4,5 -> 10 tokens in 0.3 s; turn 2: 1,2,3 -> 6 tokens in 0.5 s
#                (each turn starts with its own prefill)  -> 16 tokens in 0.8 s = 20 tok/s
#                drafted 4*5 = 20, accepted 0+3+4 + 0+1+2 = 10
METHOD = [
    line(1, "qa", [[1, 3, 4, 4]], [0.6], drafted=15, identical=True, task="qa", depth=5),
    line(2, "qa", [[1, 8]], [0.3], drafted=10, identical=False, mismatch=NEAR_TIE, task="qa", depth=10),
    line(3, "writing", [[1, 4, 5], [1, 2, 3]], [0.3, 0.5], drafted=20, identical=True, task="mt_bench", depth=5),
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
    #     (a mean of ratios gives mean(2, 1.5) = 1.75; total tokens over total time 1.833);
    #     MAT (12 + 9) / (4 + 2) steps = 3.5 (without the prefills: 19 / 4 = 4.75; mean of per-question
    #     MATs: mean(3, 4.5) = 3.75); acceptance (8 + 7) / (15 + 10) = 0.6;
    #     vLLM's mean acceptance length: 4 drafts accepting 2, 3, 3, 7: 1 + 15 / 4 = 4.75;
    #     by position (drafts reaching it; accepted there): 1: 4; 4 -> 1. 2: 4; 4 -> 1. 3: 4; 3 -> 0.75.
    #     4, 5: 4; 1 (the 7) -> 0.25. 6, 7: only q2's 10-deep draft; it accepted 7 -> 1. 8-10: 1; 0 -> 0;
    #     vLLM's per position divides by all 4 drafts: 1, 1, 0.75, 0.25, 0.25, 0.25, 0.25, 0, 0, 0;
    #     ms per token: 1000/20 = 50, 1000/30 = 33.3: mean 41.67, p50 41.67, p90 33.3 + 0.9 * 16.67 = 48.33,
    #     p99 33.3 + 0.99 * 16.67 = 49.83
    "qa": {"questions": 2, "tokens_per_s": 25.0, "baseline_tokens_per_s": 15.0, "speedup": 5 / 3,
           "speedup_mean_of_ratios": 1.75, "mean_accepted_tokens": 3.5, "acceptance_rate": 0.6,
           "mean_acceptance_length": 4.75, "acceptance_by_position": [1, 1, 0.75, 0.25, 0.25, 1, 1, 0, 0, 0],
           "per_position_acceptance_rate": [1, 1, 0.75, 0.25, 0.25, 0.25, 0.25, 0, 0, 0],
           # vLLM's histogram: drafts accepting 0..10 (the deepest draft) tokens: one 2, two 3s, one 7
           "acceptance_histogram": [0, 0, 1, 2, 0, 0, 0, 1, 0, 0, 0],
           "tpot_ms": 125 / 3, "tpot_p50_ms": 125 / 3, "tpot_p90_ms": 145 / 3, "tpot_p99_ms": 299 / 6},
    # mt_bench: tokens/s 16 / 0.8 = 20 (not the mean of the turns' rates, mean(33.3, 12) = 22.7); baseline
    #     16 / 1.6 = 10; speedup 2 (one question: both definitions); MAT 16 / 6 steps = 8/3; acceptance
    #     10 / 20 = 0.5; 4 drafts (each turn's prefill drafts nothing) accepting 3, 4, 1, 2: length 1 + 10/4;
    #     every draft is 5 deep, so both per-position figures are 4/4, 3/4, 2/4, 1/4, 0; 50 ms a token
    "mt_bench": {"questions": 1, "tokens_per_s": 20.0, "baseline_tokens_per_s": 10.0, "speedup": 2.0,
                 "speedup_mean_of_ratios": 2.0, "mean_accepted_tokens": 8 / 3, "acceptance_rate": 0.5,
                 "mean_acceptance_length": 3.5, "acceptance_by_position": [1, 0.75, 0.5, 0.25, 0],
                 "per_position_acceptance_rate": [1, 0.75, 0.5, 0.25, 0],
                 "acceptance_histogram": [0, 1, 1, 1, 1, 0],  # drafts accepting 1, 2, 3, 4 of 5
                 "tpot_ms": 50.0, "tpot_p50_ms": 50.0, "tpot_p90_ms": 50.0, "tpot_p99_ms": 50.0},
    # overall: tokens/s mean(20, 30, 20) = 70/3; baseline mean(10, 20, 10) = 40/3; speedup 70/40 = 1.75
    #     (mean of ratios: mean(2, 1.5, 2) = 11/6); MAT 37 tokens / 12 steps; acceptance 25 / 45 = 5/9;
    #     8 drafts accepting 2, 3, 3, 7, 3, 4, 1, 2 = 25: length 1 + 25/8; by position: 8/8, 7/8, 5/8, 2/8,
    #     1/8, then q2's draft alone: 1, 1, 0, 0, 0 (vLLM's: 1/8, 1/8 at 6 and 7); ms a token 50, 33.3, 50:
    #     mean 44.44, and the percentiles of [33.3, 50, 50] are 50
    "overall": {"questions": 3, "tokens_per_s": 70 / 3, "baseline_tokens_per_s": 40 / 3, "speedup": 1.75,
                "speedup_mean_of_ratios": 11 / 6, "mean_accepted_tokens": 37 / 12, "acceptance_rate": 5 / 9,
                "mean_acceptance_length": 33 / 8,
                "acceptance_by_position": [1, 7 / 8, 5 / 8, 2 / 8, 1 / 8, 1, 1, 0, 0, 0],
                "per_position_acceptance_rate": [1, 7 / 8, 5 / 8, 2 / 8, 1 / 8, 1 / 8, 1 / 8, 0, 0, 0],
                # 1, 2, 2, 3, 3, 3, 4, 7 accepted: the sum of qa's and mt_bench's histograms
                "acceptance_histogram": [0, 1, 2, 3, 1, 0, 0, 1, 0, 0, 0],
                "tpot_ms": 400 / 9, "tpot_p50_ms": 50.0, "tpot_p90_ms": 50.0, "tpot_p99_ms": 50.0},
}


def subset(records, task):
    return [r for r in records if task == "overall" or r["specbench"]["task"] == task]


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_group_statistics_match_the_hand_worked_numbers(task):
    statistics = metrics.group_statistics(subset(METHOD, task), subset(BASELINE, task))
    lists = ("acceptance_by_position", "per_position_acceptance_rate", "acceptance_histogram")
    assert {key: value for key, value in statistics.items() if key not in lists} == pytest.approx(
        {key: value for key, value in EXPECTED[task].items() if key not in lists})
    for key in lists:
        assert statistics[key] == pytest.approx(EXPECTED[task][key])


def test_the_examples_in_the_metrics_docstrings_hold():
    import doctest
    assert doctest.testmod(metrics).failed == 0


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
        assert row.speedup_mean_of_ratios == pytest.approx(expected["speedup_mean_of_ratios"])
        assert row.mean_acceptance_length == pytest.approx(expected["mean_acceptance_length"])
        assert row.acceptance_by_position == pytest.approx(expected["acceptance_by_position"])
        assert row.tpot_p90_ms == pytest.approx(expected["tpot_p90_ms"])
    assert stats.loc["overall", ["identical", "near_ties", "violations"]].tolist() == [2, 1, 0]
    overall = acceptance_table(questions).iloc[0]
    assert overall[["speedup", "speedup_mean_of_ratios", "mat", "mean_acceptance_length"]].tolist() == pytest.approx(
        [1.75, 11 / 6, 37 / 12, 33 / 8])
    assert overall[["position_1", "position_2", "position_3", "position_4"]].tolist() == pytest.approx(
        [1, 7 / 8, 5 / 8, 2 / 8])
    markdown = render_acceptance(acceptance_table(questions), "md")
    assert "| m | pld | 1.75x | 1.83x | 3.08 | 4.12 | 0.56 | 1.00 | 0.88 | 0.62 | 0.25 | 44.4 |" in markdown
    assert "mean acceptance length (vLLM)" in markdown.splitlines()[0]
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
    shares = metrics.acceptance_by_position([1, 3, 1, 2], [0, 4, 4, 2])
    assert shares == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    assert metrics.acceptance_by_position([1, 1], [0, 0]) == []  # plain decoding drafts nothing
    # A step whose drafter proposed nothing (depth 0) reaches no position, whatever its place.
    assert metrics.acceptance_by_position([1, 1, 4, 1], [0, 0, 3, 0]) == [1.0, 1.0, 1.0]


def test_vllm_metrics_count_drafts_only_and_keep_the_bonus_token():
    # Worked by hand: a prefill (depth 0, 1 token), a 4-deep draft accepting 2 (+ bonus: 3), a step with no
    # draft (1), a 4-deep draft accepting none (1), a 1-deep draft accepting it (2). Drafts: 3; accepted: 3.
    lengths, depths = [1, 3, 1, 1, 2], [0, 4, 0, 4, 1]
    assert metrics.mean_acceptance_length(lengths, depths) == pytest.approx(1 + 3 / 3)
    # Spec-Bench's MAT counts the prefill and the empty step: 8 tokens over 5 passes.
    assert metrics.mean_accepted_tokens(lengths) == pytest.approx(8 / 5)
    # vLLM's per position: over all 3 drafts; specbench's: over the drafts that reached the position.
    assert metrics.per_position_acceptance_rate(lengths, depths) == pytest.approx([2 / 3, 1 / 3, 0, 0])
    assert metrics.acceptance_by_position(lengths, depths) == pytest.approx([2 / 3, 1 / 2, 0, 0])
    assert metrics.mean_acceptance_length([1, 1, 1], [0, 0, 0]) == 1.0  # vLLM's value without drafts
    with pytest.raises(ValueError, match="3 accept lengths but 2 draft depths"):
        metrics.mean_acceptance_length([1, 1, 1], [0, 0])


def test_the_two_speedup_definitions_differ_when_long_answers_speed_up_less():
    # Spec-Bench issue #29: one question at 2x, one at 1x. The ratio of mean rates weighs the faster question's
    # rates: (20 + 40) / (10 + 40) = 1.2; the mean of per-question ratios is (2 + 1) / 2 = 1.5.
    assert metrics.speedup([20.0, 40.0], [10.0, 40.0]) == pytest.approx(1.2)
    assert metrics.speedup_mean_of_ratios([20.0, 40.0], [10.0, 40.0]) == pytest.approx(1.5)
    assert metrics.speedup_mean_of_ratios([20.0, 20.0], [10.0, 10.0]) == metrics.speedup([20.0, 20.0], [10.0, 10.0])


def test_time_per_output_token_is_wall_time_over_tokens_with_percentiles_over_questions():
    # Questions at 10, 20, 40 tokens/s: 100, 50, 25 ms a token; p90 interpolates between 50 and 100.
    statistics = metrics.tpot_statistics([10.0, 20.0, 40.0])
    assert statistics == pytest.approx({"tpot_ms": 175 / 3, "tpot_p50_ms": 50.0, "tpot_p90_ms": 90.0,
                                        "tpot_p99_ms": 99.0})
    assert metrics.time_per_output_token_ms(metrics.tokens_per_second([30, 10], [2.0, 2.0])) == pytest.approx(100.0)


def test_records_without_draft_depths_take_them_from_the_steps_or_show_none(tmp_path):
    without = [{**r, "specbench": {k: v for k, v in r["specbench"].items() if k != "draft_depths"}} for r in METHOD]
    questions = load_questions([write_run(tmp_path / "run", without, BASELINE)])
    assert questions.draft_depths.isna().all()
    assert pd.isna(acceptance_table(questions).iloc[0].mean_acceptance_length)
    assert "| 3.08 | - | 0.56 | - |" in render_acceptance(acceptance_table(questions), "md")
    # The run's step records give them back (q3's are left incomplete: it keeps none).
    rows = [{"question_id": 1, "turn": 0, "step": i, "draft_depth": d} for i, d in enumerate([0, 5, 5, 5])]
    rows += [{"question_id": 2, "turn": 0, "step": i, "draft_depth": d} for i, d in enumerate([0, 10])]
    rows += [{"question_id": 3, "turn": 1, "step": 0, "draft_depth": 0}]
    question_rows = questions.to_dict("records")
    fill_draft_depths(question_rows, pd.DataFrame(rows))
    assert [row["draft_depths"] for row in question_rows] == [[0, 5, 5, 5], [0, 10], None]


# vLLM's figures check each other on every run shape the loop records (specdec_bench's check, item 10 of
# issue 30): through the real loop with the tiny random model, then in hand-built records the loop cannot make.


def speed_py_mat(records):
    """Spec-Bench's evaluation/speed.py MAT, restated: np.mean over every accept_lengths entry of every record
    (speed.py:29, 65), zeros included."""
    lengths = [length for record in records for length in record["choices"][0]["accept_lengths"]]
    return sum(lengths) / len(lengths)


def vllm_figures_by_hand(lengths, depths):
    """(mean acceptance length, per-position rates, histogram) of one set of steps, from their definitions."""
    accepted = [length - 1 for length, depth in zip(lengths, depths) if depth > 0]
    if not accepted:
        return 1.0, [], []
    deepest = max(depth for depth in depths)
    per_position = [sum(count >= position for count in accepted) / len(accepted) for position in range(1, deepest + 1)]
    histogram = [sum(count == j for count in accepted) for j in range(deepest + 1)]
    return 1 + sum(accepted) / len(accepted), per_position, histogram


def run_shape(tiny, prompt_ids, shape):
    """One answer of two turns (two prompts) decoded through Decoder.generate, as the runner records it."""
    from conftest import ScriptedDrafter
    from hydra.utils import instantiate
    from test_loop_phases import KnownTree, continuation

    from specbench.config import compose
    from specbench.questions import Prompt
    from specbench.decoding.loop import Decoder
    from specbench.results.schema import Answer

    kind, max_new_tokens = shape
    answer = Answer()
    # Two turns where the first pass of each is folded into the answer file's first entry, else one.
    for ids in prompt_ids[:2 if kind in ("pld", "recycling", "tree") else 1]:
        if kind in ("pld", "recycling", "lookahead"):
            drafter = instantiate(compose([f"drafter={kind}", "model=tiny-random"]).drafter)
            drafter.prepare(tiny)
        else:
            reference = continuation(tiny, ids, max_new_tokens + 10)
            drafter = {"chain": lambda: ScriptedDrafter(reference, 4),
                       "rejected": lambda: ScriptedDrafter(reference, 3, mode="wrong"),
                       "long and empty": lambda: ScriptedDrafter(reference, 10, empty_every=2),
                       "tree": lambda: KnownTree(reference, window=True, first_draft_from_prompt=True)}[kind]()
        generation = Decoder(tiny.target, frozenset(), max_draft_tokens=8).generate(ids, drafter, max_new_tokens)
        answer.texts.append("x")
        answer.token_ids.append(generation.token_ids)
        answer.steps.append(generation.steps)
        answer.wall_times.append(max(generation.wall_s, 1e-6))
    return answer, answer.to_record(Prompt(1, "qa", "qa", ("q",) * len(answer.steps)), "tiny", None)


RUN_SHAPES = [("pld", 12), ("recycling", 12), ("lookahead", 16), ("chain", 12), ("rejected", 9),
              ("long and empty", 7), ("tree", 11), ("pld", 1), ("chain", 1)]  # 1 token: no decoding step, or
# (first_draft_from_prompt) one whose draft the budget cuts to nothing


@pytest.mark.parametrize("shape", RUN_SHAPES, ids=[f"{kind}-{tokens}" for kind, tokens in RUN_SHAPES])
def test_vllm_figures_obey_their_identities_on_every_recorded_run_shape(tiny, prompt_ids, shape):
    answer, record = run_shape(tiny, prompt_ids, shape)
    statistics = metrics.group_statistics([record], None)  # checks the identities itself; restated here
    lengths, depths = record["choices"][0]["accept_lengths"], record["specbench"]["draft_depths"]
    mean_length, per_position, histogram = (statistics["mean_acceptance_length"],
                                            statistics["per_position_acceptance_rate"],
                                            statistics["acceptance_histogram"])
    assert mean_length == pytest.approx(1 + sum(per_position), abs=1e-12)
    mean_by_hand, per_position_by_hand, histogram_by_hand = vllm_figures_by_hand(lengths, depths)
    assert mean_length == pytest.approx(mean_by_hand)
    assert per_position == pytest.approx(per_position_by_hand)
    assert histogram == histogram_by_hand  # counts: exact (pytest 9.2's approx refuses a nested list)
    assert record["specbench"]["acceptance_histogram"] == histogram  # one request: its own histogram
    # The answer file as the original's run writes it: Spec-Bench's speed.py gives the summary's MAT.
    assert speed_py_mat([record]) == pytest.approx(statistics["mean_accepted_tokens"])
    # Every step the loop recorded is in the figures, the prefill that settles nothing (PLD, Token Recycling,
    # the tree here) excepted: the figures of all recorded steps are the same.
    steps = [step for turn in answer.steps for step in turn]
    mean_of_steps, per_position_of_steps, histogram_of_steps = vllm_figures_by_hand(
        [s.accepted_tokens for s in steps], [s.draft_depth for s in steps])
    assert (mean_of_steps, histogram_of_steps) == (pytest.approx(mean_length), histogram)
    assert per_position_of_steps == pytest.approx(per_position)
    assert len(lengths) == len(steps) - sum(turn[0].accepted_tokens == 0 for turn in answer.steps)
    assert record["choices"][0]["decoding_steps"] == [len(turn) - (turn[0].accepted_tokens == 0)
                                                      for turn in answer.steps]


def test_a_broken_identity_or_an_impossible_step_is_refused_loudly(monkeypatch):
    # A step that appends more than its draft's depth + the bonus token: its depth was recorded wrong.
    with pytest.raises(ValueError, match="step 1 .* appended 4 tokens after a draft 2 deep"):
        metrics.group_statistics([line(9, "qa", [[1, 4]], [0.1], drafted=2, task="qa", depth=2)], None)
    # A definition changed (vLLM's per-position rate over the drafts that reached each position): the summary
    # must not be written with figures that contradict each other.
    monkeypatch.setattr(metrics, "per_position_acceptance_rate", metrics.acceptance_by_position)
    with pytest.raises(metrics.AcceptanceFiguresDisagree, match="is not 1 \\+ the sum of its per-position rates"):
        metrics.group_statistics(METHOD, BASELINE)
    monkeypatch.undo()
    monkeypatch.setattr(metrics, "acceptance_histogram", lambda lengths, depths: [0, 1, 2, 3, 1, 0, 0, 1, 0, 0])
    with pytest.raises(metrics.AcceptanceFiguresDisagree, match="histogram has 10 entries for 10 draft positions"):
        metrics.group_statistics(METHOD, BASELINE)


def test_the_acceptance_histogram_of_a_set_is_the_sum_of_its_requests():
    ones = [metrics.acceptance_histogram(record["choices"][0]["accept_lengths"], record["specbench"]["draft_depths"])
            for record in METHOD]
    assert ones == [[0, 0, 1, 2, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], [0, 1, 1, 1, 1, 0]]
    width = max(map(len, ones))
    summed = [sum(one[j] if j < len(one) else 0 for one in ones) for j in range(width)]
    assert metrics.group_statistics(METHOD, BASELINE)["acceptance_histogram"] == summed
    assert metrics.acceptance_histogram([1, 1, 1], [0, 0, 0]) == []  # no drafts: no histogram (vLLM: zeros)
