"""One static HTML page (tables and figures, images embedded) from a set of runs, viewable offline."""

from __future__ import annotations

import base64
import html
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from analysis.display import (MISSING, PAGE_PX, TableLayout, environment_rows, reader_name, render_table,
                              split_by_part)
from analysis.figures import make_all, speedup_vs_concurrency
from analysis.load import HEADERS as LOAD_HEADERS, LOAD_LEGEND, has_load, load_cells, load_table
from analysis.runs import read_run_json, read_summary, timed_steps, untrusted_runs
from analysis.compare import AGREEMENT, compare_table, mat_figure, mat_pairs
from analysis.compare import number_text
from analysis.published import select_published
from analysis.tables import (ACCEPTANCE_LEGEND, acceptance_cells, acceptance_headers, acceptance_table, formatted,
                             leaderboard, stall_line, stalled_mask)
from analysis.throughput import (SHOWN_COLUMNS, deviation_summary, model_table, requirement_notes, requirements,
                                 shown_requirements, shown_token_costs, token_cost_notes, token_costs)
from specbench.questions import ALL_TASKS
from specbench.errors import SpecbenchError
from specbench.run.locked_versions import describe as describe_lock

STYLE = f"""
body {{ font-family: sans-serif; max-width: {PAGE_PX}px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 1em 0 0.3em; }}
caption {{ text-align: left; font-weight: bold; padding: 0.3em 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }}
td {{ white-space: nowrap; }} td.prose {{ white-space: normal; }} .num {{ text-align: right; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }}
.note, .legend {{ color: #666; font-size: 13px; }} .legend {{ margin: 0 0 1.2em; }}
.warning {{ border-left: 4px solid #c00; padding: 0.3em 0.8em; background: #fff3f3; }}
"""

# The environment fields every run shows (summary.json's ``environment``), and those shown only when recorded.
ENVIRONMENT_FIELDS = ("device", "dtype", "threads", "git_sha", "python", "torch", "transformers", "specbench", "cuda",
                      "versions_vs_lock")
OPTIONAL_ENVIRONMENT_FIELDS = ("cuda_driver", "cuda_device_count", "cuda_visible_devices", "gpus", "gpus_not_used")
ENVIRONMENT_HEADERS = (("device", "machine (CPU or GPU)"), ("versions_vs_lock", "software against the lock"))
# Where a run's summary.json has no environment (older schemas), run.json still records these.
RUN_JSON_FIELDS = ("dtype", "threads")

LEADERBOARD_PARTS = {"speedup": "Speedup over AR per task (mean ± standard deviation over repeated runs)",
                     "MAT": "Mean accepted tokens (MAT) per task"}
LEADERBOARD_MISSING = "not measured: the runs have no paired AR baseline, or did not record this"
THROUGHPUT_LAYOUT = TableLayout(
    families=(("calib_target_ms", "loo_target_ms"), ("measured_tps", "calib_tps", "loo_tps", "calib_dev", "loo_dev")),
    missing=(("calib_", "no calibration (the run has no verify_latency.json)"),
             ("loo_", "no leave-one-out prediction (no other run of the same model, device, dtype, threads and "
                      "software)"),
             ("dsd_form_tps", "no predicted T target (neither a calibration nor another run to predict from)")))
REQUIREMENTS_LAYOUT = TableLayout(missing_default="no predicted T target (neither a calibration nor another run)")


def run_environment(run_dir: str) -> dict:
    """A run's recorded environment: summary.json's ``environment``, with dtype and threads from run.json where
    the summary lacks them; {} when the run directory records none (Spec-Bench's own files)."""
    path = Path(run_dir)
    environment = {}
    try:
        recorded = read_summary(path).get("environment") if (path / "summary.json").is_file() else None
        environment = dict(recorded) if isinstance(recorded, dict) else {}
        settings = read_run_json(path) if (path / "run.json").is_file() else {}
    except SpecbenchError:
        return environment
    for key in RUN_JSON_FIELDS:
        if environment.get(key) is None and settings.get(key) is not None:
            environment[key] = settings[key]
    if environment:
        environment["versions_vs_lock"] = describe_lock(environment.get("versions_vs_lock"))
    return environment


