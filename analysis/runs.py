"""Load any set of run directories (single runs, or every job of a multirun) into pandas DataFrames.

    from analysis.runs import load_summaries, load_steps
    table = load_summaries(["runs/"])      # one row per run and task
    steps = load_steps(["runs/"])          # every decoding step, tagged with its run
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specbench.records import STEP_COLUMNS, SUMMARY_KEYS


def find_run_dirs(paths) -> list[Path]:
    """Every directory at or below ``paths`` that holds a ``summary.json``, sorted."""
    found = set()
    for path in map(Path, paths):
        if (path / "summary.json").is_file():
            found.add(path)
        found.update(summary.parent for summary in path.rglob("summary.json"))
    return sorted(found)


def load_summaries(paths) -> pd.DataFrame:
    """One row per (run, task) with the run's model and drafter and the summary's statistics."""
    rows = []
    for run_dir in find_run_dirs(paths):
        summary = json.loads((run_dir / "summary.json").read_text())
        for task, stats in summary["tasks"].items():
            rows.append({"run_dir": str(run_dir), "model": summary["model"], "drafter": summary["drafter"],
                         "task": task, **{key: stats.get(key) for key in SUMMARY_KEYS}})
    return pd.DataFrame(rows, columns=["run_dir", "model", "drafter", "task", *SUMMARY_KEYS])


def load_steps(paths) -> pd.DataFrame:
    """Every step record of every run, with run_dir, model and drafter columns added."""
    frames = []
    for run_dir in find_run_dirs(paths):
        steps_file = run_dir / "steps.parquet"
        if not steps_file.is_file():
            continue
        summary = json.loads((run_dir / "summary.json").read_text())
        frame = pd.read_parquet(steps_file)
        frame.insert(0, "drafter", summary["drafter"])
        frame.insert(0, "model", summary["model"])
        frame.insert(0, "run_dir", str(run_dir))
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["run_dir", "model", "drafter", *STEP_COLUMNS])
    return pd.concat(frames, ignore_index=True)
