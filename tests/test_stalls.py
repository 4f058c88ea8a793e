"""Stalls inside a question (``specbench.measure.stalls``): a step far slower than the run's own steps of its size
is flagged, a question whose stalls are a material share of its time is marked in its record, the console, the
summary's timing block and the analysis tables, and the tables leave such questions out on request, saying so."""

import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis.__main__ import main as analysis_main
from analysis.runs import load_questions
from analysis.tables import leaderboard, leave_out_stalled, render
from specbench.config import compose
from specbench.measure.machine import TimingCheck
from specbench.measure.stalls import (MIN_SAMPLES, NO_STALLS, NOT_CHECKED, NOT_MEASURED, STALLED, StallCheck,
                                      StallRule, VerifyTimes, describe, question_stalls, role_stalls, stall_verdict)
from specbench.results.console import format_summary_table
from specbench.results.readers import read_answers
from specbench.runner import run_benchmark
from test_analysis import synthetic_run

RULE = StallRule(factor=3.0, min_s=0.02, share=0.1)


def steps(*timed, first=1):
    """Steps (step number, verify_tokens, verify_s) from (verify_tokens, verify_s) pairs, numbered from ``first``."""
    return [SimpleNamespace(step=first + index, verify_tokens=size, verify_s=seconds)
            for index, (size, seconds) in enumerate(timed)]


# --- the pure rule on hand-built steps ----------------------------------------------------------------------------

def test_a_step_ten_times_its_sizes_median_is_stalled_and_counted():
    method = steps(*[(3, 0.09)] * 19, (3, 0.90))
    baseline = steps(*[(1, 0.05)] * 40)
    stalls = StallCheck(RULE).judge({"method": (method, 3.0), "baseline": (baseline, 2.5)})
    assert stalls["stalled"] is True and stalls["steps"] == 1
    assert stalls["roles"]["method"] == {"steps": 1, "excess_s": 0.81, "wall_s": 3.0, "share": 0.27, "unchecked": 0}
    assert stalls["roles"]["baseline"]["steps"] == 0 and stalls["share"] == 0.27
    assert stalls["rule"] == {"factor": 3.0, "min_s": 0.02, "share": 0.1}
    assert describe(stalls) == "1 stalled step lost 0.81 s of the method's 3.0 s (27%)"
    assert stall_verdict({"stalls": stalls}) == STALLED


def test_the_issues_three_stalls_mark_the_question():
    """The issue's question: three passes of 0.66, 1.50 and 1.22 s where that size took about 90 ms."""
    method = steps(*[(5, 0.09)] * 60, (5, 0.66), (5, 1.50), (5, 1.22))
    # the first question of a run: nothing known before it, its own steps give the median
    assert question_stalls({"method": (method, 16.0)}, VerifyTimes().reference, RULE)["steps"] == 0
    stalls = StallCheck(RULE).judge({"method": (method, 16.0)})
    assert stalls["stalled"] is True and stalls["roles"]["method"]["steps"] == 3
    assert stalls["excess_s"] == pytest.approx(3.11)
    assert describe(stalls) == "3 stalled steps lost 3.1 s of the method's 16.0 s (19%)"


def test_a_question_asks_each_sizes_reference_once(monkeypatch):
    """A reference is a median over every step of its size so far; asked per step, a long run's AR steps (hundreds of
    thousands of size 1) made the check quadratic in the run's length."""
    check = StallCheck(RULE)
    asked = []
    reference = check.times.reference
    monkeypatch.setattr(check.times, "reference", lambda size: asked.append(size) or reference(size))
    check.judge({"method": (steps(*[(3, 0.09)] * 20, (5, 0.1), (5, 0.1)), 3.0),
                 "baseline": (steps(*[(1, 0.05)] * 40), 2.5)})
    assert sorted(asked) == [1, 3, 5]