def off_lock_warning(environments: dict[str, dict]) -> str:
    """A warning naming the runs measured with software other than the lock's (``specbench.run.locked_versions``),
    which the test suite was not run with; empty when none was."""
    off = {name: text for name, text in environments.items()
           if " differ from " in str(text.get("versions_vs_lock", ""))}
    if not off:
        return ""
    lines = "; ".join(f"{name}: {text['versions_vs_lock']}" for name, text in off.items())
    return (f"<p class='warning'>Measured with versions other than the lock's, which the test suite last passed with "
            f"({len(off)} of {len(environments)} runs): {html.escape(lines)}.</p>")


def run_names(run_dirs) -> dict[str, str]:
    """Each run directory -> its path below the folder all of them share (``bench-eagle/eagle``), or its own
    name when alone: short, and still unique."""
    paths = [Path(run_dir) for run_dir in run_dirs]
    if len(paths) < 2:
        return {str(path): path.name for path in paths}
    common = Path(os.path.commonpath([str(path) for path in paths]))
    return {str(path): str(path.relative_to(common)) or path.name for path in paths}


def environment_section(run_dirs) -> str:
    """The machine, device, dtype, threads, commit and software the runs were made with: what they share, then
    one row per distinct environment naming its runs."""
    names = run_names(run_dirs)
    environments = {names[str(run)]: run_environment(run) for run in run_dirs}
    shared, differing = environment_rows(environments, ENVIRONMENT_FIELDS, OPTIONAL_ENVIRONMENT_FIELDS)
    layout = TableLayout(id_columns=(), headers=ENVIRONMENT_HEADERS,
                         missing_default="not recorded, or none (a CPU run has no CUDA)")
    parts = ["<h2>Environment</h2>", off_lock_warning(environments)]
    if shared:
        caption = "Shared by every run" if not differing.empty else "Every run"
        parts.append(render_table(pd.DataFrame([shared]), caption, layout))
    if not differing.empty:
        parts.append(render_table(differing, "Differing between runs (one row per environment)", layout))
    return "".join(parts)


COST_HEADERS = (("run", "run"), ("ar_pass_ms", "AR's pass (ms)"), ("floor_ms", "floor (ms)"),
                ("ar_over_floor", "AR's pass over the floor"), ("bandwidth_gb_s", "bandwidth (GB/s)"),
                ("weights_mb", "weights read per pass (MB)"), ("verify_over_ar", "verify of q tokens over AR's pass"))


def cost_rows(run_dirs) -> pd.DataFrame:
    """One row per run whose summary.json records a cost curve (``specbench.measure.floor``): AR's pass, the
    machine's floor for it, and each verify size's median over AR's pass."""
    names = run_names(run_dirs)
    rows = []
    for run in run_dirs:
        try:
            curve = read_summary(Path(run)).get("cost_curve") if (Path(run) / "summary.json").is_file() else None
        except SpecbenchError:
            curve = None
        if not isinstance(curve, dict) or not (curve.get("ar_pass_s") or curve.get("verify_s")):
            continue
        relative = curve.get("relative_to_ar_pass") or {}
        rows.append({"run": names[str(run)],
                     "ar_pass_ms": curve["ar_pass_s"] * 1000 if curve.get("ar_pass_s") else None,
                     "floor_ms": curve["floor_s"] * 1000 if curve.get("floor_s") else None,
                     "ar_over_floor": curve.get("ar_pass_over_floor"),
                     "bandwidth_gb_s": curve["bandwidth_bytes_per_s"] / 1e9 if curve.get("bandwidth_bytes_per_s")
                     else None,
                     "weights_mb": curve["bytes_per_pass"] / 1e6 if curve.get("bytes_per_pass") else None,
                     "verify_over_ar": " ".join(f"{size}:{ratio:.2f}" for size, ratio in relative.items()) or None})
    return pd.DataFrame(rows, columns=[name for name, _ in COST_HEADERS])


def cost_section(run_dirs) -> str:
    """What a target pass costs in each run against the least it could cost on that machine: a speedup is MAT
    over this curve, so a run far above its floor describes its kernels as much as its method."""
    rows = cost_rows(run_dirs)
    if rows.empty:
        return ""
    layout = TableLayout(id_columns=(), headers=COST_HEADERS,
                         missing_default="not measured (the engine runs the target elsewhere, the target is spread "
                                         "over devices or processes, no AR baseline, or too few steps of a size)")
    return ("<h2>Cost of a target pass</h2><p class='note'>The floor is the bytes of weights one pass reads over the "
            "memory bandwidth the machine shows for a read of that size (probed once per machine); AR's pass is its "
            "seconds per token after the prefill; each verify size's median over AR's pass is what a method's step "
            "costs against the step it replaces (docs/measurement.md, \"The cost of a pass\").</p>"
            + render_table(rows, "Per run", layout))


