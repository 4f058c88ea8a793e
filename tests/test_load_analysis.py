"""Runs under load (load.jsonl: the load table, speedup_vs_concurrency, the report's section) and runs whose steps
have no per-step times (an engine that does not expose them), on synthetic run directories with known numbers."""

import json
import logging
import math

import numpy as np
import pandas as pd
import pytest
from test_analysis import synthetic_run
from test_report_layout import parsed

from analysis.__main__ import main as analysis_main
from analysis.display import MAX_COLUMNS, MISSING, is_code_identifier
from analysis.figures import make_all
from analysis.load import load_cells, load_table, render_load
from analysis.report import build_report
from analysis.runs import NO_STEP_TIMES, load_runs, timed_steps, untimed_runs
from analysis.tables import acceptance_table, leaderboard
from analysis.throughput import model_table, token_costs
from specbench.results.load import LOAD_FILE, ServedRequest, read_load_levels, summarise_level
from specbench.results.steps_file import read_steps_file, write_steps_file

QUESTIONS = (100, 101, 102, 103)
TOKENS = 10  # per request
# concurrency -> (AR's duration, the method's duration) in seconds; None: that role's line is missing
DURATIONS = {1: (2.0, 1.0), 4: (1.0, 0.8), 16: (0.5, 0.5), 64: (None, 0.4)}
# The method's verify steps per request: 10 drafts of 3 tokens accepting 3, 3, 2, 2, 2, 1, 1, 1, 0, 0 (15 in all;
# 8 drafts accepted position 1, 5 position 2, 2 position 3), as (draft depths, accept lengths with the bonus token).
VERIFY_STEPS = {100: ([3, 3, 3], [4, 4, 3]), 101: ([3, 3, 3], [3, 3, 2]), 102: ([3, 3], [2, 2]),
                103: ([3, 3], [1, 1])}


def requests(first_token_s: float, differ: int | None = None, speculated: bool = False) -> list[ServedRequest]:
    """One request per question, TOKENS tokens each, the i-th's first token at ``first_token_s`` x (i + 1) and its
    last 0.9 s later; the request of question ``differ`` has other tokens than AR's; ``speculated``: with
    VERIFY_STEPS."""
    return [ServedRequest(question, first_token_s * (index + 1), first_token_s * (index + 1) + 0.9,
                          [7] * TOKENS if question == differ else list(range(TOKENS)),
                          *(VERIFY_STEPS[question] if speculated else (None, None)))
            for index, question in enumerate(QUESTIONS)]


def write_load(run_dir, durations=DURATIONS) -> None:
    """load.jsonl as the vLLM engine appends it: per concurrency the baseline's line, then the method's."""
    lines = []
    for concurrency, (baseline_s, method_s) in durations.items():
        baseline = None
        if baseline_s is not None:
            level = summarise_level(concurrency, "baseline", "ar@vllm", requests(0.02), baseline_s)
            lines.append(level.to_line())
            baseline = {question: list(range(TOKENS)) for question in QUESTIONS}
        if method_s is not None:
            lines.append(summarise_level(concurrency, "method", "pld@vllm",
                                         requests(0.01, differ=103, speculated=True), method_s,
                                         baseline_tokens=baseline).to_line())
    (run_dir / LOAD_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))


def without_step_times(run_dir) -> None:
    """The run's steps.parquet as an engine without per-step phase times writes it: every second null."""
    steps = read_steps_file(run_dir / "steps.parquet")
    write_steps_file(steps.assign(draft_s=None, verify_s=None, overhead_s=None), run_dir / "steps.parquet")