def test_jitter_and_a_modest_slowdown_are_not_stalls():
    times = VerifyTimes()
    times.add(steps(*[(1, 0.005)] * 10, *[(4, 0.1)] * 10))
    # 4x a 5 ms pass but only 15 ms beyond it (run.stall_min_s), and 2.5x a 100 ms pass (run.stall_factor)
    found = role_stalls(steps((1, 0.020), (4, 0.25)), 1.0, times.reference, RULE)
    assert found == {"steps": 0, "excess_s": 0.0, "wall_s": 1.0, "share": 0.0, "unchecked": 0}
    # past both bounds it is one
    assert role_stalls(steps((1, 0.030), (4, 0.31)), 1.0, times.reference, RULE)["steps"] == 2


def test_small_stalls_are_counted_but_a_question_is_marked_only_past_the_share():
    times = VerifyTimes()
    times.add(steps(*[(1, 0.05)] * 20))
    stalls = question_stalls({"method": (steps((1, 0.25)), 10.0), "baseline": (steps((1, 0.05)), 8.0)},
                             times.reference, RULE)
    assert stalls["steps"] == 1 and stalls["excess_s"] == 0.2 and stalls["share"] == 0.02
    assert stalls["stalled"] is False and stall_verdict({"stalls": stalls}) == NO_STALLS


def test_a_size_seen_fewer_times_than_needed_uses_the_calibrations_prior():
    seen_once = steps((7, 0.5))
    times = VerifyTimes(prior={4: 0.05, 8: 0.07})
    times.add(seen_once)
    assert len(times.samples[7]) < MIN_SAMPLES
    assert times.reference(7) == pytest.approx(0.065)  # interpolated between the calibrated 4 and 8
    assert role_stalls(seen_once, 2.0, times.reference, RULE)["steps"] == 1
    # without a calibration, nothing known bounds a size above every other: not checked, never called a stall
    bare = VerifyTimes()
    bare.add(seen_once)
    assert role_stalls(seen_once, 2.0, bare.reference, RULE) == {"steps": 0, "excess_s": 0.0, "wall_s": 2.0,
                                                                  "share": 0.0, "unchecked": 1}
    # between the run's own well-known sizes: interpolated; below them all: the nearest larger size's (a bound)
    bare.add(steps(*[(1, 0.05)] * MIN_SAMPLES, *[(10, 0.14)] * MIN_SAMPLES))
    assert bare.reference(7) == pytest.approx(0.05 + 0.09 * 6 / 9)
    assert VerifyTimes({3: 0.2}).reference(1) == 0.2


def test_prefills_are_judged_but_never_a_reference():
    times = VerifyTimes()
    times.add([prefill for _ in range(10) for prefill in steps((40, 0.01), first=0)])  # ten prompts' passes
    assert times.samples == {}
    times.add(steps(*[(40, 0.2)] * MIN_SAMPLES))
    assert role_stalls(steps((40, 0.9), first=0), 2.0, times.reference, RULE)["steps"] == 1



def test_a_resumed_run_counts_the_steps_its_earlier_sessions_recorded():
    """The runner counts steps.parquet's rows in (``runner._stall_check``): a null time reads back as NaN."""
    import pandas as pd

    earlier = pd.DataFrame({"question_id": [1] * 7, "step": [0, 1, 2, 3, 4, 5, 6],
                            "verify_tokens": [30, 2, 2, 2, 2, 2, 2],
                            "verify_s": [0.3, 0.04, 0.04, None, 0.04, 0.04, 0.04]})
    times = VerifyTimes()
    times.add(earlier.itertuples())
    assert times.samples == {2: [0.04] * 5} and times.reference(2) == 0.04


def test_steps_without_times_are_not_measured_never_none():
    untimed = steps((1, None), (3, None))
    assert role_stalls(untimed, 1.0, VerifyTimes().reference, RULE) is None
    stalls = question_stalls({"method": (untimed, 1.0), "baseline": (steps((1, None)), 1.0)},
                             VerifyTimes().reference, RULE)
    assert stalls == {"stalled": None, "why": "no per-step times"}
    assert stall_verdict({"stalls": stalls}) == NOT_MEASURED == "not measured"
    assert stall_verdict({"task": "qa"}) == NOT_CHECKED and stall_verdict(None) == NOT_CHECKED
    # NaN is how parquet gives a null back
    assert role_stalls(steps((1, float("nan"))), 1.0, VerifyTimes().reference, RULE) is None