def leaderboard_section(questions: pd.DataFrame) -> str:
    """The Spec-Bench leaderboard as one table per statistic (speedup, MAT, and whatever else it holds), tasks
    as columns, then its overall counts."""
    shown = formatted(leaderboard(questions))
    tasks = [*ALL_TASKS, "overall"]
    ids = ("model", "label", "timing")
    tables, rest = split_by_part(shown, tasks, list(ids))
    headers = tuple((task, reader_name(task)) for task in tasks)
    parts = []
    for part, table in tables:
        caption = LEADERBOARD_PARTS.get(part, f"{reader_name(part)} per task")
        parts.append(render_table(table, caption, TableLayout(id_columns=ids, headers=headers,
                                                              missing_default=LEADERBOARD_MISSING)))
    if len(rest.columns) > len([column for column in ids if column in rest.columns]):
        parts.append(render_table(rest, "Outputs identical to AR, over all questions, and runs per configuration",
                                  TableLayout(id_columns=ids, missing_default=LEADERBOARD_MISSING)))
    return "".join(parts)


def acceptance_section(questions: pd.DataFrame) -> str:
    """Both speedup definitions, MAT beside vLLM's mean acceptance length and acceptance rate, acceptance per
    draft position and the time per output token (``analysis.tables.acceptance_table``), per configuration."""
    table = acceptance_cells(acceptance_table(questions))
    layout = TableLayout(id_columns=("model", "label", "timing"), headers=tuple(acceptance_headers().items()),
                         missing_default="not known for these runs (no paired baseline, or records without draft "
                                         "depths)")
    return (render_table(table, "Acceptance, both speedups and time per output token, over all questions", layout)
            + f"<p class='legend'>{html.escape(ACCEPTANCE_LEGEND)}</p>")


def load_section(load: pd.DataFrame, scratch: Path) -> str:
    """Runs under load (``analysis.load.load_table``): per model, method and concurrency, AR's and the method's
    throughput, the speedup, TTFT and TPOT, acceptance and identical outputs; then speedup_vs_concurrency."""
    layout = TableLayout(id_columns=("model", "label", "timing", "concurrency"), headers=tuple(LOAD_HEADERS.items()),
                         families=(("ar_tokens_per_s", "tokens_per_s", "speedup"),),
                         missing_default="not known (no AR line at that concurrency, or a figure the engine did "
                                         "not record)")
    parts = ["<h2>Under load</h2>",
             "<p class='note'>Runs with engine.concurrency (load.jsonl): every question served with that many "
             "requests in flight, by AR and by the method, in one engine.</p>",
             render_table(load_cells(load_table(load)), "Per concurrency: throughput, speedup, latency, acceptance",
                          layout),
             f"<p class='legend'>{html.escape(LOAD_LEGEND)}</p>"]
    figure = next(path for path in speedup_vs_concurrency(load, scratch) if path.suffix == ".png")
    data = base64.b64encode(figure.read_bytes()).decode()
    parts.append(f"<h3>speedup vs concurrency</h3><img alt='speedup against concurrency' "
                 f"src='data:image/png;base64,{data}'>")
    return "".join(parts)


COMPARE_SHOWN = {"label": "method", "table": "published table", "method": "published as", "mat": "MAT",
                 "mat_published": "published MAT", "mat_ratio": "MAT ratio", "speedup": "speedup",
                 "speedup_published": "published speedup", "speedup_ratio": "speedup ratio",
                 "same_hardware": "same hardware"}


def table_differences(rows: pd.DataFrame) -> str:
    """One published table's line under the comparison, from all its rows (``compare_table``'s, of one table):
    what differs for every method measured against it (model, hardware, dtype, questions) said once, then what
    differs for some methods only (a run's hardware, a configuration, a changed drafter setting), named with the
    method. A tuned method's own difference ("method: ...") is its label, not repeated."""
    parts = {label: [part for part in str(differs).split("; ") if part and not part.startswith("method:")]
             for label, differs in zip(rows.label, rows.differs)}
    common = [part for part in next(iter(parts.values())) if all(part in mine for mine in parts.values())]
    own = {label: [part for part in mine if part not in common] for label, mine in parts.items()}
    row = rows.iloc[0]
    text = f"{row.table} = {row.source}: {row.reference} ({row.published_hardware}, {row.published_model})"
    text += f". Differs: {'; '.join(common)}." if common else "."
    text += "".join(f" Differs for {label} also: {'; '.join(mine)}." for label, mine in own.items() if mine)
    return text


