"""Every drafter on the same model and questions, each paired with the AR baseline per question.

    python scripts/bench_drafters.py --limit-per-task 2 --max-new-tokens 128 --out runs/bench
    python scripts/bench_drafters.py --drafters pld hd hd-lookahead -- model=vicuna-7b task.path=question.jsonl

Each drafter runs as ``python -m specbench drafter=NAME`` would, into OUT/NAME (re-running resumes), then
one table per measure is printed: speedup, mean accepted tokens (MAT) and drafting latency per step, per
task, with the fastest drafter of each task marked. ``hd-lookahead`` is HD with drafter.lookahead_branch=true.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import pandas as pd

from specbench.config import compose
from specbench.data import TASKS
from specbench.errors import SpecbenchError
from specbench.runner import run_benchmark

VARIANTS = {"hd-lookahead": ("hd", ["drafter.lookahead_branch=true", "drafter.name=hd-lookahead"])}


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
        try:
            summary = run_benchmark(compose(overrides), str(Path(args.out) / name))
        except SpecbenchError as error:
            print(f"bench_drafters: error: {error}", file=sys.stderr)
            sys.exit(2)
        steps = pd.read_parquet(Path(args.out) / name / "steps.parquet")
        answers = pd.read_json(Path(args.out) / name / "answers.jsonl", lines=True)
        task_of = {row.question_id: row.specbench["task"] for row in answers.itertuples()}
        steps = steps[steps.step > 0].assign(task=lambda frame: frame.question_id.map(task_of))
        draft_ms = (steps.groupby("task").draft_s.mean() * 1000).to_dict()
        draft_ms["overall"] = steps.draft_s.mean() * 1000
        for task, stats in summary["tasks"].items():
            rows.append({"drafter": name, "task": task, **stats, "draft_ms": draft_ms.get(task)})

    table = pd.DataFrame(rows)
    order = [task for task in (*TASKS, "overall") if task in set(table.task)]
    for measure, fmt in (("speedup", "{:.2f}x"), ("mean_accepted_tokens", "{:.2f}"), ("draft_ms", "{:.3f}"),
                         ("identical_to_baseline", "{:.0f}")):
        pivot = table.pivot(index="task", columns="drafter", values=measure).loc[order, args.drafters]
        shown = pivot.map(lambda value: "-" if pd.isna(value) else fmt.format(value))
        if measure == "speedup":
            best = pivot.idxmax(axis=1)
            for task in order:
                shown.loc[task, best[task]] += " *"
        label = {"draft_ms": "drafting latency per step (ms)", "mean_accepted_tokens": "mean accepted tokens",
                 "identical_to_baseline": "questions identical to AR", "speedup": "speedup over AR (* fastest)"}
        print(f"\n{label[measure]}\n{shown.to_string()}")


if __name__ == "__main__":
    main()
