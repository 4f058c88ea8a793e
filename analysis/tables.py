"""Spec-Bench's leaderboard layout: per-task speedup and mean accepted tokens (MAT), and overall, for any
selection of runs, as Markdown, LaTeX or CSV; repeated runs of one configuration give mean and standard
deviation. Overall, it also counts the questions whose output is identical to the baseline's and, of the
others, those that first differ at a near-tie or by a violation (summed over repeated runs).

Every statistic comes from ``specbench.measure.metrics`` (Spec-Bench's definitions): speedup is tokens/s per
question (all turns), averaged over questions, method over baseline; MAT is the mean over all steps, the
prefill included, of the tokens accepted per target forward pass (bonus token included).

A configuration any of whose runs summary.json flags as timed on a busy machine (timing.trustworthy false)
keeps its numbers, marked: the Markdown and LaTeX tables get a "timing" column and a footnote line per such
configuration naming its flagged runs and their warnings; the CSV always has "timing" and "timing_warnings".

Questions whose answers record stalls inside them (``specbench.measure.stalls``: stalled steps that lost more than
run.stall_share of the method's or AR's time) are kept in the numbers and marked: a "stalled" column counts them
per configuration and a footnote names each; ``leave_out_stalled`` (``--leave-out-stalled``) leaves them out
instead, with a notice saying how many and which, never silently.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.runs import TIMING_OK, TIMING_UNCHECKED, TIMING_UNTRUSTED, timing_flag, timing_warnings_text
from specbench.measure import metrics
from specbench.measure.stalls import STALLED
from specbench.questions import ALL_TASKS

STATS = ("speedup", "mat")
TPOT_KEYS = ("tpot_ms", *(f"tpot_p{percentile}_ms" for percentile in metrics.TPOT_PERCENTILES))
SHOWN_POSITIONS = 4  # draft positions the acceptance table shows (summary.json and the CSV hold them all)
# The acceptance table's columns: (statistic of run_task_stats, its header). Definitions: specbench.measure.metrics.
ACCEPTANCE_COLUMNS = (
    ("speedup", "speedup (ratio of means)"),
    ("speedup_mean_of_ratios", "speedup (mean of ratios)"),
    ("mat", "MAT"),
    ("mean_acceptance_length", "mean acceptance length (vLLM)"),
    ("acceptance_rate", "acceptance rate"),
)
RUNS = ("runs", "", "")  # the column counting the runs of a configuration
EXACTNESS = ("questions", "identical", "near_ties", "violations")  # overall counts, summed over runs
TIMING = ("timing", "", "")  # whether the runs' timings can be trusted (``timing_cell``)
TIMING_WARNINGS = ("timing_warnings", "", "")  # the flagged runs and their warnings, for the footnote
STALLED_COUNT = ("stalled", "", "")  # stalled questions kept in a configuration's numbers, summed over its runs
STALL_NOTES = ("stall_notes", "", "")  # each of them with what stalled, for the footnote


def _known(value):
    """A frame cell as Python: None for a missing value (None or NaN)."""
    return None if value is None or (not isinstance(value, str) and pd.isna(value)) else value


def _number(value):
    return np.nan if value is None else value


def _known_list(value):
    """A frame cell that holds a list, or None (a missing list is None or NaN)."""
    return value if isinstance(value, (list, tuple, np.ndarray)) else None


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
            depths = list(part.draft_depths) if "draft_depths" in part else None
            stats = metrics.statistics_of_questions(
                list(part.tokens_per_s), list(part.accept_lengths), drafted,
                list(part.baseline_tokens_per_s) if paired else None,
                None if depths is None else [None if _known_list(d) is None else list(d) for d in depths])
            counts = metrics.exactness_counts(
                [None if _known(flag) is None else bool(flag) for flag in part.identical],
                [_known(kind) for kind in part.mismatch])
            rows.append({"run_dir": keys[0], "model": keys[1], "label": keys[2], "task": task,
                         "questions": stats["questions"], "speedup": _number(stats["speedup"]),
                         "mat": stats["mean_accepted_tokens"], "acceptance_rate": _number(stats["acceptance_rate"]),
                         "tokens_per_s": stats["tokens_per_s"],
                         "baseline_tokens_per_s": _number(stats["baseline_tokens_per_s"]),
                         "speedup_mean_of_ratios": _number(stats["speedup_mean_of_ratios"]),
                         "mean_acceptance_length": _number(stats["mean_acceptance_length"]),
                         "acceptance_by_position": stats["acceptance_by_position"],
                         **{key: stats[key] for key in TPOT_KEYS},
                         **{key: _number(value) for key, value in counts.items()}})
    return pd.DataFrame(rows)


def _total(values: pd.Series) -> float:
    """The sum over runs, or NaN when any run's count is unknown."""
    return float(values.sum()) if values.notna().all() else np.nan