# --- the summary's timing block and the console -----------------------------------------------------------------

def answer(question_id, stalls=None):
    ours = {"contention": {"other_cores": 0.0}}
    if stalls is not None:
        ours["stalls"] = stalls
    return {"question_id": question_id, "choices": [{"new_tokens": [100], "wall_time": [4.0]}], "specbench": ours}


STALLED_1022 = {"stalled": True, "steps": 3, "excess_s": 5.7, "share": 0.3563,
                "roles": {"method": {"steps": 3, "excess_s": 5.7, "wall_s": 16.0, "share": 0.3563, "unchecked": 0},
                          "baseline": {"steps": 0, "excess_s": 0.0, "wall_s": 9.0, "share": 0.0, "unchecked": 0}},
                "rule": RULE.to_dict()}
CLEAN = {**STALLED_1022, "stalled": False, "steps": 0, "excess_s": 0.0, "share": 0.0,
         "roles": {"method": {"steps": 0, "excess_s": 0.0, "wall_s": 4.0, "share": 0.0, "unchecked": 0}}}


def test_the_summary_timing_block_counts_stalled_questions_and_is_not_trustworthy():
    check = TimingCheck(threads=2, usable_cores=2, other_load_at_start=0.0)
    quiet = [answer(1, CLEAN), answer(2, CLEAN), answer(3, CLEAN)]
    report = check.report(quiet, quiet)
    assert report["trustworthy"] and report["stalls"] == {"stalled_questions": [], "not_measured": 0, "not_checked": 0}
    answers = [*quiet, answer(1022, STALLED_1022), answer(5, {"stalled": None, "why": "no per-step times"}),
               answer(6)]
    report = check.report(answers, quiet)
    assert not report["trustworthy"]
    assert report["warnings"] == ["question 1022: 3 stalled steps lost 5.7 s of the method's 16.0 s (36%)"]
    assert report["stalls"] == {"stalled_questions": [1022], "not_measured": 1, "not_checked": 1}
    table = format_summary_table({"tasks": {}, "timing": report})
    assert ("TIMINGS UNTRUSTWORTHY (busy machine, 1 warning(s)): question 1022: 3 stalled steps lost 5.7 s of the "
            "method's 16.0 s (36%)") in table
    assert "STALLED: 1 question(s) lost more than run.stall_share of their time to stalled steps (1022)" in table
    assert "not measured for 1 question(s)" in table and "not checked for 1 question(s)" in table


# --- a run with a stall injected into one pass ------------------------------------------------------------------

STALL_S = 0.6


