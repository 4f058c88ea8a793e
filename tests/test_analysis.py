"""Tables, the throughput model, figures and the report, on synthetic runs with known answers."""

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.__main__ import main as analysis_main
from analysis.figures import make_all
from analysis.report import build_report
from analysis.runs import load_questions, load_steps, load_summaries, read_spec_bench
from analysis.tables import leaderboard, render, run_task_stats
from analysis.throughput import (deviation_summary, latency_lookup, measured_rate, model_table, requirements,
                                 token_costs)
from specbench.questions import Prompt
from specbench.decoding.loop import StepRecord
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer

# The target latency per verified-token count the synthetic steps are timed by: not a line (2-3 tokens are
# slower than 4, as small matrix products take a slower kernel on a CPU).
LATENCY = {1: 0.050, 2: 0.060, 3: 0.060, 4: 0.052, 11: 0.090}


def synthetic_run(path, drafter, accepted, verify_tokens, speed=30, baseline_speed=15, draft_s=0.0,
                  overhead_s=0.0001, slowdown=1.0, noise=0.01, threads=2, calibrated=True, source="", seed=0,
                  context_start=50, context_cost=0.0, tasks=("qa", "qa", "rag", "rag"), first_question=100,
                  settings=None, header=None):
    """A run directory whose questions decode at ``speed`` tokens/s against ``baseline_speed`` (the answers);
    its decoding steps accept ``accepted`` tokens each and verify the counts of ``verify_tokens`` in turn,
    each timed by LATENCY x ``slowdown`` (another process on the machine) with relative noise ``noise``.
    It is calibrated (verify_latency.json) with LATENCY itself, and ran on ``threads`` CPU threads. Step i
    attends to ``context_start + i`` tokens, each costing ``context_cost`` seconds on top of LATENCY. It answers
    one question per entry of ``tasks`` (ids ``first_question``, +1, ...); ``settings`` are added to its
    run.json (schema 2's layout) and ``header`` to its summary.json."""
    rng = np.random.default_rng(seed)
    run = RunDirectory(path, with_baseline=True)
    run.open({"schema_version": 2, "model": "m", "drafter": {"name": drafter}, "device": "cpu", "dtype": "float32",
              "threads": threads, **(settings or {})})
    for index, task in enumerate(tasks):
        question_id = first_question + index
        tokens = accepted * 20 + 1
        method, base = Answer(), Answer()
        steps = [StepRecord(step=0, draft_tokens=0, candidate_tokens=0, verify_tokens=50, accepted_tokens=1,
                             draft_s=0.0, verify_s=0.1, overhead_s=0.0, context_len=50)]
        for i in range(1, 21):
            count = verify_tokens[i % len(verify_tokens)]
            context = context_start + i
            verify_s = (LATENCY[count] + context_cost * context) * slowdown * (1 + rng.normal(0, noise))
            steps.append(StepRecord(
                step=i, draft_tokens=count - 1, candidate_tokens=count - 1, verify_tokens=count,
                accepted_tokens=accepted, draft_s=draft_s, verify_s=verify_s, overhead_s=overhead_s,
                context_len=context, draft_depth=count - 1, source=source))
        method.texts, method.token_ids, method.steps, method.wall_times = ["x"], [list(range(tokens))], [steps], [tokens / speed]
        base.texts, base.token_ids = ["x"], [list(range(tokens))]
        base.steps = [[StepRecord(step=0, draft_tokens=0, verify_tokens=50, accepted_tokens=1, draft_s=0,
                                   verify_s=0.1, overhead_s=0, context_len=50)] * tokens]
        base.wall_times = [tokens / baseline_speed]
        prompt = Prompt(question_id, task, task, ("q",))
        run.add(method.to_record(prompt, drafter, True), base.to_record(prompt, "ar", None), method.step_rows(question_id))
    run.write_summary({"model": "m", "drafter": drafter, "environment": {}, **(header or {})})
    if calibrated:
        (path / "verify_latency.json").write_text(json.dumps(
            {"latency_s": {str(count): seconds for count, seconds in LATENCY.items()}, "pad_to": {}}))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    synthetic_run(root / "pld-1", "pld", accepted=2, verify_tokens=(3,), speed=30, seed=1)
    synthetic_run(root / "pld-2", "pld", accepted=2, verify_tokens=(3,), speed=36, seed=2)
    synthetic_run(root / "hd-1", "hd", accepted=3, verify_tokens=(4, 11), speed=45, source="context", seed=3)
    synthetic_run(root / "sps-1", "sps", accepted=3, verify_tokens=(4, 11), speed=20, draft_s=0.04, seed=4)
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


