"""The HTML report reads as a page, not as a frame dump: every table fits 1280 px (split into groups of columns
when wide), no NaN, reader names instead of code identifiers, words ("cannot") instead of impossible numbers,
and the environment the runs were made in at the top. Checked on the page's text always, and in headless
Chromium where it is installed."""

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_analysis import synthetic_run

from analysis.display import (MAX_COLUMNS, MISSING, TableLayout, column_groups, environment_rows,
                              is_code_identifier, reader_name, render_table)
from analysis.report import build_report
from analysis.runs import load_questions, load_steps
from analysis.throughput import CANNOT, model_table, requirements, requirements_text, shown_requirements
from specbench.questions import TASKS

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "scripts" / "check_report_layout.py"
ALL_TASKS = TASKS * 2  # two questions of each of Spec-Bench's six tasks: the leaderboard at its widest
ENVIRONMENT = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0", "specbench": "0.1.0",
               "device": "cpu: AMD EPYC", "dtype": "float32", "threads": 2, "git_sha": "f14cf737bdab", "cuda": None}


class Tables(HTMLParser):
    """Each <table> of a page as {"caption", "headers", "cells"}; the legends' text apart."""

    def __init__(self):
        super().__init__()
        self.tables, self.legends, self._in, self._text = [], [], None, []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append({"caption": "", "headers": [], "cells": []})
        elif tag in ("caption", "th", "td") or (tag == "p" and ("class", "legend") in attrs):
            self._in, self._text = ("legend" if tag == "p" else tag), []

    def handle_endtag(self, tag):
        if self._in is None or tag not in ("caption", "th", "td", "p") or (tag == "p") != (self._in == "legend"):
            return
        text = "".join(self._text).strip()
        if self._in == "legend":
            self.legends.append(text)
        else:
            table = self.tables[-1]
            if self._in == "caption":
                table["caption"] = text
            else:
                table["headers" if self._in == "th" else "cells"].append(text)
        self._in = None

    def handle_data(self, data):
        if self._in is not None:
            self._text.append(data)


def parsed(page: str) -> Tables:
    tables = Tables()
    tables.feed(page)
    return tables


@pytest.fixture(scope="module")
def six_runs(tmp_path_factory):
    """Six runs over every task: pld cannot match hd by any draft speed (fewer tokens per step, no draft time to
    save); one run recorded no environment, one has no calibration, one ran on other threads (so nothing else
    predicts its target time), and the commits differ."""
    root = tmp_path_factory.mktemp("six-runs")
    environment = {"header": {"environment": ENVIRONMENT}}
    synthetic_run(root / "pld-1", "pld", accepted=2, verify_tokens=(3,), speed=30, seed=1, tasks=ALL_TASKS,
                  **environment)
    synthetic_run(root / "pld-2", "pld", accepted=2, verify_tokens=(3,), speed=36, seed=2, tasks=ALL_TASKS,
                  calibrated=False, **environment)
    synthetic_run(root / "hd-1", "hd", accepted=3, verify_tokens=(4, 11), speed=45, source="context", seed=3,
                  tasks=ALL_TASKS, header={"environment": {**ENVIRONMENT, "git_sha": "9b2d0e6b90b6-dirty"}})
    synthetic_run(root / "sps-1", "sps", accepted=3, verify_tokens=(4, 11), speed=20, draft_s=0.04, seed=4,
                  tasks=ALL_TASKS, **environment)
    synthetic_run(root / "lookahead-1", "lookahead", accepted=2, verify_tokens=(11,), speed=25, seed=5, tasks=ALL_TASKS)
    synthetic_run(root / "samd-1", "samd", accepted=2, verify_tokens=(3,), speed=28, seed=6, threads=8,
                  calibrated=False, tasks=ALL_TASKS, **environment)
    return root