def test_a_stall_injected_into_one_pass_marks_its_question_everywhere(tmp_path, monkeypatch, caplog, capsys):
    """The tiny model's question: its AR baseline's third pass sleeps STALL_S (a few ms otherwise)."""
    from specbench.engines.specbench_loop import SpecbenchLoop
    from specbench.targets.transformers import TransformersTarget

    real_answer, real_verify = SpecbenchLoop.answer, TransformersTarget.verify
    decoding = {"now": None, "passes": 0}
    chosen = {}

    def answer_and_note(self, prompt, role, on_step=None):
        decoding["now"], decoding["passes"] = (prompt.question_id, role), 0
        try:
            return real_answer(self, prompt, role, on_step)
        finally:
            decoding["now"] = None

    def verify_stalling_once(self, inputs, n_nodes, top_k):
        question, role = decoding["now"] or (None, None)
        if role == "baseline":
            chosen.setdefault("question", question)  # the first question decoded, whichever role went first
        if role == "baseline" and question == chosen["question"]:
            decoding["passes"] += 1
            if decoding["passes"] == 3:
                time.sleep(STALL_S)
        return real_verify(self, inputs, n_nodes, top_k)

    monkeypatch.setattr(SpecbenchLoop, "answer", answer_and_note)
    monkeypatch.setattr(TransformersTarget, "verify", verify_stalling_once)
    cfg = compose(["model=tiny-random", "run.max_new_tokens=16", "task.tasks=[qa]", "task.limit_per_task=1",
                   "run.warmup_runs=0", "drafter=ar"])
    with caplog.at_level(logging.WARNING, logger="specbench"):
        summary = run_benchmark(cfg, str(tmp_path))
    stalled = {record["question_id"]: record["specbench"]["stalls"] for record in read_answers(tmp_path)}
    question = chosen["question"]
    found = stalled[question]["roles"]["baseline"]
    assert stalled[question]["stalled"] is True and found["steps"] >= 1
    assert STALL_S - 0.1 < found["excess_s"] <= found["wall_s"]
    assert question in summary["timing"]["stalls"]["stalled_questions"] and not summary["timing"]["trustworthy"]
    assert any(f"question {question}: " in warning and "stalled step" in warning and "of AR's" in warning
               for warning in summary["timing"]["warnings"])
    [line] = [record.getMessage() for record in caplog.records
              if record.getMessage().startswith(f"question {question}: ") and "stalled" in record.getMessage()]
    assert line.endswith("; its timings are flagged") and "of AR's" in line
    # analysis: kept and marked by default, left out on request with a notice
    analysis_main(["tables", str(tmp_path), "--table", "leaderboard"])
    out = capsys.readouterr().out
    assert f"question {question}: " in out[out.index("**stalled: "):]
    with pytest.raises(SystemExit):  # its one question left out: nothing to show, and one line saying why
        analysis_main(["tables", str(tmp_path), "--table", "leaderboard", "--leave-out-stalled"])
    assert (f"analysis: error: no question is left under {tmp_path}: --leave-out-stalled: left out 1 stalled "
            "question(s)") in capsys.readouterr().err


# --- analysis: kept and marked, or left out and said ------------------------------------------------------------

def stalled_run(path: Path, header: dict) -> Path:
    """A synthetic run of four questions (100-103) whose question 101 records stalls; ``header`` to its summary."""
    run = synthetic_run(path, "pld", accepted=2, verify_tokens=(3,), noise=0, header=header)
    answers = run / "answers.jsonl"
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    for record in records:
        record["specbench"]["stalls"] = STALLED_1022 if record["question_id"] == 101 else CLEAN
    answers.write_text("".join(json.dumps(record) + "\n" for record in records))
    return run


STALL_WARNING = "question 101: 3 stalled steps lost 5.7 s of the method's 16.0 s (36%)"
STALLED_TIMING = {"timing": {"trustworthy": False, "warnings": [STALL_WARNING], "threads": 2, "usable_cores": 2,
                             "other_load": 0.0, "stalls": {"stalled_questions": [101], "not_measured": 0,
                                                           "not_checked": 0}}}