def by_run(table):
    return table.assign(run=table.run_dir.map(lambda path: Path(path).name)).set_index("run")


def test_the_latency_table_is_looked_up_not_fitted():
    table = {1: 0.050, 3: 0.060, 4: 0.052, 11: 0.090}
    seconds = latency_lookup(table, [1, 2, 3, 4, 7.5, 11, 15])
    assert seconds.tolist() == pytest.approx([0.050, 0.055, 0.060, 0.052, 0.071, 0.090, 0.090 + 4 * 0.038 / 7])
    # flat below the smallest count, and never extrapolated downward
    assert latency_lookup({3: 0.060, 4: 0.052}, [1, 6]).tolist() == pytest.approx([0.060, 0.052])
    assert latency_lookup({3: 0.060}, [2, 3, 9]).tolist() == pytest.approx([0.060] * 3)


def test_predictions_from_outside_the_run_recover_its_measured_rate(runs):
    table = by_run(model_table(load_steps([runs])))
    assert table.calib_dev.abs().max() < 0.005 and table.loo_dev.abs().max() < 0.005
    assert (table.loo_runs == 3).all() and (table.loo_outside == 0).all() and (table.reference == "leave-one-out").all()
    assert table.loc["pld-1", "tokens_per_step"] == 2  # per decoding step; MAT, with the prefill, is 41/21
    sps = table.loc["sps-1"]
    assert sps.calib_target_ms == pytest.approx(1000 * (LATENCY[4] + LATENCY[11]) / 2)
    assert sps.calib_tps == pytest.approx(3 / (0.04 + (LATENCY[4] + LATENCY[11]) / 2 + 0.0001))
    assert sps.loo_target_ms == pytest.approx(sps.calib_target_ms, rel=0.005)  # hd-1's steps, 1% noise
    assert sps.measured_tps == pytest.approx(sps.calib_tps, rel=0.005)
    assert deviation_summary(table).startswith("calibration 0.") and ", leave-one-out 0." in deviation_summary(table)


def test_a_line_fitted_in_sample_misses_a_latency_that_is_not_a_line(runs):
    """The check that fails if the model goes back to one line over every run's steps: on this latency
    table the line is several percent off even in sample, while the looked-up tables are within noise."""
    decode = load_steps([runs]).query("step > 0")
    slope, intercept = np.polyfit(decode.verify_tokens.astype(float), decode.verify_s, 1)
    line_deviations = [run.accepted_tokens.sum() / (run.draft_s + intercept + slope * run.verify_tokens
                                                    + run.overhead_s).sum() / measured_rate(run) - 1
                       for _, run in decode.groupby("run_dir")]
    assert max(map(abs, line_deviations)) > 0.04
    table = model_table(load_steps([runs]))
    assert max(table.calib_dev.abs().max(), table.loo_dev.abs().max()) < 0.005


def test_leave_one_out_uses_only_the_other_runs_of_the_same_hardware(tmp_path):
    synthetic_run(tmp_path / "a", "pld", accepted=2, verify_tokens=(3,), noise=0)
    synthetic_run(tmp_path / "b", "pld", accepted=2, verify_tokens=(3,), noise=0, slowdown=1.2)  # a busy machine
    synthetic_run(tmp_path / "c", "pld", accepted=2, verify_tokens=(3,), noise=0, slowdown=2.0, threads=4)
    synthetic_run(tmp_path / "d", "pld", accepted=2, verify_tokens=(3,), noise=0, threads=8, calibrated=False)
    table = by_run(model_table(load_steps([tmp_path])))
    a, b, c, d = (table.loc[run] for run in "abcd")
    # a's table is b's steps alone: with a's own it would be 66 ms, with c's and d's (other threads) 84 ms
    assert a.loo_target_ms == pytest.approx(72.0) and a.loo_runs == 1 and b.loo_target_ms == pytest.approx(60.0)
    assert a.loo_dev == pytest.approx((0.060 + 0.0001) / (0.072 + 0.0001) - 1)
    assert a.calib_dev == pytest.approx(0, abs=1e-12)
    assert b.calib_dev == pytest.approx((0.072 + 0.0001) / (0.060 + 0.0001) - 1)
    assert c.loo_runs == 0 and np.isnan(c.loo_tps) and c.reference == "calibration"
    assert c.calib_dev == pytest.approx((0.120 + 0.0001) / (0.060 + 0.0001) - 1)
    assert d.reference == "" and np.isnan(d.calib_tps) and np.isnan(d.loo_tps) and np.isnan(d.dsd_form_tps)
    assert requirements(table).needed_draft_ms.isna().sum() == 1  # d's: nothing predicts its target latency