def vllm_run(path, with_load=True):
    """A run of pld@vllm: answers and a baseline like any run, steps without times, load.jsonl."""
    synthetic_run(path, "pld", accepted=2, verify_tokens=(3,), speed=40, calibrated=False, seed=11,
                  header={"method": "pld@vllm"}, settings={"engine": {"name": "vllm"}})
    without_step_times(path)
    if with_load:
        write_load(path)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("load-runs")
    synthetic_run(root / "pld-1", "pld", accepted=2, verify_tokens=(3,), speed=30, seed=1)
    synthetic_run(root / "sps-1", "sps", accepted=3, verify_tokens=(4, 11), speed=20, draft_s=0.04, seed=4)
    vllm_run(root / "vllm")
    return root


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Runs none of which ran under load."""
    root = tmp_path_factory.mktemp("plain-runs")
    synthetic_run(root / "pld-1", "pld", accepted=2, verify_tokens=(3,), speed=30, seed=1)
    synthetic_run(root / "sps-1", "sps", accepted=3, verify_tokens=(4, 11), speed=20, draft_s=0.04, seed=4)
    return root


def test_the_load_table_divides_by_ar_at_the_same_concurrency(root):
    table = load_table(load_runs([root], with_steps=False).load)
    assert list(table.index) == [("m", "pld@vllm", c) for c in (1, 4, 16, 64)]
    rows = table.xs(("m", "pld@vllm"))
    assert rows.tokens_per_s.tolist() == pytest.approx([40 / 1.0, 40 / 0.8, 40 / 0.5, 40 / 0.4])
    assert rows.ar_tokens_per_s[:3].tolist() == pytest.approx([20, 40, 80])
    assert rows.speedup[:3].tolist() == pytest.approx([2.0, 1.25, 1.0])
    assert rows.requests_per_s.loc[4] == pytest.approx(4 / 0.8) and rows.ar_requests_per_s.loc[4] == pytest.approx(4)
    # TTFT 10, 20, 30, 40 ms for the method (20, ..., 80 for AR): p50 25 ms, p90 37 ms, p99 39.7 ms
    assert (rows.ttft_p50_ms[1], rows.ttft_p90_ms[1], rows.ttft_p99_ms[1]) == pytest.approx((25, 37, 39.7))
    assert rows.ar_ttft_p50_ms[1] == pytest.approx(50)
    assert rows.tpot_mean_ms[1] == pytest.approx(100) and rows.ar_tpot_p99_ms[1] == pytest.approx(100)
    assert rows.mean_acceptance_length[1] == pytest.approx(2.5)
    # vLLM's per-position rate: of all 10 drafts, 8, 5 and 2 accepted positions 1, 2 and 3
    assert rows[["per_position_rate_1", "per_position_rate_2", "per_position_rate_3"]].iloc[0].tolist() == \
        pytest.approx([0.8, 0.5, 0.2])
    assert math.isnan(rows.per_position_rate_4[1])  # no draft reached position 4: unknown, not 0
    assert rows.identical[1] == 3 and rows.requests[1] == 4 and rows.runs[1] == 1


def test_a_load_file_of_before_the_rename_is_read_with_vllms_definition_under_its_name(tmp_path):
    """load.jsonl once called vLLM's per-position rate (of all drafts) acceptance_by_position, summary.json's name of
    the share of the drafts that reached a position: an older file is read as what it recorded."""
    run = vllm_run(tmp_path / "old")
    lines = [json.loads(line) for line in (run / LOAD_FILE).read_text().splitlines()]
    for line in lines:
        line["acceptance_by_position"] = line.pop("per_position_acceptance_rate")
    (run / LOAD_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    method = read_load_levels(run)[1]
    assert method["per_position_acceptance_rate"] == pytest.approx([0.8, 0.5, 0.2]) and method["role"] == "method"
    assert "acceptance_by_position" not in method
    rows = load_table(load_runs([tmp_path], with_steps=False).load).xs(("m", "pld@vllm"))
    assert rows.per_position_rate_2[1] == pytest.approx(0.5) and rows.mean_acceptance_length[1] == pytest.approx(2.5)


def test_a_level_figures_vllms_per_position_rate_of_all_drafts_not_the_share_of_those_that_reached_it():
    """Drafts of different depths tell the two definitions apart from position 2 on: a 3-token draft that accepted
    all 3 and a 1-token draft that accepted it. Of all drafts, 1/2 accepted position 2 (vLLM's
    per_position_acceptance_rate); of the drafts that reached position 2, 1/1 (summary.json's
    acceptance_by_position). A line holds the first, under its name, and MAL = 1 + (3 + 1) / 2."""
    from specbench.measure import metrics

    served = [ServedRequest(1, 0.1, 0.5, [5, 6, 7, 8, 9], [3], [4]), ServedRequest(2, 0.1, 0.3, [5, 6], [1], [2])]
    line = summarise_level(2, "method", "suffix@vllm", served, 1.0).to_line()
    assert line["per_position_acceptance_rate"] == [1.0, 0.5, 0.5]
    assert metrics.acceptance_by_position([4, 2], [3, 1]) == [1.0, 1.0, 1.0]  # the other definition
    assert (line["drafts"], line["draft_tokens"], line["accepted_tokens"]) == (2, 4, 4)
    assert line["mean_acceptance_length"] == 3.0 and line["output_tokens_per_s"] == 7.0


def test_the_two_per_position_figures_have_two_names_and_two_headers(root):
    """The load table shows vLLM's rate (of all drafts) under its own header; the acceptance table's accepted at
    position i (of the drafts that reached it) keeps the other."""
    from analysis.load import HEADERS
    from analysis.tables import acceptance_headers

    load_headers = {HEADERS[f"per_position_rate_{p}"] for p in range(1, 5)}
    assert load_headers == {f"accepted at position {p} of all drafts" for p in range(1, 5)}
    assert not load_headers & set(acceptance_headers().values())
    line = read_load_levels(root / "vllm")[1]
    assert "per_position_acceptance_rate" in line and "acceptance_by_position" not in line


def test_a_level_without_its_ar_line_has_no_speedup(root):
    row = load_table(load_runs([root], with_steps=False).load).loc[("m", "pld@vllm", 64)]
    assert math.isnan(row.speedup) and math.isnan(row.ar_tokens_per_s) and math.isnan(row.identical)
    assert row.tokens_per_s == pytest.approx(100)  # the method's own figures are still shown
    cells = load_cells(load_table(load_runs([root], with_steps=False).load)).set_index("concurrency")
    assert cells.loc["64", "speedup"] == "-" and cells.loc["64", "identical"] == "-"
    assert cells.loc["1", "speedup"] == "2.00x" and cells.loc["1", "identical"] == "3/4"


def test_a_run_reached_twice_is_one_run_under_load(root):
    table = load_table(load_runs([root, root / "vllm"], with_steps=False).load)
    assert (table.runs == 1).all() and table.loc[("m", "pld@vllm", 1)].requests == 4


def test_repeats_average_and_a_missing_ar_line_in_one_makes_the_speedup_unknown(tmp_path):
    vllm_run(tmp_path / "a")
    vllm_run(tmp_path / "b", with_load=False)
    write_load(tmp_path / "b", {1: (1.0, 1.0), 4: (None, 0.8), 16: (0.5, 0.5)})
    table = load_table(load_runs([tmp_path], with_steps=False).load).xs(("m", "pld@vllm"))
    assert table.runs[1] == 2 and table.speedup[1] == pytest.approx((2.0 + 1.0) / 2)
    assert math.isnan(table.speedup[4])  # run b has no AR line at 4: no mean made of run a's alone
    assert table.identical[1] == 6 and table.requests[1] == 8


def test_damaged_lines_of_load_jsonl_are_left_out_with_one_warning(tmp_path, caplog):
    run = vllm_run(tmp_path / "v")
    good = (run / LOAD_FILE).read_text()
    (run / LOAD_FILE).write_text(good + json.dumps({"concurrency": 0, "role": "method"}) + "\n"
                                 + good.splitlines(keepends=True)[0] + "not json\n" + '{"cut": ')
    with caplog.at_level(logging.WARNING, logger="analysis"):
        loaded = load_runs([tmp_path], with_steps=False)
    assert len(loaded.load) == 7
    warnings = [record.getMessage() for record in caplog.records if LOAD_FILE in record.getMessage()]
    assert len(warnings) == 1 and "line 8 has concurrency 0, not a whole number" in warnings[0]
    assert "line 9 repeats concurrency 1 baseline of line 1" in warnings[0] and "line 10 is not valid JSON" in warnings[0]
    assert "line 11" not in warnings[0]  # the last line, cut short: an interrupted write, measured again on resume


def test_tables_prints_the_load_table_only_when_a_run_ran_under_load(root, plain, capsys):
    analysis_main(["tables", str(root), "--table", "load"])
    out = capsys.readouterr().out
    assert "| model | method | concurrency | AR tok/s | tok/s | speedup |" in out
    assert "| m | pld@vllm | 1 | 20.0 | 40.0 | 2.00x |" in out and "| 64 | - | 100.0 | - |" in out
    assert "AR TTFT p99 ms" in out and "TPOT mean ms" in out and "3/4" in out
    analysis_main(["tables", str(root), "--table", "load", "--format", "csv"])
    csv = capsys.readouterr().out.strip().splitlines()
    assert csv[0].startswith("model,label,concurrency,timing,ar_tokens_per_s,tokens_per_s,speedup") and len(csv) == 5
    analysis_main(["tables", str(root), "--table", "load", "--format", "latex"])
    assert r"\begin{tabular}" in capsys.readouterr().out
    analysis_main(["tables", str(root)])
    both = capsys.readouterr()
    assert "overall speedup" in both.out and "| m | pld@vllm | 16 |" in both.out
    assert NO_STEP_TIMES not in both.err  # the tables read no step times
    analysis_main(["tables", str(plain)])
    shown = capsys.readouterr()
    assert "concurrency" not in shown.out and "load" not in shown.out + shown.err
    with pytest.raises(SystemExit) as stopped:
        analysis_main(["tables", str(plain), "--table", "load"])
    assert stopped.value.code == 2 and "load.jsonl" in capsys.readouterr().err


def test_a_run_with_only_load_levels_still_has_its_table(tmp_path, capsys):
    run = tmp_path / "only-load"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"schema_version": 3, "model": "m", "drafter": "pld",
                                                  "method": "pld@vllm", "tasks": {}}))
    write_load(run)
    analysis_main(["tables", str(tmp_path)])
    assert "| m | pld@vllm | 4 | 40.0 | 50.0 | 1.25x |" in capsys.readouterr().out


def test_the_speedup_figure_is_drawn_only_with_load_data(root, plain, tmp_path):
    loaded = load_runs([root])
    written, skipped = make_all(loaded.questions, loaded.steps, tmp_path / "figures", loaded.load)
    names = {path.name for path in written}
    assert {"speedup_vs_concurrency.png", "speedup_vs_concurrency.pdf", "latency_breakdown.png"} <= names
    assert (tmp_path / "figures" / "speedup_vs_concurrency.png").stat().st_size > 1000
    loaded = load_runs([plain])
    written, skipped = make_all(loaded.questions, loaded.steps, tmp_path / "plain", loaded.load)
    assert "speedup_vs_concurrency.png" not in {path.name for path in written}
    assert not any("concurrency" in reason for reason in skipped)


def test_the_report_has_a_section_under_load_only_with_load_data(root, plain, tmp_path):
    loaded = load_runs([root])
    text = build_report(loaded.questions, loaded.steps, tmp_path / "r.html", problems=loaded.problems,
                        load=loaded.load).read_text()
    section = text[text.index("<h2>Under load</h2>"):text.index("<h2>Throughput model")]
    assert "pld@vllm" in section and "2.00x" in section and "AR tok/s" in section and "3/4" in section
    assert "data:image/png;base64," in section and text.count("speedup vs concurrency") == 1
    assert NO_STEP_TIMES in text  # the warning box says why vllm is not in the throughput model
    throughput = text[text.index("<h2>Throughput model"):text.index("<h2>Figures")]
    assert "pld@vllm" not in throughput and "sps" in throughput
    tables = [table for table in parsed(text).tables if table["caption"].startswith("Per concurrency")]
    assert len(tables) >= 2 and all(len(table["headers"]) <= MAX_COLUMNS for table in tables)  # split to fit
    assert all(table["headers"][0] == "concurrency" for table in tables)  # one model and method: said above
    cells = [cell for table in tables for cell in table["cells"]]
    assert MISSING in cells and not [cell for cell in cells if cell.lower() in ("nan", "none", "-")]
    assert not [header for table in tables for header in table["headers"] if is_code_identifier(header)]
    loaded = load_runs([plain])
    text = build_report(loaded.questions, loaded.steps, tmp_path / "p.html", load=loaded.load).read_text()
    assert "Under load" not in text and "concurrency" not in text


def test_runs_without_step_times_are_left_out_of_step_time_analyses_with_one_warning(root, caplog):
    with caplog.at_level(logging.WARNING, logger="analysis"):
        loaded = load_runs([root])
    warnings = [record.getMessage() for record in caplog.records if NO_STEP_TIMES in record.getMessage()]
    assert len(warnings) == 1 and str(root / "vllm") in warnings[0] and "throughput model" in warnings[0]
    steps = loaded.steps
    assert untimed_runs(steps) == {str(root / "vllm"): NO_STEP_TIMES}
    assert steps.verify_s.dtype == np.float64  # nulls as NaN: the other runs' times stay numbers
    assert set(timed_steps(steps).label) == {"pld", "sps"}
    assert set(model_table(steps).label) == {"pld", "sps"}
    assert set(token_costs(loaded.questions, steps).label) == {"pld", "sps"}
    # the leaderboard and the acceptance table keep it: speedup, tokens/s and MAT come from its answers
    board = leaderboard(loaded.questions)
    assert board.loc[("m", "pld@vllm"), ("overall", "speedup", "mean")] == pytest.approx(40 / 15)
    assert board.loc[("m", "pld@vllm"), ("overall", "mat", "mean")] == pytest.approx(41 / 21)
    acceptance = acceptance_table(loaded.questions)
    assert acceptance.loc[("m", "pld@vllm"), "position_1"] == pytest.approx(1.0)  # 2 of 2 draft tokens, every step


def test_the_throughput_command_says_once_why_a_run_is_left_out(root, capsys):
    analysis_main(["throughput", str(root)])
    shown = capsys.readouterr()
    assert shown.err.count(NO_STEP_TIMES) == 1 and "pld@vllm" not in shown.out and "sps" in shown.out


def test_a_run_of_untimed_steps_only_draws_no_step_time_figure(tmp_path, capsys):
    vllm_run(tmp_path / "v", with_load=False)
    loaded = load_runs([tmp_path])
    written, skipped = make_all(loaded.questions, loaded.steps, tmp_path / "figures", loaded.load)
    names = {path.name for path in written}
    assert "speedup_per_task.png" in names and "latency_breakdown.png" not in names
    assert any(NO_STEP_TIMES in reason for reason in skipped)
    assert model_table(loaded.steps).empty and token_costs(loaded.questions, loaded.steps).empty
    analysis_main(["throughput", str(tmp_path)])
    shown = capsys.readouterr()
    assert "no run with per-step times" in shown.out and shown.err.count(NO_STEP_TIMES) == 1


def test_a_run_missing_some_step_times_is_left_out_too():
    steps = pd.DataFrame({"run_dir": ["a", "a", "b", "b"], "draft_s": [0.0, np.nan, 0.0, 0.0],
                          "verify_s": [0.1, 0.1, 0.1, 0.1], "overhead_s": [0.0, 0.0, 0.0, 0.0]})
    assert untimed_runs(steps) == {"a": "1 of 2 steps have no per-step times"}
    assert list(timed_steps(steps).run_dir) == ["b", "b"]


def test_render_load_refuses_an_unknown_format(root):
    with pytest.raises(ValueError):
        render_load(load_table(load_runs([root], with_steps=False).load), "html")