def leaderboard(questions: pd.DataFrame) -> pd.DataFrame:
    """Rows (model, label); columns (task, stat, mean|std) over the runs of each configuration, then the overall
    counts (questions, identical, near_ties, violations), summed over those runs, the number of runs, and
    timing (``timing_cell``) with timing_warnings (the flagged runs and their warnings)."""
    stats = run_task_stats(questions)
    order = [task for task in (*ALL_TASKS, "overall") if task in set(stats.task)]
    grouped = stats.groupby(["model", "label", "task"])[list(STATS)].agg(["mean", "std"])
    table = grouped.unstack("task")
    table.columns = table.columns.reorder_levels([2, 0, 1])
    columns = [(task, stat, agg) for task in order for stat in STATS for agg in ("mean", "std")]
    table = table.reindex(columns=pd.MultiIndex.from_tuples(columns))
    overall = stats[stats.task == "overall"].groupby(["model", "label"])
    for count in EXACTNESS:
        table[(count, "", "")] = overall[count].agg(_total)
    table[RUNS] = overall.size()
    cells, warnings = {}, {}
    for key, runs in _runs_of(questions).groupby(["model", "label"]):
        cells[key] = timing_cell(runs.trustworthy)
        flagged = runs[[timing_flag(flag) == TIMING_UNTRUSTED for flag in runs.trustworthy]]
        warnings[key] = " | ".join(f"{row.run_dir}: {timing_warnings_text(row.timing_warnings)}"
                                   for row in flagged.itertuples())
    table[TIMING] = [cells[key] for key in table.index]
    table[TIMING_WARNINGS] = [warnings[key] for key in table.index]
    stalled = questions[stalled_mask(questions)]
    notes = {key: " | ".join(stall_line(row) for row in rows.itertuples())
             for key, rows in stalled.groupby(["model", "label"])}
    counts = stalled.groupby(["model", "label"]).size()
    table[STALLED_COUNT] = [int(counts.get(key, 0)) for key in table.index]
    table[STALL_NOTES] = [notes.get(key, "") for key in table.index]
    return table


def stalled_mask(questions: pd.DataFrame) -> pd.Series:
    """Which question rows record a stalled question (``specbench.measure.stalls``); none in frames without the
    column (Spec-Bench's files read before it existed)."""
    if "stalls" not in questions:
        return pd.Series(False, index=questions.index)
    return questions.stalls == STALLED


def stall_line(row) -> str:
    """A stalled question row as a footnote names it: "RUN_DIR: question 101: 3 stalled steps lost ..."."""
    return f"{row.run_dir}: question {row.question_id}: {row.stall_detail}"


def leave_out_stalled(questions: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``questions`` without the stalled ones (both sides of each: its speedup pairs them), and the notice saying
    how many were left out, of which configurations, and which. A run whose timing was flagged only for questions
    now left out (summary.json names each by "question ID: ") is no longer flagged: its remaining warnings are
    the others."""
    mask = stalled_mask(questions)
    left, kept = questions[mask], questions[~mask].copy()
    if left.empty:
        return kept, "--leave-out-stalled: no stalled question in these runs; nothing left out"
    for run_dir, gone in left.groupby("run_dir", sort=False):
        rows = kept.run_dir == run_dir
        if not rows.any() or "timing_warnings" not in kept:
            continue
        prefixes = tuple(f"question {question}: " for question in gone.question_id)
        joined = kept.loc[rows, "timing_warnings"].iloc[0]
        remaining = [warning for warning in (joined if isinstance(joined, str) else "").split("; ")
                     if warning and not warning.startswith(prefixes)]
        kept.loc[rows, "timing_warnings"] = "; ".join(remaining)
        if timing_flag(kept.loc[rows, "trustworthy"].iloc[0]) == TIMING_UNTRUSTED and not remaining:
            kept.loc[rows, "trustworthy"] = True
    named = [f"{model} {label}: {', '.join(f'{row.run_dir} question {row.question_id}' for row in rows.itertuples())}"
             for (model, label), rows in left.groupby(["model", "label"], sort=False)]
    return kept, (f"--leave-out-stalled: left out {len(left)} stalled question(s) of {left.run_dir.nunique()} run(s) "
                  f"(stalled steps lost more than run.stall_share of their time): {'; '.join(named)}")


def acceptance_table(questions: pd.DataFrame, positions: int = SHOWN_POSITIONS) -> pd.DataFrame:
    """Per configuration (model, label), over all its questions and averaged over its runs: both speedup
    definitions, MAT beside vLLM's mean acceptance length, the acceptance rate (vLLM's draft acceptance rate),
    the acceptance at draft positions 1 to ``positions`` (``metrics.acceptance_by_position``) and the time per
    output token with its percentiles over questions. NaN where a run cannot know it (no baseline, no draft
    depths, a position no draft reached)."""
    overall = run_task_stats(questions)
    overall = overall[overall.task == "overall"].copy()
    for position in range(1, positions + 1):
        overall[f"position_{position}"] = [
            shares[position - 1] if _known_list(shares) is not None and len(shares) >= position else np.nan
            for shares in overall.acceptance_by_position]
    numeric = [key for key, _ in ACCEPTANCE_COLUMNS] + [f"position_{p}" for p in range(1, positions + 1)] + list(TPOT_KEYS)
    table = overall.groupby(["model", "label"], sort=False)[numeric].mean()
    cells = {key: timing_cell(runs.trustworthy) for key, runs in _runs_of(questions).groupby(["model", "label"])}
    # The speedups and times of a run timed on a busy machine are marked as the leaderboard marks them.
    table.insert(0, "timing", [cells[key] for key in table.index])
    return table


def acceptance_headers(positions: int = SHOWN_POSITIONS) -> dict[str, str]:
    """The acceptance table's column names for a reader."""
    return {**dict(ACCEPTANCE_COLUMNS), **{f"position_{p}": f"accepted at position {p}" for p in range(1, positions + 1)},
            "tpot_ms": "ms / token", **{f"tpot_p{p}_ms": f"p{p} ms / token" for p in metrics.TPOT_PERCENTILES}}


