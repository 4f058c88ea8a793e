"""One static HTML page (tables and figures, images embedded) from a set of runs, viewable offline."""

from __future__ import annotations

import base64
import html
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from analysis.figures import make_all
from analysis.runs import untrusted_runs
from analysis.tables import formatted, leaderboard
from analysis.throughput import SHOWN_COLUMNS, deviation_summary, model_table, requirements, token_costs

STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.note { color: #666; font-size: 13px; }
.warning { border-left: 4px solid #c00; padding: 0.3em 0.8em; background: #fff3f3; }
"""


def _table_html(frame: pd.DataFrame, float_format="{:.3f}") -> str:
    return frame.to_html(index=False, border=0, float_format=lambda v: float_format.format(v))


def _warning_box(heading: str, lines: list[str]) -> str:
    return (f"<div class='warning'><p><b>{html.escape(heading)}</b></p><ul>"
            + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul></div>")


def build_report(questions: pd.DataFrame, steps: pd.DataFrame, out: Path, title: str = "specbench report",
                 problems: list[str] | tuple = ()) -> Path:
    """Write ``out`` (an .html file) and return it. Runs whose timings are flagged as untrustworthy (busy
    machine) are listed in a box at the top and marked in the tables; ``problems`` (``LoadedRuns.problems``:
    runs and files left out, and why) are listed in another."""
    sections = [f"<h1>{html.escape(title)}</h1>",
                f"<p class='note'>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from "
                f"{questions.run_dir.nunique()} run(s), {len(questions)} question records.</p>"]
    flagged = untrusted_runs(questions)
    if flagged:
        sections.append(_warning_box(
            f"Timing UNTRUSTED for {len(flagged)} run(s): their summary.json flags a busy machine (other processes "
            "on the cores, or AR passes far slower than the run's median). Their numbers are shown as measured, "
            "marked UNTRUSTED in the tables, and are not comparable with the others.", flagged))
    if problems:
        sections.append(_warning_box("Left out, in whole or in part:", list(problems)))
    if not questions.empty:
        sections += ["<h2>Speedup and mean accepted tokens (MAT)</h2>",
                     "<p class='note'>Spec-Bench's definitions: per-question tokens/s averaged over questions, "
                     "method over its paired AR baseline; MAT counts the bonus token. Mean ± standard deviation "
                     "over repeated runs of a configuration: runs count as repeats only when every result-affecting "
                     "setting of their run.json and their set of questions match; otherwise their labels say what "
                     "differs.</p>",
                     _table_html(formatted(leaderboard(questions)))]
    if not steps.empty:
        table = model_table(steps)
        sections += ["<h2>Throughput model</h2>",
                     "<p class='note'>The simplified model of \"Decoding Speculative Decoding\", checked on each run "
                     "with the target's latency measured outside it. Over decoding steps (the prefill excluded): "
                     "measured tokens/s = accepted tokens / (draft + verify + overhead seconds); predicted = "
                     "accepted tokens / (draft + T_target + overhead), with the run's own measured draft and "
                     "overhead per step and T_target looked up at each step's verified-token count (the shape "
                     "run, padding included) in a table, interpolated between counts, no line fitted: "
                     "<b>calib</b> from the run's calibration at its start (verify_latency.json), <b>loo</b> "
                     "the mean verify time per count over the other runs of the same model, device, dtype and "
                     "threads (and, where recorded, weights, machine and software versions). tokens_per_step "
                     "is accepted tokens per decoding step, bonus included (not MAT, "
                     "which counts the prefill too); loo_outside is the share of steps whose count the "
                     "leave-one-out table lacks. dsd_form_tps is the paper's own form, tokens_per_step / "
                     "(draft + T_target), without the overhead. Largest deviation of predicted from measured: "
                     f"{html.escape(deviation_summary(table))}.</p>",
                     _table_html(table[SHOWN_COLUMNS]),
                     "<h3>What would match the best draft</h3>",
                     "<p class='note'>With the leave-one-out T_target (else the calibration's), all else "
                     "equal.</p>",
                     _table_html(requirements(table)),
                     "<h3>Where an accepted token's time goes</h3>",
                     "<p class='note'>ms per accepted token over the decoding steps: drafting; one_pass, what one "
                     "AR pass costs divided by the accepted tokens per step (the acceptance term); extra_verify, "
                     "the verify time beyond one AR pass (the cost of verifying the draft's tokens); overhead. "
                     "speedup_bound is AR ms per token over their sum; needed_tokens_per_step_2x the acceptance "
                     "a 2x speedup needs at these times.</p>",
                     _table_html(token_costs(questions, steps))]
    with tempfile.TemporaryDirectory() as scratch:
        written, skipped = make_all(questions, steps, Path(scratch))
        images = [path for path in written if path.suffix == ".png"]
        if images:
            sections.append("<h2>Figures</h2>")
        for path in images:
            data = base64.b64encode(path.read_bytes()).decode()
            sections.append(f"<h3>{html.escape(path.stem.replace('_', ' '))}</h3><img src='data:image/png;base64,{data}'>")
        if skipped:
            sections.append("<p class='note'>Not drawn: " + html.escape("; ".join(skipped)) + "</p>")
    runs = sorted(questions.run_dir.unique())
    sections += ["<h2>Runs</h2>", "<ul>" + "".join(f"<li>{html.escape(run)}</li>" for run in runs) + "</ul>"]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                   f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>", encoding="utf-8")
    return out
