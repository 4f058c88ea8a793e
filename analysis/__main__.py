"""``python -m analysis COMMAND RUNS...``: tables, throughput model, figures and an HTML report from runs.

    python -m analysis tables runs/ --format md            # Spec-Bench leaderboard, then vLLM's acceptance figures
    python -m analysis tables runs/ --table acceptance --format csv   # one of the tables
    python -m analysis tables runs/ --table load           # runs under load: speedup, TTFT, TPOT per concurrency
    python -m analysis throughput runs/                    # DSD throughput model: predicted vs measured
    python -m analysis figures runs/ --out figures/        # every figure, PNG and PDF
    python -m analysis report runs/ --out report.html      # one offline HTML page with all of it
    python -m analysis tables runs/ --spec-bench method.jsonl baseline.jsonl vicuna-7b eagle
    python -m analysis compare runs/ --published spec-bench  # measured MAT and speedup beside published ones
    python -m analysis project runs/pld --curve gpu_check_6.json   # the run's steps through a GPU's verify curve

compare's --published is a source id of specbench/data/published_results.csv (spec-bench, hd, recycling, samd,
dsd), "all", or a CSV file of the same columns; --published-model MODEL keeps that model's tables (by default
the run's own model's where published, else all); --task TASK (repeatable) keeps those tasks (and "overall");
--figure PATH also draws measured vs published MAT as a PNG.

project puts each run's steps through another device's verify curve (--curve: the --out JSON of
scripts/gpu_check.py --rows 6, or a run's verify_latency.json; --mode: which of the check's curves, by default its
fastest compiled one) with the throughput model: the method's and AR's tokens/s and the speedup there
(analysis/projection.py says what is assumed).

RUNS are run directories or folders holding them (a multirun's sweep folder, or runs/). --spec-bench adds
Spec-Bench's own model_answer files (a method's and its baseline's, with a model and method name).

Runs under load (engine.concurrency, vLLM: load.jsonl) add the load table (per concurrency: AR's and the
method's tokens/s, the speedup, requests/s, TTFT and TPOT percentiles, acceptance, identical outputs) to
`tables`, the speedup_vs_concurrency figure to `figures` and a section to the report; runs without it change
nothing. Runs whose steps have no per-step times (an engine that does not expose them, vLLM) stay in the
tables and are left out of the analyses of step times (throughput model, latency breakdown, cost per token,
draft latency), with one warning each.

Runs are averaged as repeats only when all their result-affecting settings (run.json) and their questions
match; otherwise each gets a label saying what differs, with a note on stderr. A run is counted once however
many paths reach it (DIR, DIR/, ./DIR, a symlink) and whether or not it was copied. Runs whose timings
summary.json flags as untrustworthy (a busy machine) are marked "UNTRUSTED" in every table, their warnings
listed under it. Questions with stalls inside them (steps far slower than the run's own steps of their size that
lost a material share of the question's time: answers.jsonl's specbench.stalls) are kept and marked: a "stalled"
column and a footnote naming each; --leave-out-stalled (tables, report, compare) leaves them out instead and says
how many and which, under the tables and on stderr. Result lines that are not well-formed records of their run
(half-written, not JSON, repeated, of another question set, unfinished) are left out with one warning per file,
as resuming leaves them out; a run whose summary.json or run.json is damaged or of a schema this analysis does
not read is left out, and one without a readable steps.parquet is left out of the step-level analyses, each with
a warning naming the file.
Only when nothing usable is left, or when a path given cannot be used (a RUNS path missing, a file or
unreadable; an --out that cannot be written; a --spec-bench file that is not a model_answer file), does it stop,
with one line (exit status 2).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the second of importing pandas and matplotlib too.
_interrupts = Interrupts("analysis: interrupted", "analysis: interrupted")
if __name__ == "__main__":
    _interrupts.arm()

import numpy as np  # noqa: E402  (after the interrupt handler, on purpose)
import pandas as pd  # noqa: E402

from analysis.compare import compare_table, compare_text, mat_figure, mat_pairs  # noqa: E402
from analysis.figures import make_all  # noqa: E402
from analysis.load import has_load, load_table, render_load  # noqa: E402
from analysis.published import of_model, select_published  # noqa: E402
from analysis.report import build_report  # noqa: E402
from analysis.projection import projection_table, projection_text, read_curve  # noqa: E402
from analysis.runs import load_runs, read_spec_bench, read_summary, timed_steps, untrusted_runs  # noqa: E402
from analysis.tables import (acceptance_table, leaderboard, leave_out_stalled, render, render_acceptance,  # noqa: E402
                             render_notice)
from analysis.throughput import (SHOWN_COLUMNS, deviation_summary, model_table, requirements_text,  # noqa: E402
                                 token_costs)
from specbench.questions import ALL_TASKS  # noqa: E402
from specbench.results.question_keys import question_key  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402
from specbench.storage.refusal import storage_refusal  # noqa: E402

USER_ERROR = 2  # as specbench's own entry point: a problem with the input, explained in one line
SHOWN_PROBLEMS = 3  # problems quoted in the one line that says nothing usable is left
TABLES = ("leaderboard", "acceptance", "load")  # what `tables` prints (--table picks one)
STALL_COMMANDS = ("tables", "report", "compare")  # the commands --leave-out-stalled applies to
OUT_KINDS = {"tables": "file", "report": "file", "figures": "folder"}  # what --out names, per command
DEFAULT_OUT = {"report": "report.html", "figures": "figures"}


def check_runs_path(text: str) -> None:
    """A RUNS argument that can be read: an existing, readable directory (a run or a folder of runs)."""
    path = Path(text)
    if not path.exists():
        raise SpecbenchError(f"{text}: no such run directory or folder; give run directories or folders holding "
                             "them (default: runs)")
    if not path.is_dir():
        raise SpecbenchError(f"{text} is a file, not a run directory or a folder holding runs")
    try:
        with os.scandir(path):
            pass
    except OSError as error:
        raise SpecbenchError(f"{text}: cannot be read ({error.strerror}); give a readable run directory") from None


def _probe_writable(folder: Path) -> None:
    """Create and remove a file in ``folder``: the one test of writability that holds for every user (root
    included) and every refusal (read-only mounts, quotas, permissions)."""
    handle, name = tempfile.mkstemp(prefix=".analysis-probe-", dir=folder)
    os.close(handle)
    os.unlink(name)


def check_out(text: str, kind: str) -> None:
    """An --out that can be written: for a ``file`` not a folder, for a ``folder`` not a file, with its nearest
    existing ancestor a writable folder (missing folders are created) and an existing file writable."""
    path = Path(text)
    if kind == "file" and path.is_dir():
        raise SpecbenchError(f"--out {text} is a folder; give the name of a file to write")
    if kind == "folder" and path.exists() and not path.is_dir():
        raise SpecbenchError(f"--out {text} is an existing file; give a folder for the figures")
    folder = path if kind == "folder" else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise SpecbenchError(f"--out {text}: {folder} is a file, not a folder; choose another --out")
    try:
        _probe_writable(folder)
        if kind == "file" and path.exists():
            with path.open("a"):
                pass
    except OSError as error:
        where = path if kind == "file" and path.exists() else folder
        raise SpecbenchError(f"--out {text}: cannot write in {where} ({error.strerror}); choose a writable "
                             "--out") from None


@contextlib.contextmanager
def writing(out: Path):
    """Turn a filesystem's refusal while the outputs are written (a disk that fills up) into one line."""
    try:
        yield
    except OSError as error:
        if storage_refusal(error) is None:
            raise
        raise SpecbenchError(f"cannot write {error.filename or out} ({error.strerror}); free space or choose a "
                             "writable --out") from error


