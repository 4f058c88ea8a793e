"""Spec-Bench's leaderboard layout: per-task speedup and mean accepted tokens (MAT), and overall, for any
selection of runs, as Markdown, LaTeX or CSV; repeated runs of one configuration give mean and standard
deviation.

Speedup is Spec-Bench's: tokens/s per question (all turns), averaged over questions, method over baseline;
MAT is the mean over all steps of the tokens accepted per target forward pass (bonus token included).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.data import TASKS

STATS = ("speedup", "mat")
RUNS = ("runs", "", "")  # the column counting the runs of a configuration


def run_task_stats(questions: pd.DataFrame) -> pd.DataFrame:
    """Per run and task (plus "overall"): questions, speedup, mat, tokens_per_s, baseline_tokens_per_s."""
    frame = questions.assign(
        tokens_per_s=questions.tokens / questions.seconds,
        baseline_tokens_per_s=questions.baseline_tokens / questions.baseline_seconds,
    )
    rows = []
    for keys, group in frame.groupby(["run_dir", "model", "label"], sort=False):
        for task, part in [*group.groupby("task", sort=False), ("overall", group)]:
            speed, base = part.tokens_per_s.mean(), part.baseline_tokens_per_s.mean()
            rows.append({"run_dir": keys[0], "model": keys[1], "label": keys[2], "task": task,
                         "questions": len(part), "speedup": speed / base if base > 0 else np.nan,
                         "mat": part.accepted.sum() / part.steps.sum(), "tokens_per_s": speed,
                         "baseline_tokens_per_s": base})
    return pd.DataFrame(rows)


def leaderboard(questions: pd.DataFrame) -> pd.DataFrame:
    """Rows (model, label); columns (task, stat, mean|std) over the runs of each configuration."""
    stats = run_task_stats(questions)
    order = [task for task in (*TASKS, "overall") if task in set(stats.task)]
    grouped = stats.groupby(["model", "label", "task"])[list(STATS)].agg(["mean", "std"])
    table = grouped.unstack("task")
    table.columns = table.columns.reorder_levels([2, 0, 1])
    columns = [(task, stat, agg) for task in order for stat in STATS for agg in ("mean", "std")]
    table = table.reindex(columns=pd.MultiIndex.from_tuples(columns))
    table[RUNS] = stats[stats.task == "overall"].groupby(["model", "label"]).size()
    return table


def _cell(mean, std, stat: str) -> str:
    if pd.isna(mean):
        return "-"
    text = f"{mean:.2f}x" if stat == "speedup" else f"{mean:.2f}"
    return text + (f" ± {std:.2f}" if not pd.isna(std) else "")


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard as strings, one column per (task, stat): "1.93x ± 0.04"."""
    tasks = list(dict.fromkeys(task for task, *_ in table.columns if task != "runs"))
    out = pd.DataFrame(index=table.index)
    for task in tasks:
        for stat in STATS:
            label = f"{task} {'speedup' if stat == 'speedup' else 'MAT'}"
            out[label] = [_cell(m, s, stat) for m, s in zip(table[(task, stat, "mean")], table[(task, stat, "std")])]
    out["runs"] = table[RUNS]
    return out.reset_index()


def render(table: pd.DataFrame, fmt: str) -> str:
    """Markdown (``md``), LaTeX (``latex``) or CSV (``csv``, numeric mean/std columns) of a leaderboard."""
    if fmt == "csv":
        flat = table.copy()
        flat.columns = ["_".join(c for c in column if c) if isinstance(column, tuple) else column
                        for column in flat.columns]
        return flat.reset_index().to_csv(index=False)
    shown = formatted(table)
    if fmt == "md":
        header = "| " + " | ".join(shown.columns) + " |"
        rule = "|" + "|".join("---" for _ in shown.columns) + "|"
        body = ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
        return "\n".join([header, rule, *body]) + "\n"
    if fmt == "latex":
        escaped = shown.map(lambda v: str(v).replace("±", r"$\pm$").replace("_", r"\_"))
        escaped.columns = [c.replace("_", r"\_") for c in shown.columns]
        return escaped.to_latex(index=False, escape=False)
    raise ValueError(f"unknown format {fmt!r}: md, latex or csv")
