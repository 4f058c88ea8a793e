"""``python -m analysis COMMAND RUNS...``: tables, throughput model, figures and an HTML report from runs.

    python -m analysis tables runs/ --format md            # Spec-Bench leaderboard (md, latex, csv)
    python -m analysis throughput runs/                    # DSD throughput model: predicted vs measured
    python -m analysis figures runs/ --out figures/        # every figure, PNG and PDF
    python -m analysis report runs/ --out report.html      # one offline HTML page with all of it
    python -m analysis tables runs/ --spec-bench method.jsonl baseline.jsonl vicuna-7b eagle

RUNS are run directories or folders holding them (a multirun's sweep folder, or runs/). --spec-bench adds
Spec-Bench's own model_answer files (a method's and its baseline's, with a model and method name).

Runs are averaged as repeats only when all their result-affecting settings (run.json) and their questions
match; otherwise each gets a label saying what differs, with a note on stderr. Runs whose timings summary.json
flags as untrustworthy (a busy machine) are marked "UNTRUSTED" in every table, their warnings listed under it.
A half-written last answer line (a run killed mid-write) is ignored, with a warning; a run whose summary.json,
run.json or answer files are damaged is left out, and one without a readable steps.parquet is left out of the
step-level analyses, each with a warning naming the file. A result file of a schema version this analysis does
not read, or a --spec-bench file that is not a model_answer file, stops it with a one-line error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.figures import make_all
from analysis.report import build_report
from analysis.runs import load_runs, read_spec_bench, untrusted_runs
from analysis.tables import leaderboard, render
from analysis.throughput import SHOWN_COLUMNS, deviation_summary, model_table, requirements, token_costs
from specbench.errors import SpecbenchError

USER_ERROR = 2  # as specbench's own entry point: a problem with the input, explained in one line


def print_throughput(table: pd.DataFrame) -> None:
    """The throughput model's table (deviations in percent), the largest deviation each way, and what each
    run would need to match the best of its model."""
    pd.set_option("display.width", 250)
    percent = {column: (lambda v: "-" if np.isnan(v) else f"{100 * v:+.1f}%") for column in ("calib_dev", "loo_dev")}
    print(table[SHOWN_COLUMNS].to_string(index=False, formatters=percent, float_format=lambda v: f"{v:.3f}"))
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
    print(requirements(table).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


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
    parser.add_argument("command", choices=("tables", "throughput", "figures", "report"))
    parser.add_argument("runs", nargs="*", default=["runs"])
    parser.add_argument("--format", choices=("md", "latex", "csv"), default="md", help="for tables")
    parser.add_argument("--out", default=None, help="output file (tables, report) or folder (figures)")
    parser.add_argument("--spec-bench", nargs=4, action="append", default=[],
                        metavar=("METHOD_JSONL", "BASELINE_JSONL", "MODEL", "METHOD"))
    args = parser.parse_args(argv)

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
    """The command of parsed arguments ``args``."""
    loaded = load_runs(args.runs, with_steps=args.command != "tables")  # tables need no steps: no warnings about them
    questions = loaded.questions
    extra = [read_spec_bench(*files) for files in args.spec_bench]
    questions = pd.concat([questions, *extra], ignore_index=True) if extra else questions
    if questions.empty:
        print(f"analysis: no runs with answers under {', '.join(args.runs)}", file=sys.stderr)
        sys.exit(USER_ERROR)
    steps = loaded.steps

    if args.command == "tables":
        text = render(leaderboard(questions), args.format)
        if args.out:
            Path(args.out).write_text(text)
        print(text)
    elif args.command == "throughput":
        print_throughput(model_table(steps))
        print_token_costs(token_costs(questions, steps))
    elif args.command == "figures":
        written, skipped = make_all(questions, steps, Path(args.out or "figures"))
        for path in written:
            print(path)
        for reason in skipped:
            print(f"skipped: {reason}", file=sys.stderr)
    else:
        print(build_report(questions, steps, Path(args.out or "report.html"), problems=loaded.problems))


if __name__ == "__main__":
    main()