def compare_section(questions: pd.DataFrame, published: pd.DataFrame, scratch: Path) -> str:
    """Overall MAT and speedup beside Spec-Bench's leaderboard (``analysis.compare``), the published tables it
    refers to, the settings that differ, and the figure of measured against published MAT."""
    table = compare_table(questions, published)
    overall = table[table.task == "overall"]
    if overall.empty:
        return ("<h2>Measured beside published</h2><p class='note'>No measured method has a number in Spec-Bench's "
                "leaderboard (python -m analysis compare --published all for every transcribed source).</p>")
    shown = overall[list(COMPARE_SHOWN)].copy()
    for column in ("speedup", "speedup_published"):
        shown[column] = shown[column].map(lambda value: number_text(value, "x"))  # compare's own printout format
    lines = [table_differences(rows) for _, rows in overall.groupby("table", sort=False)]
    parts = ["<h2>Measured beside published</h2>",
             f"<p class='note'>{html.escape(AGREEMENT.replace('rows with hw DIFF (or ?)', 'rows whose same hardware is no (or a dash)'))} "
             "Overall figures; per task: <code>python -m analysis compare RUNS</code>.</p>",
             render_table(shown, "Overall, against Spec-Bench's leaderboard",
                          TableLayout(id_columns=("label",), headers=tuple(COMPARE_SHOWN.items()),
                                      missing_default="the published table has no such number (Spec-Bench's "
                                                      "leaderboard gives MAT overall only)")),
             _notes(lines)]
    if not mat_pairs(table).empty:
        figure = mat_figure(table, scratch / "published_vs_measured_mat.png")
        data = base64.b64encode(figure.read_bytes()).decode()
        parts.append(f"<img alt='published vs measured MAT' src='data:image/png;base64,{data}'>")
    return "".join(parts)