SINGLE = {"processes": 1, "placement": "single", "devices": "cpu", "linear_backend_used": "aten"}


@pytest.mark.parametrize("key, other", [("processes", 2), ("placement", "tensor_parallel"), ("devices", "cuda:0,cuda:1"),
                                        ("linear_backend_used", "onednn"),
                                        # a compiled run (run.json records the regime off eager only)
                                        ("run", {"regime": "compiled", "compile_buckets": [1, 2, 4]})])
def test_leave_one_out_keeps_runs_placed_otherwise_apart(tmp_path, key, other):
    """Runs of one model, device, dtype and threads placed otherwise (another process count, placement, set of
    devices or linear kernel: specbench.run.identity's PLACEMENT_KEYS) or in another regime (run.regime) time their
    passes otherwise, so neither is
    in the other's leave-one-out table. a and b are placed alike (b 20% slower); c, placed otherwise, is twice as
    slow: with c, a's table would be 96 ms, not b's 72."""
    synthetic_run(tmp_path / "a", "pld", accepted=2, verify_tokens=(3,), noise=0, settings=SINGLE)
    synthetic_run(tmp_path / "b", "pld", accepted=2, verify_tokens=(3,), noise=0, slowdown=1.2, settings=SINGLE)
    synthetic_run(tmp_path / "c", "pld", accepted=2, verify_tokens=(3,), noise=0, slowdown=2.0,
                  settings={**SINGLE, key: other})
    table = by_run(model_table(load_steps([tmp_path])))
    a, b, c = (table.loc[run] for run in "abc")
    assert (a.loo_runs, b.loo_runs, c.loo_runs) == (1, 1, 0)
    assert a.loo_target_ms == pytest.approx(72.0) and b.loo_target_ms == pytest.approx(60.0)
    assert np.isnan(c.loo_tps) and c.reference == "calibration"


def test_leave_one_out_corrects_for_the_context_a_step_attends_to(tmp_path):
    """Run a decodes at short contexts, b at long ones; each pass costs 25 us per context token. a's prediction
    from b's steps holds only with the context term (without it, b's latency at ~600 tokens would be used)."""
    synthetic_run(tmp_path / "a", "pld", accepted=2, verify_tokens=(3,), noise=0, context_cost=25e-6)
    synthetic_run(tmp_path / "b", "pld", accepted=2, verify_tokens=(3,), noise=0, context_cost=25e-6,
                  context_start=600)
    table = by_run(model_table(load_steps([tmp_path])))
    a = table.loc["a"]
    assert a.loo_context_us == pytest.approx(25.0)
    assert a.loo_dev == pytest.approx(0, abs=1e-9)
    assert a.loo_target_ms == pytest.approx(a.verify_ms)
    assert a.calib_dev > 0.01  # the calibration table knows no context, so it underestimates a's passes


def test_the_overhead_is_in_the_prediction_and_not_in_dsd_form(tmp_path):
    synthetic_run(tmp_path / "slow-loop", "pld", accepted=2, verify_tokens=(3,), draft_s=0.01, overhead_s=0.05, noise=0)
    row = model_table(load_steps([tmp_path])).iloc[0]
    assert row.overhead_ms == pytest.approx(50) and row.measured_tps == pytest.approx(2 / (0.01 + 0.060 + 0.05))
    assert row.calib_dev == pytest.approx(0, abs=1e-12)
    assert row.dsd_form_tps / row.measured_tps - 1 == pytest.approx(0.05 / (0.01 + 0.060))  # the overhead's share


