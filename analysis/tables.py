"""Spec-Bench's leaderboard layout: per-task speedup and mean accepted tokens (MAT), and overall, for any
selection of runs, as Markdown, LaTeX or CSV; repeated runs of one configuration give mean and standard
deviation. Overall, it also counts the questions whose output is identical to the baseline's and, of the
others, those that first differ at a near-tie or by a violation (summed over repeated runs).

Every statistic comes from ``specbench.metrics`` (Spec-Bench's definitions): speedup is tokens/s per
question (all turns), averaged over questions, method over baseline; MAT is the mean over all steps, the
prefill included, of the tokens accepted per target forward pass (bonus token included).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench import metrics
from specbench.data import TASKS

STATS = ("speedup", "mat")
RUNS = ("runs", "", "")  # the column counting the runs of a configuration
EXACTNESS = ("questions", "identical", "near_ties", "violations")  # overall counts, summed over runs


def _known(value):
    """A frame cell as Python: None for a missing value (None or NaN)."""
    return None if value is None or (not isinstance(value, str) and pd.isna(value)) else value


def _number(value):
    return np.nan if value is None else value


def run_task_stats(questions: pd.DataFrame) -> pd.DataFrame:
    """Per run and task (plus "overall"), from the per-question rows of ``analysis.runs``: questions, speedup,
    mat, acceptance_rate, tokens_per_s, baseline_tokens_per_s (``metrics.statistics_of_questions``), and
    identical, near_ties, violations (``metrics.exactness_counts``). A value that cannot be known (no paired
    baseline, records without the counts) is NaN."""
    rows = []
    for keys, group in questions.groupby(["run_dir", "model", "label"], sort=False):
        for task, part in [*group.groupby("task", sort=False), ("overall", group)]:
            paired = bool(part.baseline_tokens_per_s.notna().all())
            drafted = [None if _known(count) is None else int(count) for count in part.drafted]
            stats = metrics.statistics_of_questions(
                list(part.tokens_per_s), list(part.accept_lengths), drafted,
                list(part.baseline_tokens_per_s) if paired else None)
            counts = metrics.exactness_counts(
                [None if _known(flag) is None else bool(flag) for flag in part.identical],
                [_known(kind) for kind in part.mismatch])
            rows.append({"run_dir": keys[0], "model": keys[1], "label": keys[2], "task": task,
                         "questions": stats["questions"], "speedup": _number(stats["speedup"]),
                         "mat": stats["mean_accepted_tokens"], "acceptance_rate": _number(stats["acceptance_rate"]),
                         "tokens_per_s": stats["tokens_per_s"],
                         "baseline_tokens_per_s": _number(stats["baseline_tokens_per_s"]),
                         **{key: _number(value) for key, value in counts.items()}})
    return pd.DataFrame(rows)


def _total(values: pd.Series) -> float:
    """The sum over runs, or NaN when any run's count is unknown."""
    return float(values.sum()) if values.notna().all() else np.nan


def leaderboard(questions: pd.DataFrame) -> pd.DataFrame:
    """Rows (model, label); columns (task, stat, mean|std) over the runs of each configuration, then the overall
    counts (questions, identical, near_ties, violations), summed over those runs, and the number of runs."""
    stats = run_task_stats(questions)
    order = [task for task in (*TASKS, "overall") if task in set(stats.task)]
    grouped = stats.groupby(["model", "label", "task"])[list(STATS)].agg(["mean", "std"])
    table = grouped.unstack("task")
    table.columns = table.columns.reorder_levels([2, 0, 1])
    columns = [(task, stat, agg) for task in order for stat in STATS for agg in ("mean", "std")]
    table = table.reindex(columns=pd.MultiIndex.from_tuples(columns))
    overall = stats[stats.task == "overall"].groupby(["model", "label"])
    for count in EXACTNESS:
        table[(count, "", "")] = overall[count].agg(_total)
    table[RUNS] = overall.size()
    return table


def _cell(mean, std, stat: str) -> str:
    if pd.isna(mean):
        return "-"
    text = f"{mean:.2f}x" if stat == "speedup" else f"{mean:.2f}"
    return text + (f" ± {std:.2f}" if not pd.isna(std) else "")


def exactness_cell(questions, identical, near_ties, violations) -> str:
    """The overall counts as text: "10/12 (2 near-tie, 0 violation)"; "10/12" where the kinds are unknown
    (older records, sampling); "-" without a baseline."""
    if _known(identical) is None:
        return "-"
    text = f"{int(identical)}/{int(questions)}"
    if _known(near_ties) is None or _known(violations) is None:
        return text
    return f"{text} ({int(near_ties)} near-tie, {int(violations)} violation)"


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard as strings, one column per (task, stat): "1.93x ± 0.04", then "identical": the overall
    counts as ``exactness_cell`` writes them, and "runs"."""
    tasks = list(dict.fromkeys(task for task, stat, _ in table.columns if stat in STATS))
    out = pd.DataFrame(index=table.index)
    for task in tasks:
        for stat in STATS:
            label = f"{task} {'speedup' if stat == 'speedup' else 'MAT'}"
            out[label] = [_cell(m, s, stat) for m, s in zip(table[(task, stat, "mean")], table[(task, stat, "std")])]
    out["identical"] = [exactness_cell(*values) for values in zip(*(table[(count, "", "")] for count in EXACTNESS))]
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