def print_throughput(table: pd.DataFrame) -> None:
    """The throughput model's table (deviations in percent), the largest deviation each way, and what each
    run would need to match the best of its model; one line when no run has per-step times to model."""
    if table.empty:
        print("no run with per-step times: nothing for the throughput model (runs without them are named on "
              "stderr)")
        return
    pd.set_option("display.width", 250)
    percent = {column: (lambda v: "-" if np.isnan(v) else f"{100 * v:+.1f}%") for column in ("calib_dev", "loo_dev")}
    print(table[SHOWN_COLUMNS].to_string(index=False, formatters=percent, na_rep="-",
                                         float_format=lambda v: f"{v:.3f}"))
    print("\npredicted: tokens / (measured draft + predicted T_target + measured overhead); T_target from the "
          "run's calibration (calib)\nor from the other runs of the same model/device/dtype/threads, weights, "
          "machine and software (loo); "
          "dsd_form_tps leaves the overhead out.")
    print(f"largest deviation of predicted from measured throughput: {deviation_summary(table)}")
    flagged = untrusted_runs(table)
    if flagged:
        print("\ntiming UNTRUSTED (summary.json flags a busy machine; the numbers are as measured, not comparable):")
        print("\n".join(f"  {line}" for line in flagged))
    print("\nwhat each run would need to match the best of its model (all else equal):")
    print(requirements_text(table))