@pytest.fixture(scope="module")
def page(six_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    build_report(load_questions([six_runs]), load_steps([six_runs]), out)
    return out


def test_no_table_shows_nan_none_or_a_code_identifier(page):
    tables = parsed(page.read_text()).tables
    assert len(tables) >= 6
    cells = [cell for table in tables for cell in table["cells"]]
    assert MISSING in cells  # the uncalibrated runs' calibration columns, the environment's missing fields
    assert not [cell for cell in cells if cell.lower() in ("nan", "none", "nat", "-nan")]
    assert not any("NaN" in cell for cell in cells)
    headers = [header for table in tables for header in table["headers"]]
    assert "T target ms (LOO)" in headers and "tokens per step" in headers
    assert not [header for header in headers if is_code_identifier(header) or "_" in header and header.islower()]


def test_every_table_stays_within_the_column_limit_and_wide_ones_are_split(page):
    tables = parsed(page.read_text()).tables
    assert all(len(table["headers"]) <= MAX_COLUMNS for table in tables)
    # The throughput model's 13 measured and predicted columns come in parts, each naming its rows again.
    parts = [table for table in tables if table["caption"].startswith("Measured and predicted, per run")]
    assert len(parts) >= 2 and all("part" in table["caption"] and table["headers"][0] == "method" for table in parts)
    speedup = next(table for table in tables if table["caption"].startswith("Speedup over AR per task"))
    assert speedup["headers"][1:] == ["MT-Bench", "translation", "summarization", "QA", "math reasoning", "RAG",
                                      "overall"]


def test_the_legend_says_what_a_dash_and_an_abbreviation_mean(page):
    legends = " ".join(parsed(page.read_text()).legends)
    assert f"{MISSING}: no calibration" in legends and f"{MISSING}: no leave-one-out prediction" in legends
    assert "MAT: mean accepted tokens" not in legends or "bonus" in legends
    assert "LOO: leave-one-out" in legends and "tok/s: tokens per second" in legends


def test_the_environment_block_comes_first_with_commits_and_versions(page):
    text = page.read_text()
    environment = text[text.index("<h2>Environment</h2>"):text.index("<h2>Speedup")]
    assert text.index("<h2>Environment</h2>") < text.index("<h2>Speedup")
    for shown in ("2.13.0+cpu", "5.24.0", "3.11.7", "0.1.0", "cpu: AMD EPYC", "float32", "commit"):
        assert shown in environment
    # the commits differ: one row per commit, naming its runs; the run without an environment has dashes
    assert "f14cf737bdab" in environment and "9b2d0e6b90b6-dirty" in environment
    assert "lookahead-1" in environment and "hd-1" in environment


def test_an_impossible_draft_time_is_said_in_words(six_runs, page):
    table = model_table(load_steps([six_runs]))
    needs = requirements(table).set_index("label")
    assert needs.loc["pld", "needed_draft_ms"].min() < 0  # the number the page must not show
    text = page.read_text()
    needed = text[text.index("What would match the best draft"):text.index("Where an accepted token")]
    tables = parsed(needed).tables
    column = tables[0]["headers"].index("draft ms to match the best")
    width = len(tables[0]["headers"])
    shown = tables[0]["cells"][column::width]
    assert CANNOT in shown and not [cell for cell in shown if cell.startswith("-")]
    assert "no draft latency can match hd" in needed and "acceptance must rise" in needed


def test_the_command_line_gets_the_words_too(six_runs):
    text = requirements_text(model_table(load_steps([six_runs])))
    assert "cannot" in text and "no draft latency can match hd" in text and "NaN" not in text
    shown = shown_requirements(requirements(model_table(load_steps([six_runs]))))
    assert not [value for value in shown.needed_draft_ms if isinstance(value, float) and value < 0]


def test_any_width_is_split_into_groups_that_repeat_the_identifying_columns():
    """A leaderboard of 40 columns of code names (the columns other changes add) still fits: groups of at most
    MAX_COLUMNS, each with the method, every header in words."""
    frame = pd.DataFrame({"model": ["m", "m"], "label": ["pld", "hd+budget"],
                          **{f"qa vllm_stat_{index}": [1.23456, np.nan] for index in range(40)}})
    tables = parsed(render_table(frame, "Wide")).tables
    assert len(tables) > 3 and all(len(table["headers"]) <= MAX_COLUMNS for table in tables)
    assert all(table["headers"][0] == "method" for table in tables)  # model holds one value: said above
    assert all(not is_code_identifier(header) and "_" not in header for table in tables for header in table["headers"])
    assert {cell for table in tables for cell in table["cells"]} == {"pld", "hd+budget", "1.23", MISSING}
    assert reader_name("overall vllm_acceptance_rate") == "overall vLLM acceptance rate"


def test_columns_are_packed_by_width_and_families_stay_together():
    widths = {"id": 100, "a": 300, "b": 300, "c": 300, "d": 300}
    assert column_groups(widths, ["id"], [["a"], ["b", "c"], ["d"]], page_px=800) == [["a"], ["b", "c"], ["d"]]
    assert column_groups(widths, ["id"], [["a", "b", "c", "d"]], page_px=800) == [["a", "b"], ["c", "d"]]
    layout = TableLayout(id_columns=(), missing=(("calib_", "no calibration"),))
    assert layout.missing_meaning("calib_tps") == "no calibration" and layout.missing_meaning("x") == "not measured"


def test_environments_that_differ_get_one_row_each():
    shared, rows = environment_rows({"a": {"torch": "2.1", "git_sha": "x"}, "b": {"torch": "2.1", "git_sha": "y"},
                                     "c": {"torch": "2.1", "git_sha": "x"}, "d": {}}, ("torch", "git_sha"), ())
    assert shared == {}
    assert rows.to_dict("records") == [{"torch": "2.1", "git_sha": "x", "runs": "a, c"},
                                       {"torch": "2.1", "git_sha": "y", "runs": "b"},
                                       {"torch": MISSING, "git_sha": MISSING, "runs": "d"}]
    shared, rows = environment_rows({"a": {"torch": "2.1", "gpus": None}, "b": {"torch": "2.1"}}, ("torch",), ("gpus",))
    assert shared == {"torch": "2.1"} and rows.empty  # a field no run records is left out


def _chromium():
    sys.path.insert(0, str(CHECKER.parent))
    try:
        from check_report_layout import find_browser
    finally:
        sys.path.remove(str(CHECKER.parent))
    return find_browser()


CHROMIUM = _chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium): "
                                    "the browser measurement of the report's tables is skipped")


def _check(report: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(CHECKER), str(report), "--json"], capture_output=True, text=True,
                          timeout=300)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}


@needs_chromium
def test_every_table_fits_1280_px_in_chromium(page):
    status, measured = _check(page)
    assert measured["window"] == 1280 and len(measured["tables"]) >= 6
    assert status == 0, f"tables wider than the page: {measured['too_wide']}"
    assert all(table["width"] <= measured["column"] + 0.5 for table in measured["tables"])
    assert measured["document"] <= 1280


@needs_chromium
def test_the_checker_reports_a_table_wider_than_the_page(tmp_path):
    wide = tmp_path / "wide.html"
    cells = "".join(f"<td>{'x' * 30}</td>" for _ in range(20))
    wide.write_text(f"<html><body style='max-width:1100px'><table><caption>wide</caption><tr>{cells}</tr></table>"
                    "</body></html>")
    status, measured = _check(wide)
    assert status == 1 and [table["caption"] for table in measured["too_wide"]] == ["wide"]
