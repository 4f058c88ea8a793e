"""Every drafter on the same model and questions, each paired with the AR baseline per question.

    python scripts/bench_drafters.py --limit-per-task 2 --max-new-tokens 128 --out runs/bench
    python scripts/bench_drafters.py --drafters pld hd hd-lookahead -- model=vicuna-7b task.path=question.jsonl

Each drafter runs as ``python -m specbench drafter=NAME`` would, into OUT/NAME (re-running resumes), then
one table per measure is printed, per task: speedup (the fastest drafter of each task marked), mean accepted
tokens (MAT), acceptance rate and questions identical to AR (with how many of the others differ at a near-tie
or by a violation), all read from each run's summary.json, and the drafting latency per decoding step
(prefill excluded) from its steps.parquet. Every one is defined in ``specbench.metrics``. ``hd-lookahead`` is
HD with drafter.lookahead_branch=true.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pandas as pd

from analysis.tables import exactness_cell
from specbench import metrics
from specbench.config import compose
from specbench.data import TASKS
from specbench.errors import SpecbenchError
from specbench.records import read_answers
from specbench.runner import run_benchmark

VARIANTS = {"hd-lookahead": ("hd", ["drafter.lookahead_branch=true", "drafter.name=hd-lookahead"])}
MEASURES = (  # (summary key or column, format, title)
    ("speedup", "{:.2f}x", "speedup over AR (* fastest)"),
    ("mean_accepted_tokens", "{:.2f}", "mean accepted tokens (prefill included, bonus token included)"),
    ("acceptance_rate", "{:.3f}", "acceptance rate (accepted / drafted tokens)"),
    ("draft_ms", "{:.3f}", "drafting latency per decoding step (ms)"),
    ("exactness", "{}", "questions identical to AR (of the others: near-ties, violations)"),
)


def draft_ms_per_task(run_dir: Path) -> dict:
    """Mean drafting milliseconds per decoding step of a run directory, per task and overall."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    task_of = {record["question_id"]: record["specbench"]["task"] for record in read_answers(run_dir)}
    tasks = steps.question_id.map(task_of)
    per_task = {task: 1000 * metrics.draft_seconds_per_step(part.draft_s.tolist(), part.step.tolist())
                for task, part in steps.groupby(tasks)}
    per_task["overall"] = 1000 * metrics.draft_seconds_per_step(steps.draft_s.tolist(), steps.step.tolist())
    return per_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafters", nargs="+", default=["pld", "lookahead", "rest", "hd"])
    parser.add_argument("--limit-per-task", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/bench_drafters")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. model=vicuna-7b")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    rows = []
    for name in args.drafters:
        drafter, extra = VARIANTS.get(name, (name, []))
        overrides = [f"drafter={drafter}", *extra, f"run.max_new_tokens={args.max_new_tokens}", *args.overrides]
        if args.limit_per_task:
            overrides.append(f"task.limit_per_task={args.limit_per_task}")
        print(f"== {name}", flush=True)
        run_dir = Path(args.out) / name
        try:
            run_benchmark(compose(overrides), str(run_dir))
        except SpecbenchError as error:
            print(f"bench_drafters: error: {error}", file=sys.stderr)
            sys.exit(2)
        summary = json.loads((run_dir / "summary.json").read_text())
        draft_ms = draft_ms_per_task(run_dir)
        for task, stats in summary["tasks"].items():
            # Summaries written before acceptance_rate, near_ties and violations existed lack them: shown as "-".
            exactness = exactness_cell(stats["questions"], stats.get("identical_to_baseline"),
                                       stats.get("near_ties"), stats.get("violations"))
            rows.append({"drafter": name, "task": task, "speedup": stats.get("speedup"),
                         "mean_accepted_tokens": stats.get("mean_accepted_tokens"),
                         "acceptance_rate": stats.get("acceptance_rate"), "draft_ms": draft_ms.get(task),
                         "exactness": exactness})

    table = pd.DataFrame(rows)
    order = [task for task in (*TASKS, "overall") if task in set(table.task)]
    for measure, fmt, title in MEASURES:
        pivot = table.pivot(index="task", columns="drafter", values=measure).loc[order, args.drafters]
        shown = pivot.map(lambda value: "-" if value is None or pd.isna(value) else fmt.format(value))
        if measure == "speedup":
            for task in order:
                speedups = pivot.loc[task].astype(float)
                if speedups.notna().any():
                    shown.loc[task, speedups.idxmax()] += " *"
        print(f"\n{title}\n{shown.to_string()}")


if __name__ == "__main__":
    main()