def _warning_box(heading: str, lines: list[str]) -> str:
    return (f"<div class='warning'><p><b>{html.escape(heading)}</b></p><ul>"
            + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul></div>")


def _notes(lines: list[str]) -> str:
    return "".join(f"<p class='note'>{html.escape(line)}</p>" for line in lines)


def build_report(questions: pd.DataFrame, steps: pd.DataFrame, out: Path, title: str = "specbench report",
                 problems: list[str] | tuple = (), load: pd.DataFrame | None = None,
                 stalls_left_out: str | None = None) -> Path:
    """Write ``out`` (an .html file) and return it. Runs whose timings are flagged as untrustworthy (busy
    machine) are listed in a box at the top and marked in the tables; so are the stalled questions the tables
    keep (``analysis.tables.stalled_mask``), or, when --leave-out-stalled left them out, ``stalls_left_out`` (its
    notice) says so; ``problems`` (``LoadedRuns.problems``: runs and files left out, and why) are listed in another.
    ``load`` (``LoadedRuns.load``) adds a section for runs under load when any run has load.jsonl. The throughput model leaves out runs without per-step times
    (``analysis.runs.timed_steps``; ``problems`` says which)."""
    runs = sorted({*questions.run_dir.unique(), *(load.run_dir.unique() if has_load(load) else ())})
    sections = [f"<h1>{html.escape(title)}</h1>",
                f"<p class='note'>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from "
                f"{len(runs)} run(s), {len(questions)} question records. "
                f"{MISSING} in a table: no value; the legend under each table says why.</p>"]
    if runs:
        sections += [environment_section(runs), cost_section(runs)]
    flagged = untrusted_runs(questions)
    if flagged:
        sections.append(_warning_box(
            f"Timing UNTRUSTED for {len(flagged)} run(s): their summary.json flags a busy machine (other processes "
            "on the cores, or AR passes far slower than the run's median). Their numbers are shown as measured, "
            "marked UNTRUSTED in the tables, and are not comparable with the others.", flagged))
    stalled = questions[stalled_mask(questions)]
    if not stalled.empty:
        sections.append(_warning_box(
            f"Stalled: {len(stalled)} question(s) whose stalled steps (target passes far slower than the run's own "
            "passes of their size) lost more than run.stall_share of the method's or AR's time. They are kept in the "
            "numbers below and flagged (python -m analysis report --leave-out-stalled leaves them out).",
            [f"{row.model} {row.label}: {stall_line(row)}" for row in stalled.itertuples()]))
    if stalls_left_out:
        sections.append(_warning_box("Left out on request:", [stalls_left_out]))
    if problems:
        sections.append(_warning_box("Left out, in whole or in part:", list(problems)))
    if not questions.empty:
        sections += ["<h2>Speedup and mean accepted tokens (MAT)</h2>",
                     "<p class='note'>Spec-Bench's definitions: per-question tokens/s averaged over questions, "
                     "method over its paired AR baseline; MAT counts the bonus token. Mean ± standard deviation "
                     "over repeated runs of a configuration: runs count as repeats only when every result-affecting "
                     "setting of their run.json and their set of questions match; otherwise their labels say what "
                     "differs.</p>",
                     leaderboard_section(questions),
                     "<h2>Acceptance and latency</h2>",
                     "<p class='note'>The figures other tools report, under their names and definitions "
                     "(specbench/measure/metrics.py; docs/measurement.md says where they part).</p>",
                     acceptance_section(questions)]
        with tempfile.TemporaryDirectory() as scratch:
            sections.append(compare_section(questions, select_published("spec-bench"), Path(scratch)))
    if has_load(load):
        with tempfile.TemporaryDirectory() as scratch:
            sections.append(load_section(load, Path(scratch)))
    timed = timed_steps(steps)
    if not timed.empty:
        table = model_table(timed)
        needs = requirements(table)
        costs = token_costs(questions, timed)
        sections += ["<h2>Throughput model</h2>",
                     "<p class='note'>The simplified model of \"Decoding Speculative Decoding\", checked on each run "
                     "with the target's latency measured outside it. Over decoding steps (the prefill excluded): "
                     "measured tokens/s = accepted tokens / (draft + verify + overhead seconds); predicted = "
                     "accepted tokens / (draft + T target + overhead), with the run's own measured draft and "
                     "overhead per step and T target looked up at each step's verified-token count (the shape "
                     "run, padding included) in a table, interpolated between counts, no line fitted: "
                     "<b>calib</b> from the run's calibration at its start (verify_latency.json), <b>LOO</b> "
                     "(leave-one-out) the mean verify time per count over the other runs of the same model, device, "
                     "dtype and threads (and, where recorded, weights, machine and software versions). Tokens per "
                     "step are accepted tokens per decoding step, bonus included (not MAT, which counts the prefill "
                     "too); \"steps outside the LOO table\" is the share of steps whose count the leave-one-out "
                     "table lacks. The DSD form is the paper's own, tokens per step / (draft + T target), without "
                     "the overhead. Largest deviation of predicted from measured: "
                     f"{html.escape(deviation_summary(table))}.</p>",
                     render_table(table[SHOWN_COLUMNS], "Measured and predicted, per run", THROUGHPUT_LAYOUT),
                     "<h3>What would match the best draft</h3>",
                     "<p class='note'>With the leave-one-out T target (else the calibration's), all else "
                     "equal: the draft time per step, or the accepted tokens per step, at which each run's "
                     "predicted throughput would equal the best measured one of its model. \"cannot\": no draft "
                     "time, not even zero, is fast enough; why, under the table.</p>",
                     render_table(shown_requirements(needs), "Needed to match the best", REQUIREMENTS_LAYOUT),
                     _notes(requirement_notes(needs)),
                     "<h3>Where an accepted token's time goes</h3>",
                     "<p class='note'>ms per accepted token over the decoding steps: drafting; one pass, what one "
                     "AR pass costs divided by the accepted tokens per step (the acceptance term); extra verify, "
                     "the verify time beyond one AR pass (the cost of verifying the draft's tokens); overhead. "
                     "The speedup bound is AR ms per token over their sum; \"tokens per step for 2× speedup\" the "
                     "acceptance a 2x speedup needs at these times (\"cannot\": more than a step verifies).</p>",
                     render_table(shown_token_costs(costs), "ms per accepted token, per method",
                                  TableLayout(id_columns=("label",))),
                     _notes(token_cost_notes(costs))]
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
    sections += ["<h2>Runs</h2>", "<ul>" + "".join(f"<li>{html.escape(run)}</li>" for run in runs) + "</ul>"]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                   f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>", encoding="utf-8")
    return out