def print_token_costs(table: pd.DataFrame) -> None:
    """Where an accepted token's time goes, per run (``analysis.throughput.token_costs``)."""
    if table.empty:
        return
    print("\nms per accepted token by term (one_pass = AR ms per token / accepted tokens per step: the acceptance "
          "term;\nextra_verify = verify time beyond one AR pass: the verify cost of the draft's tokens), the "
          "speedup the terms allow,\nand the accepted tokens per step a 2x speedup would need at these times:")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))


class _MessageFormat(logging.Formatter):
    """``analysis: warning: ...`` / ``analysis: note: ...``: one line each, as the errors are."""

    def format(self, record: logging.LogRecord) -> str:
        kind = "warning" if record.levelno >= logging.WARNING else "note"
        return f"analysis: {kind}: {record.getMessage()}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("tables", "throughput", "figures", "report", "compare", "project"))
    parser.add_argument("runs", nargs="*", help="run directories or folders holding them (default: runs, unless "
                        "--spec-bench files are given)")
    parser.add_argument("--format", choices=("md", "latex", "csv"), default="md", help="for tables")
    parser.add_argument("--table", choices=TABLES, default=None, help="for tables: only the leaderboard (Spec-Bench's "
                        "per-task speedup and MAT), only the acceptance table (both speedups, vLLM's mean "
                        "acceptance length and rate, acceptance per position, time per token) or only the load "
                        "table (runs under load: per concurrency, tokens/s, speedup, TTFT, TPOT); default all "
                        "(the load table when a run has load.jsonl), but csv needs one (default leaderboard)")
    parser.add_argument("--out", default=None, help="output file (tables, report) or folder (figures)")
    parser.add_argument("--spec-bench", nargs=4, action="append", default=[],
                        metavar=("METHOD_JSONL", "BASELINE_JSONL", "MODEL", "METHOD"))
    parser.add_argument("--published", default="spec-bench", help="for compare: a source id (spec-bench, hd, "
                        "recycling, samd, dsd), all, or a CSV file of published numbers")
    parser.add_argument("--published-model", default=None, metavar="MODEL", help="for compare: only the published "
                        "tables of MODEL (e.g. vicuna-7b)")
    parser.add_argument("--task", action="append", choices=(*ALL_TASKS, "overall"), default=None,
                        help="for compare: only this task (repeatable)")
    parser.add_argument("--figure", default=None, metavar="PATH", help="for compare: also draw measured vs "
                        "published MAT as a PNG at PATH")
    parser.add_argument("--curve", default=None, metavar="JSON", help="for project: a gpu_check --out file with row "
                        "6's curves, or a run's verify_latency.json")
    parser.add_argument("--mode", default=None, help="for project: which curve of the gpu_check file (eager, none, "
                        "default, ...); default its fastest compiled one")
    parser.add_argument("--leave-out-stalled", action="store_true", help="for tables, report and compare: leave "
                        "out the questions whose stalled steps lost a material share of their time (run.stall_share; "
                        "docs/measurement.md), saying how many and which; by default they are kept and marked")
    args = parser.parse_args(argv)
    args.runs = args.runs or ([] if args.spec_bench else ["runs"])

    # Warnings (files left out) and notes (labels split) of analysis and of specbench's readers go to stderr,
    # one line each; the handler is removed again so that repeated calls (tests) do not stack handlers.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_MessageFormat())
    loggers = [logging.getLogger("analysis"), logging.getLogger("specbench")]
    levels = [logger.level for logger in loggers]
    loggers[0].setLevel(logging.INFO)
    for logger in loggers:
        logger.addHandler(handler)
    try:
        run_command(args)
    except SpecbenchError as error:
        print(f"analysis: error: {error}", file=sys.stderr)
        sys.exit(USER_ERROR)
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)


