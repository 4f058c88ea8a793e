"""Tables, the throughput model, figures and the report, on synthetic runs with known answers."""

import json

import numpy as np
import pytest

from analysis.__main__ import main as analysis_main
from analysis.figures import make_all
from analysis.report import build_report
from analysis.runs import load_questions, load_steps, load_summaries, read_spec_bench
from analysis.tables import leaderboard, render, run_task_stats
from analysis.throughput import fit_verify_latency, model_table, requirements
from specbench.data import Prompt
from specbench.decoding.loop import StepRecord
from specbench.records import Answer, RunDirectory

INTERCEPT, PER_TOKEN = 0.050, 0.002  # the target latency the synthetic steps are generated from


def synthetic_run(path, drafter, speed, baseline_speed, accepted, draft_s=0.0, verify_tokens=1, source="", seed=0):
    """A run directory whose questions decode at ``speed`` tokens/s against ``baseline_speed``; every step
    accepts ``accepted`` tokens after verifying ``verify_tokens`` (timed by the synthetic target latency)."""
    rng = np.random.default_rng(seed)
    run = RunDirectory(path, with_baseline=True)
    run.open({"model": "m", "drafter": {"name": drafter}})
    for index, task in enumerate(["qa", "qa", "rag", "rag"]):
        question_id = 100 + index
        tokens = accepted * 20 + 1
        method, base = Answer(), Answer()
        verify = INTERCEPT + PER_TOKEN * verify_tokens
        steps = [StepRecord(0, 0, 50, 1, 0.0, 0.1, 0.0, 50)]
        steps += [StepRecord(i, verify_tokens - 1, verify_tokens, accepted, draft_s,
                             verify * (1 + rng.normal(0, 0.01)), 0.0001, 50 + i, source=source)
                  for i in range(1, 21)]
        method.texts, method.token_ids, method.steps, method.wall_times = ["x"], [list(range(tokens))], [steps], [tokens / speed]
        base.texts, base.token_ids, base.steps = ["x"], [list(range(tokens))], [[StepRecord(0, 0, 50, 1, 0, 0.1, 0, 50)] * tokens]
        base.wall_times = [tokens / baseline_speed]
        prompt = Prompt(question_id, task, task, ("q",))
        run.add(method.to_record(prompt, drafter, True), base.to_record(prompt, "ar", None), method.step_rows(question_id))
    run.write_summary({"model": "m", "drafter": drafter, "environment": {}})
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    synthetic_run(root / "pld-1", "pld", speed=30, baseline_speed=15, accepted=2, verify_tokens=5, seed=1)
    synthetic_run(root / "pld-2", "pld", speed=36, baseline_speed=15, accepted=2, verify_tokens=5, seed=2)
    synthetic_run(root / "hd-1", "hd", speed=45, baseline_speed=15, accepted=3, verify_tokens=20, source="context", seed=3)
    synthetic_run(root / "sps-1", "sps", speed=20, baseline_speed=15, accepted=3, draft_s=0.04, verify_tokens=4, seed=4)
    return root


def test_leaderboard_reports_speedup_and_mat_with_spread_over_repeats(runs):
    questions = load_questions([runs])
    assert len(questions) == 16 and set(questions.task) == {"qa", "rag"}
    table = leaderboard(questions)
    pld = table.loc[("m", "pld")]
    assert pld[("overall", "speedup", "mean")] == pytest.approx(2.2)  # runs at 2.0x and 2.4x
    assert pld[("overall", "speedup", "std")] == pytest.approx(np.std([2.0, 2.4], ddof=1))
    assert pld[("qa", "mat", "mean")] == pytest.approx((1 + 20 * 2) / 21)
    assert pld[("runs", "", "")] == 2 and np.isnan(table.loc[("m", "hd")][("overall", "speedup", "std")])
    markdown = render(table, "md")
    assert "| pld |" in markdown and "2.20x ± 0.28" in markdown
    assert r"\pm" in render(table, "latex")
    assert "overall_speedup_mean" in render(table, "csv").splitlines()[0]


def test_spec_bench_answer_files_join_the_table(tmp_path):
    def line(qid, category, tokens, seconds):
        return json.dumps({"question_id": qid, "category": category, "choices": [
            {"turns": ["a"], "new_tokens": [tokens], "wall_time": [seconds], "accept_lengths": [1] * 10}]})
    (tmp_path / "eagle.jsonl").write_text(line(81, "writing", 100, 2.0) + "\n" + line(161, "translation", 50, 1.0) + "\n")
    (tmp_path / "base.jsonl").write_text(line(81, "writing", 100, 4.0) + "\n" + line(161, "translation", 50, 2.0) + "\n")
    frame = read_spec_bench(tmp_path / "eagle.jsonl", tmp_path / "base.jsonl", "vicuna-7b", "eagle")
    assert list(frame.task) == ["mt_bench", "translation"]
    stats = run_task_stats(frame)
    assert stats[stats.task == "overall"].speedup.iloc[0] == pytest.approx(2.0)


def test_the_fit_recovers_the_latency_the_steps_were_made_with(runs):
    steps = load_steps([runs])
    intercept, slope = fit_verify_latency(steps)
    assert intercept == pytest.approx(INTERCEPT, rel=0.02) and slope == pytest.approx(PER_TOKEN, rel=0.03)
    table = model_table(steps)
    assert table.deviation.abs().max() < 0.02
    sps = table[table.label == "sps"].iloc[0]
    assert sps.predicted_tps == pytest.approx(3 / (0.04 + INTERCEPT + 4 * PER_TOKEN), rel=0.02)


def test_requirements_say_what_would_match_the_best(runs):
    table = model_table(load_steps([runs]))
    needs = requirements(table).set_index("label")
    best = table.loc[table.measured_tps.idxmax()]
    assert needs.loc[best.label].acceptance_factor == pytest.approx(1.0, rel=0.02)
    sps = needs.loc["sps"]
    # with the needed draft latency, 3 tokens per step would run at the best throughput
    verify = INTERCEPT + 4 * PER_TOKEN
    assert 3 / (sps.needed_draft_ms / 1000 + verify) == pytest.approx(best.measured_tps, rel=0.03)
    assert sps.needed_mat > sps.mat


def test_figures_and_report_are_written(runs, tmp_path):
    questions, steps = load_questions([runs]), load_steps([runs])
    written, skipped = make_all(questions, steps, tmp_path / "figures")
    names = {path.name for path in written}
    assert {"speedup_per_task.png", "speedup_per_task.pdf", "latency_breakdown.png", "hd_ablation.png",
            "predicted_vs_measured.pdf"} <= names
    assert all(path.stat().st_size > 1000 for path in written)
    assert any("draft_latency_depth" in reason for reason in skipped)
    report = build_report(questions, steps, tmp_path / "report.html")
    text = report.read_text()
    assert "data:image/png;base64," in text and "Throughput model" in text and "2.20x" in text


def test_command_line(runs, tmp_path, capsys):
    analysis_main(["tables", str(runs), "--format", "csv", "--out", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text().startswith("model,label")
    analysis_main(["throughput", str(runs)])
    assert "largest deviation" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        analysis_main(["tables", str(tmp_path / "nothing")])
    assert not load_summaries([tmp_path / "nothing"]).shape[0]