def test_requirements_say_what_would_match_the_best(runs):
    table = model_table(load_steps([runs]))
    needs = requirements(table).set_index("label")
    best = table.loc[table.measured_tps.idxmax()]
    assert best.label == "hd" and needs.loc["hd"].acceptance_factor == pytest.approx(1.0, rel=0.005)
    sps = needs.loc["sps"]
    # sps accepts as many tokens as hd on the same shapes: only a draft that takes no time would match it
    assert sps.needed_draft_ms == pytest.approx(0, abs=1.0) and sps.draft_ms == pytest.approx(40)
    verify = (LATENCY[4] + LATENCY[11]) / 2
    assert sps.needed_tokens_per_step == pytest.approx(best.measured_tps * (0.04 + verify + 0.0001), rel=0.005)
    assert sps.acceptance_factor == pytest.approx((0.04 + verify + 0.0001) / (verify + 0.0001), rel=0.01)


def test_figures_and_report_are_written(runs, tmp_path):
    questions, steps = load_questions([runs]), load_steps([runs])
    written, skipped = make_all(questions, steps, tmp_path / "figures")
    names = {path.name for path in written}
    assert {"speedup_per_task.png", "speedup_per_task.pdf", "latency_breakdown.png", "hd_ablation.png",
            "predicted_vs_measured.pdf", "cost_per_token.png"} <= names
    assert all(path.stat().st_size > 1000 for path in written)
    assert any("draft_latency_depth" in reason for reason in skipped)
    report = build_report(questions, steps, tmp_path / "report.html")
    text = report.read_text()
    assert "data:image/png;base64," in text and "Throughput model" in text and "2.20x" in text
    throughput = text[text.index("<h2>Throughput model"):text.index("<h2>Figures")]
    assert ">tokens per step</th>" in throughput and ">MAT</th>" not in throughput
    assert "leave-one-out 0." in throughput
    assert "Where an accepted token" in text and ">extra verify</th>" in text


def test_predicted_vs_measured_is_drawn_with_what_it_has_or_skipped_with_the_reason(tmp_path, capsys, monkeypatch):
    """One run as the README's first command makes it (no calibration, no other run): nothing predicts its
    throughput, so the figure is skipped, saying why, as the other figures that cannot be drawn are; never an
    empty frame. Beside a run that is predicted, it is drawn with that run's point, the other run named on it."""
    from analysis import figures

    runs = tmp_path / "runs"
    synthetic_run(runs / "alone", "pld", accepted=2, verify_tokens=(3,), calibrated=False)
    analysis_main(["figures", str(runs), "--out", str(tmp_path / "one")])
    assert f"skipped: predicted_vs_measured: {figures.NO_PREDICTION}" in capsys.readouterr().err
    assert not (tmp_path / "one" / "predicted_vs_measured.png").exists()
    assert (tmp_path / "one" / "throughput_vs_acceptance.png").is_file()  # the figures it can have are drawn
    assert figures.predicted_vs_measured(model_table(load_steps([runs])), tmp_path / "direct") == []

    synthetic_run(runs / "calibrated", "sps", accepted=3, verify_tokens=(4, 11), threads=4)  # no peer of alone's
    drawn, save = {}, figures._save

    def keep(figure, out, name):
        drawn[name] = {"texts": [text.get_text() for ax in figure.axes for text in ax.texts],
                       "points": [len(points.get_offsets()) for ax in figure.axes for points in ax.collections]}
        return save(figure, out, name)

    monkeypatch.setattr(figures, "_save", keep)
    written, skipped = make_all(load_questions([runs]), load_steps([runs]), tmp_path / "two")
    assert tmp_path / "two" / "predicted_vs_measured.png" in written
    assert not [reason for reason in skipped if "predicted_vs_measured" in reason]
    shown = drawn["predicted_vs_measured"]
    assert shown["points"] == [1]  # the calibrated run, by its calibration; nothing predicts the other
    assert "sps" in shown["texts"] and "not predicted (no calibration, no run timed alike): pld" in shown["texts"]