ACCEPTANCE_LEGEND = (
    "speedup (ratio of means): mean tokens/s over the paired AR baseline's mean tokens/s, Spec-Bench's speed.py; "
    "speedup (mean of ratios): the mean of the per-question speedups; MAT: tokens per target pass, the prefill and "
    "the bonus token included (Spec-Bench); mean acceptance length (vLLM): 1 + accepted draft tokens per step that "
    "verified a draft; acceptance rate: accepted over drafted tokens (vLLM's draft acceptance rate); accepted at "
    "position i: the share of drafts reaching position i that were accepted there; ms / token: wall time over "
    "new tokens per question, mean and percentiles over questions (the prefill included, unlike vLLM's TPOT); "
    "-: not known for that run (no baseline, or records without draft depths)")


def acceptance_cells(table: pd.DataFrame) -> pd.DataFrame:
    """``acceptance_table`` as text cells (model and label as columns): speedups as "1.70x", times with one
    decimal, the rest with two, "-" where unknown; the timing column only when a run's timings are flagged."""
    shown = table.reset_index()
    if not shown.timing.astype(str).str.startswith(TIMING_UNTRUSTED).any():
        shown = shown.drop(columns="timing")
    return pd.DataFrame({column: [_acceptance_cell(column, value) for value in shown[column]] for column in shown.columns})


def render_acceptance(table: pd.DataFrame, fmt: str) -> str:
    """Markdown, LaTeX or CSV of ``acceptance_table``; the text formats end with the legend."""
    if fmt == "csv":
        return table.reset_index().to_csv(index=False)
    headers = {"model": "model", "label": "method", "timing": "timing",
               **acceptance_headers(len([column for column in table if column.startswith("position_")]))}
    cells = acceptance_cells(table)
    cells.columns = [headers[column] for column in cells.columns]
    if fmt == "md":
        lines = ["| " + " | ".join(cells.columns) + " |", "|" + "|".join("---" for _ in cells.columns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)]
        return "\n".join([*lines, "", ACCEPTANCE_LEGEND]) + "\n"
    if fmt == "latex":
        escaped = cells.map(lambda v: str(v).replace("_", r"\_"))
        return escaped.to_latex(index=False, escape=False) + f"\\par\\noindent {_latex_text(ACCEPTANCE_LEGEND)}\n"
    raise ValueError(f"unknown format {fmt!r}: md, latex or csv")


def _acceptance_cell(column: str, value) -> str:
    if isinstance(value, str):
        return value
    if pd.isna(value):
        return "-"
    if column.startswith("speedup"):
        return f"{value:.2f}x"
    return f"{value:.1f}" if column.startswith("tpot") else f"{value:.2f}"


def _runs_of(questions: pd.DataFrame) -> pd.DataFrame:
    """One row per run of ``questions``: run_dir, model, label, trustworthy, timing_warnings (None and "" for
    frames built without them)."""
    runs = questions.drop_duplicates("run_dir")
    return pd.DataFrame({"run_dir": runs.run_dir, "model": runs.model, "label": runs.label,
                         "trustworthy": runs.trustworthy if "trustworthy" in runs else None,
                         "timing_warnings": runs.timing_warnings if "timing_warnings" in runs else ""})