def run_command(args: argparse.Namespace) -> None:
    """The command of parsed arguments ``args``. Every path is checked before anything is read."""
    for text in args.runs:
        check_runs_path(text)
    if args.leave_out_stalled and args.command not in STALL_COMMANDS:
        raise SpecbenchError(f"--leave-out-stalled applies to {', '.join(STALL_COMMANDS)}, not to {args.command} "
                             "(which reads every step)")
    out = args.out or DEFAULT_OUT.get(args.command)
    if out is not None and args.command in OUT_KINDS:
        check_out(out, OUT_KINDS[args.command])
    if args.command == "compare" and args.figure:
        check_out(args.figure, "file")
    published = of_model(select_published(args.published), args.published_model) if args.command == "compare" else None
    if (args.command == "project") != (args.curve is not None):
        raise SpecbenchError("project needs --curve (a gpu_check --out file or a verify_latency.json)"
                             if args.command == "project" else f"--curve is for project, not {args.command}")
    curve = read_curve(args.curve, args.mode) if args.command == "project" else None
    # The leaderboard and compare need no steps (no warnings about them); the acceptance table reads the draft
    # depths of runs whose records lack them from their steps.
    needs_steps = args.command not in ("tables", "compare") or (args.command == "tables"
                                                               and args.table in (None, "acceptance")
                                                               and args.format != "csv")
    # Only these analyse step times, so only they say which runs are left out for having none.
    loaded = load_runs(args.runs, with_steps=needs_steps,
                       step_times=args.command in ("throughput", "figures", "report", "project"))
    questions = loaded.questions
    extra = [read_spec_bench(*files) for files in args.spec_bench]
    questions = pd.concat([questions, *extra], ignore_index=True) if extra else questions
    if args.command == "tables" and args.table == "load" and not has_load(loaded.load):
        raise SpecbenchError(f"--table load: no run under {', '.join(args.runs) or 'the paths given'} has a "
                             "load.jsonl (written by a run with engine.concurrency)")
    # A run under load may have no answers of its own: its levels are still something to show.
    usable = not questions.empty or (has_load(loaded.load) and args.command in ("tables", "figures", "report"))
    if not usable:
        problems = loaded.problems
        why = ("; left out: " + "; ".join(problems[:SHOWN_PROBLEMS]) + (" ..." if len(problems) > SHOWN_PROBLEMS else "")
               if problems else "")
        raise SpecbenchError(f"no usable runs with answers under {', '.join(args.runs) or 'the paths given'}{why}")
    steps = loaded.steps
    notice = None
    if args.leave_out_stalled:
        questions, steps, notice = without_stalled(questions, steps)
        logging.getLogger("analysis").info("%s", notice)  # on stderr, whatever the format of stdout
        if questions.empty and not (has_load(loaded.load) and args.command in ("tables", "report")):
            raise SpecbenchError(f"no question is left under {', '.join(args.runs)}: {notice}")

    if args.command == "tables":
        text = tables_text(questions, args.format, args.table, loaded.load)
        if notice and args.format != "csv":  # a CSV stays one table; the notice is on stderr
            text += "\n" + render_notice(notice, args.format)
        if out:
            with writing(Path(out)):
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                Path(out).write_text(text)
        print(text)
    elif args.command == "throughput":
        print_throughput(model_table(steps))
        print_token_costs(token_costs(questions, steps))
    elif args.command == "figures":
        with writing(Path(out)):
            written, skipped = make_all(questions, steps, Path(out), loaded.load)
        for path in written:
            print(path)
        for reason in skipped:
            print(f"skipped: {reason}", file=sys.stderr)
    elif args.command == "project":
        print_projection(questions, timed_steps(steps), curve)
    elif args.command == "compare":
        print_compare(questions, published, args.figure, args.task)
        if notice:
            print(f"\n{notice}")
    else:
        with writing(Path(out)):
            print(build_report(questions, steps, Path(out), problems=loaded.problems, load=loaded.load,
                               stalls_left_out=notice))