def test_the_tables_keep_and_mark_stalled_questions_or_leave_them_out_saying_so(tmp_path, capsys, monkeypatch):
    run = stalled_run(tmp_path / "run", STALLED_TIMING)
    questions = load_questions([tmp_path])
    assert list(questions.stalls) == [NO_STALLS, STALLED, NO_STALLS, NO_STALLS]
    markdown = render(leaderboard(questions), "md")
    header, _, row = markdown.splitlines()[:3]
    assert "| stalled |" in header and row.endswith("| 1 | 1 |")  # one stalled question kept, one run
    assert (f"- m pld: {run}: question 101: 3 stalled steps lost 5.7 s of the method's 16.0 s (36%)"
            in markdown.splitlines())
    kept, notice = leave_out_stalled(questions)
    assert list(kept.question_id) == [100, 102, 103]
    assert notice == (f"--leave-out-stalled: left out 1 stalled question(s) of 1 run(s) (stalled steps lost more "
                      f"than run.stall_share of their time): m pld: {run} question 101")
    assert set(kept.trustworthy) == {True} and set(kept.timing_warnings) == {""}  # flagged only for 101
    shown = render(leaderboard(kept), "md")
    assert "stalled" not in shown and "UNTRUSTED" not in shown and "| 3/3 (0 near-tie, 0 violation) |" in shown
    # the command line: never silently
    analysis_main(["tables", str(tmp_path), "--table", "leaderboard", "--leave-out-stalled"])
    out, err = capsys.readouterr()
    assert out.rstrip().endswith(notice) and f"analysis: note: {notice}" in err
    analysis_main(["tables", str(tmp_path), "--table", "leaderboard", "--format", "csv", "--leave-out-stalled"])
    out, err = capsys.readouterr()
    assert "left out" not in out and notice in err  # a CSV stays one table
    analysis_main(["tables", str(tmp_path), "--table", "leaderboard", "--format", "latex", "--leave-out-stalled"])
    out = capsys.readouterr().out  # a paragraph LaTeX reads: the notice's underscores (run.stall_share) escaped
    assert out.rstrip().splitlines()[-1] == "\\par\\noindent " + notice.replace("_", "\\_")
    analysis_main(["compare", str(tmp_path), "--leave-out-stalled"])
    assert capsys.readouterr().out.rstrip().endswith(notice)
    monkeypatch.setattr("analysis.report.make_all", lambda *args, **kwargs: ([], []))  # the figures: seconds, not ours
    analysis_main(["report", str(tmp_path), "--out", str(tmp_path / "kept.html")])
    html = (tmp_path / "kept.html").read_text()
    assert "Stalled: 1 question(s)" in html and "question 101: 3 stalled steps" in html
    analysis_main(["report", str(tmp_path), "--out", str(tmp_path / "left.html"), "--leave-out-stalled"])
    html = (tmp_path / "left.html").read_text()
    assert "Left out on request" in html and "Stalled: 1 question(s)" not in html


def test_a_damaged_stalls_record_leaves_its_line_out_with_a_warning(tmp_path, caplog):
    run = stalled_run(tmp_path / "run", STALLED_TIMING)
    answers = run / "answers.jsonl"
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    records[1]["specbench"]["stalls"] = {"stalled": True, "roles": {"method": {"steps": "three"}}}
    records[2]["specbench"]["stalls"] = {"stalled": None, "why": "no per-step times"}  # not measured: kept
    records[3]["specbench"]["stalls"] = {}  # no verdict at all (once a KeyError in the reader): not "not measured"
    answers.write_text("".join(json.dumps(record) + "\n" for record in records))
    with caplog.at_level(logging.WARNING):
        questions = load_questions([tmp_path])
    assert list(questions.question_id) == [100, 102]
    assert list(questions.stalls) == [NO_STALLS, NOT_MEASURED]
    assert "line 2 has a specbench.stalls that is not a stall verdict" in caplog.text
    assert "line 4 has a specbench.stalls that is not a stall verdict" in caplog.text
    # a number in place of the verdict is not one, though 0 == False
    records[0]["specbench"]["stalls"] = {**CLEAN, "stalled": 0}
    answers.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert list(load_questions([tmp_path]).question_id) == [102]


def test_a_run_flagged_for_more_than_its_stalls_stays_flagged_when_they_are_left_out(tmp_path):
    busy = {"timing": {**STALLED_TIMING["timing"],
                       "warnings": ["at start other processes kept 1.5 of 2 cores busy with 2 thread(s) in use",
                                    STALL_WARNING]}}
    stalled_run(tmp_path / "run", busy)
    kept, _ = leave_out_stalled(load_questions([tmp_path]))
    assert set(kept.trustworthy) == {False}
    assert set(kept.timing_warnings) == {"at start other processes kept 1.5 of 2 cores busy with 2 thread(s) in use"}


def test_leave_out_stalled_is_refused_where_it_means_nothing(tmp_path, capsys):
    stalled_run(tmp_path / "run", STALLED_TIMING)
    with pytest.raises(SystemExit):
        analysis_main(["throughput", str(tmp_path), "--leave-out-stalled"])
    assert ("analysis: error: --leave-out-stalled applies to tables, report, compare, not to throughput"
            in capsys.readouterr().err)