def timing_cell(flags) -> str:
    """The timing of a configuration's runs: "UNTRUSTED" when any was timed on a busy machine ("UNTRUSTED (1/3
    runs)" when not all), "ok" when every one was checked and passed, else "unchecked" (runs that did not
    record the check: schema 2, Spec-Bench's own files)."""
    shown = [timing_flag(flag) for flag in flags]
    untrusted = shown.count(TIMING_UNTRUSTED)
    if untrusted:
        return TIMING_UNTRUSTED if untrusted == len(shown) else f"{TIMING_UNTRUSTED} ({untrusted}/{len(shown)} runs)"
    return TIMING_OK if shown and all(flag == TIMING_OK for flag in shown) else TIMING_UNCHECKED


def _flagged(table: pd.DataFrame) -> pd.Series:
    """Which rows of a leaderboard hold a run with untrustworthy timings."""
    if TIMING not in table.columns:
        return pd.Series(False, index=table.index)
    return table[TIMING].astype(str).str.startswith(TIMING_UNTRUSTED)


def stall_footnotes(table: pd.DataFrame) -> list[str]:
    """One line per configuration of a leaderboard that keeps stalled questions, naming each; empty when none."""
    if STALL_NOTES not in table.columns:
        return []
    stalled = table[table[STALLED_COUNT] > 0]
    if stalled.empty:
        return []
    lines = ["stalled: questions whose stalled steps lost more than run.stall_share of the method's or AR's time "
             "(docs/measurement.md); kept in the numbers above, flagged; --leave-out-stalled leaves them out:"]
    for (model, label), notes in stalled[STALL_NOTES].items():
        lines.append(f"{model} {label}: {notes}")
    return lines


def timing_footnotes(table: pd.DataFrame) -> list[str]:
    """One line per configuration of a leaderboard with runs timed on a busy machine, naming those runs and their
    warnings; empty when there are none."""
    flagged = table[_flagged(table)]
    if flagged.empty:
        return []
    lines = [f"{TIMING_UNTRUSTED} timing: runs whose summary.json flags their timings (a busy machine: other "
             "processes on the cores, or AR passes far slower than the run's median); numbers shown as measured, "
             "not comparable with the others:"]
    for (model, label), warnings in flagged[TIMING_WARNINGS].items():
        lines.append(f"{model} {label}: {warnings}")
    return lines


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
    counts as ``exactness_cell`` writes them, and "runs". When any configuration's timings are flagged as
    untrustworthy, a "timing" column follows the label (``timing_cell``), so the flag sits beside the name."""
    tasks = list(dict.fromkeys(task for task, stat, _ in table.columns if stat in STATS))
    out = pd.DataFrame(index=table.index)
    if _flagged(table).any():
        out["timing"] = table[TIMING]
    for task in tasks:
        for stat in STATS:
            label = f"{task} {'speedup' if stat == 'speedup' else 'MAT'}"
            out[label] = [_cell(m, s, stat) for m, s in zip(table[(task, stat, "mean")], table[(task, stat, "std")])]
    out["identical"] = [exactness_cell(*values) for values in zip(*(table[(count, "", "")] for count in EXACTNESS))]
    if STALLED_COUNT in table.columns and (table[STALLED_COUNT] > 0).any():
        out["stalled"] = table[STALLED_COUNT]
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
    blocks = [notes for notes in (timing_footnotes(table), stall_footnotes(table)) if notes]
    if fmt == "md":
        header = "| " + " | ".join(shown.columns) + " |"
        rule = "|" + "|".join("---" for _ in shown.columns) + "|"
        body = ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
        footnote = [text for notes in blocks
                    for text in ("", *(f"- {line}" if index else f"**{line}**" for index, line in enumerate(notes)))]
        return "\n".join([header, rule, *body, *footnote]) + "\n"
    if fmt == "latex":
        escaped = shown.map(lambda v: str(v).replace("±", r"$\pm$").replace("_", r"\_"))
        escaped.columns = [c.replace("_", r"\_") for c in shown.columns]
        footnote = "".join(f"\\par\\noindent {_latex_text(line)}\n" for notes in blocks for line in notes)
        return escaped.to_latex(index=False, escape=False) + footnote
    raise ValueError(f"unknown format {fmt!r}: md, latex or csv")


def render_notice(line: str, fmt: str) -> str:
    """A line said under the tables (``leave_out_stalled``'s notice) in ``fmt``: as it is in Markdown, escaped as a
    paragraph of its own in LaTeX (a run's path and run.stall_share hold underscores)."""
    return f"\\par\\noindent {_latex_text(line)}\n" if fmt == "latex" else f"{line}\n"


def _latex_text(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (run paths and warnings hold _ and %)."""
    special = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
    return "".join(special.get(character, character) for character in text)