def print_projection(questions: pd.DataFrame, steps: pd.DataFrame, curve) -> None:
    """``analysis.projection``'s table for the runs with per-step times, each run's model size read from its
    summary (to warn when the curve's model is of another shape)."""
    if steps.empty:
        raise SpecbenchError("no run with per-step times to project (runs without them are named above)")
    sizes = {}
    for run_dir in steps.run_dir.unique():
        try:
            sizes[run_dir] = (read_summary(Path(run_dir)).get("cost_curve") or {}).get("bytes_per_pass")
        except Exception:  # noqa: BLE001 - the size only feeds a warning; load_runs already read this summary
            sizes[run_dir] = None
    print(projection_text(projection_table(steps, questions, curve, sizes), curve))


def without_stalled(questions: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """``analysis.tables.leave_out_stalled`` for --leave-out-stalled, with the left-out questions' steps left out
    of the step analyses too (the report's throughput model and figures); the notice is ``leave_out_stalled``'s."""
    kept, notice = leave_out_stalled(questions)
    if steps.empty or len(kept) == len(questions):
        return kept, steps, notice
    gone = (set(zip(questions.run_dir, questions.question_id.map(question_key)))
            - set(zip(kept.run_dir, kept.question_id.map(question_key))))
    stalled = [(run_dir, question_key(question)) in gone for run_dir, question in zip(steps.run_dir, steps.question_id)]
    return kept, steps[[not flag for flag in stalled]], notice


def tables_text(questions: pd.DataFrame, fmt: str, which: str | None, load: pd.DataFrame | None = None) -> str:
    """The leaderboard and the acceptance table (``analysis.tables``) in ``fmt``, then the load table
    (``analysis.load``) when a run of ``load`` (``LoadedRuns.load``) has levels, or the one ``which`` names; a
    CSV holds one table, the leaderboard unless ``which`` says otherwise (the load table when there are no
    answers, only levels)."""
    if fmt == "csv":
        which = which or ("leaderboard" if not questions.empty or not has_load(load) else "load")
    shown = []
    if which in (None, "leaderboard") and not questions.empty:
        shown.append(render(leaderboard(questions), fmt))
    if which in (None, "acceptance") and not questions.empty:
        shown.append(render_acceptance(acceptance_table(questions), fmt))
    if which in (None, "load") and has_load(load):
        shown.append(render_load(load_table(load), fmt))
    return "\n".join(shown)


def print_compare(questions: pd.DataFrame, published: pd.DataFrame, figure: str | None,
                  tasks: list[str] | None = None) -> None:
    """Measured beside published (``analysis.compare``), of ``tasks`` only when given, and the MAT figure when
    ``figure`` names a file; with no MAT pair to draw, the figure is skipped with a line on stderr rather than
    failing after the table."""
    table = compare_table(questions, published)
    if tasks:
        table = table[table.task.isin(tasks)].reset_index(drop=True)
    print(compare_text(table, questions, published))
    if figure is None:
        return
    if mat_pairs(table).empty:
        print(f"skipped: {figure}: no measured method has a published MAT in this selection", file=sys.stderr)
        return
    with writing(Path(figure)):
        print(mat_figure(table, Path(figure)))


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("analysis", main))