def test_command_line(runs, tmp_path, capsys):
    analysis_main(["tables", str(runs), "--format", "csv", "--out", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text().startswith("model,label")
    analysis_main(["throughput", str(runs)])
    out = capsys.readouterr().out
    assert "largest deviation of predicted from measured throughput: calibration 0." in out
    assert "tokens_per_step" in out and " mat " not in out and "needed_tokens_per_step" in out
    assert "one_pass" in out and "needed_tokens_per_step_2x" in out
    with pytest.raises(SystemExit):
        analysis_main(["tables", str(tmp_path / "nothing")])
    assert not load_summaries([tmp_path / "nothing"]).shape[0]


def test_runs_are_labelled_by_method_names_not_override_strings(tmp_path):
    """A tuned run is shown as `hd+budget`, never under the published name; sweep cells that share a method
    name are told apart by the overrides that differ, and repeats of one configuration keep one label."""
    tuned = synthetic_run(tmp_path / "tuned", "hd", accepted=3, verify_tokens=(4,), seed=5)
    summary = json.loads((tuned / "summary.json").read_text())
    (tuned / "summary.json").write_text(json.dumps({**summary, "method": "hd+budget"}))
    older = synthetic_run(tmp_path / "older", "pld", accepted=2, verify_tokens=(3,), seed=6)
    settings = json.loads((older / "run.json").read_text())  # written before the method name was recorded
    (older / "run.json").write_text(json.dumps({**settings, "draft_budget": "auto", "verify_padding": "off"}))
    for name, gamma in (("g2", 2), ("g4", 4), ("g4-again", 4)):
        cell = synthetic_run(tmp_path / name, "sps", accepted=2, verify_tokens=(3,), seed=7)
        (cell / ".hydra").mkdir()
        (cell / ".hydra" / "overrides.yaml").write_text(f"- drafter=sps\n- drafter.gamma={gamma}\n")
    labels = dict(zip(load_summaries([tmp_path]).run_dir.map(lambda d: Path(d).name),
                      load_summaries([tmp_path]).label))
    assert labels == {"tuned": "hd+budget", "older": "pld+budget", "g2": "sps gamma=2", "g4": "sps gamma=4",
                      "g4-again": "sps gamma=4"}


def test_runs_of_one_method_with_other_settings_are_not_averaged_as_repeats(tmp_path):
    for name, corpus in (("docs", "python-docs"), ("chat", "sharegpt"), ("chat-again", "sharegpt")):
        run = synthetic_run(tmp_path / name, "rest", accepted=2, verify_tokens=(3,), seed=8)
        settings = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**settings, "drafter": {"name": "rest", "corpus": corpus,
                                                                          "num_draft": 64}}))
    labels = set(load_summaries([tmp_path]).label)
    assert labels == {"rest corpus=python-docs", "rest corpus=sharegpt"}


def test_an_accepted_tokens_time_is_split_into_the_throughput_models_terms():
    import pandas as pd

    steps = pd.DataFrame({"label": "x", "step": [0, 1, 2, 3], "accepted_tokens": [1, 1, 3, 2],
                          "draft_s": [0.5, 0.001, 0.001, 0.001], "verify_s": [0.5, 0.05, 0.06, 0.07],
                          "overhead_s": [0.5, 0.001, 0.001, 0.001], "verify_tokens": [30, 2, 5, 5]})
    questions = pd.DataFrame({"label": ["x"], "baseline_tokens": [100], "baseline_seconds": [4.0]})
    row = token_costs(questions, steps).iloc[0]
    # AR: 40 ms per token. 6 tokens in 3 steps: one AR pass per step costs 40 * 3 / 6 = 20 ms per token, the
    # verify time beyond it (60 - 40 ms per step) 10, drafting and overhead 0.5 each; the prefill is left out.
    assert row.ar_ms_per_token == pytest.approx(40)
    assert (row.one_pass, row.extra_verify, row.draft, row.overhead) == pytest.approx((20, 10, 0.5, 0.5))
    assert row.total == pytest.approx(31) and row.speedup_bound == pytest.approx(40 / 31)
    assert row.needed_tokens_per_step_2x == pytest.approx(2 * 62 / 40)  # 2 x (1 + 60 + 1) ms per step / 40 ms
