"""Measured against published: specbench's MAT and speedup beside the published tables' numbers, per method
(specbench drafter) and task, with the ratios measured / published and the settings that differ.

    from analysis.compare import compare_table, compare_text, mat_figure
    table = compare_table(questions, select_published("spec-bench"))
    print(compare_text(table, questions, published))

The measured numbers are the leaderboard's (``analysis.tables.leaderboard``: ``specbench.metrics``' speedup and
MAT, averaged over repeats), never recomputed here. A measured configuration is set beside every published
table that has a number for its drafter; when some of those tables are of the run's own model, only those.

MAT counts tokens per target pass and depends on the model, the drafter and the questions, not on the machine:
it is the figure that should agree across hardware. A speedup is a ratio of two timings on one machine and
moves with the machine's balance of compute and memory bandwidth: it compares only on like hardware, so each
row says whether the hardware is the published table's.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.figures import method_style
from analysis.runs import run_settings
from analysis.tables import leaderboard
from specbench.data import TASKS
from specbench.errors import SpecbenchError
from specbench.records import read_json_file

AGREEMENT = ("MAT (mean accepted tokens per target pass, bonus token included) depends on the model, drafter and "
             "questions, not the machine: it is the figure that should agree across hardware. Speedups compare "
             "only on like hardware: rows with hw DIFF (or ?) ran on other (or unknown) hardware than the "
             "published table.")
SPEC_BENCH_PER_TASK = 80  # Spec-Bench's question.jsonl: 80 questions in each of its six tasks, 480 in all
WIDTH = 120  # the printed table and its notes fit a terminal this wide
TABLE_COLUMNS = ["label", "drafter", "model", "task", "table", "source", "reference", "method", "published_model",
                 "published_hardware", "measured_hardware", "mat", "mat_published", "mat_ratio", "speedup",
                 "speedup_published", "speedup_ratio", "same_hardware", "differs"]


def run_conditions(run_dir) -> dict:
    """The settings a published table is compared on, as one run recorded them: hardware (its device's name),
    dtype, temperature (0 when not recorded: greedy, the default, as run labels read it) and question_file
    (None: the built-in sample set); all None for what records no settings (a Spec-Bench model_answer file, a
    run without run.json)."""
    path = Path(run_dir)
    conditions = {"hardware": None, "dtype": None, "temperature": None, "question_file": None}
    if not path.is_dir() or not (path / "run.json").is_file():
        return conditions
    settings = run_settings(path)
    environment = settings.get("environment")
    if not isinstance(environment, dict):  # schema 2 kept the device's name in summary.json
        environment = read_json_file(path / "summary.json", "run's summary").get("environment") or {}
    return {"hardware": environment.get("device"), "dtype": settings.get("dtype"),
            "temperature": settings.get("temperature") or 0.0, "question_file": settings.get("question_file")}


def measured_stats(questions: pd.DataFrame) -> pd.DataFrame:
    """One row per measured configuration (model, label) and task (and overall): drafter, questions (all tasks,
    of one run), mat and speedup (the leaderboard's means over repeats), and the first run's conditions."""
    table = leaderboard(questions)
    rows = []
    for (model, label), part in questions.groupby(["model", "label"], sort=False):
        first_run = part[part.run_dir == part.run_dir.iloc[0]]
        conditions = run_conditions(first_run.run_dir.iloc[0])
        counts = first_run.groupby("task").question_id.nunique()
        for task in [task for task in (*TASKS, "overall") if task in counts.index or task == "overall"]:
            rows.append({"model": model, "label": label, "drafter": part.drafter.iloc[0], "task": task,
                         "questions": int(counts.sum()),
                         "mat": table.loc[(model, label), (task, "mat", "mean")],
                         "speedup": table.loc[(model, label), (task, "speedup", "mean")], **conditions})
    return pd.DataFrame(rows)


def same_hardware(measured_device, hardware_match: str) -> bool | None:
    """Whether a run's device name (``cuda: NVIDIA A100-SXM4-80GB``) is the published chip: it contains the
    published row's hardware_match text; None when either is unknown."""
    if not measured_device or not hardware_match:
        return None
    return hardware_match.lower() in str(measured_device).lower()


def _question_set(measured) -> str:
    source = measured.question_file or "the built-in sample set"
    return f"{source}, {measured.questions} question{'' if measured.questions == 1 else 's'}"


def _full_question_set(measured) -> bool:
    """Spec-Bench's whole question file: a question file given (not the sample set) and all its 480 questions."""
    return bool(measured.question_file) and measured.questions == SPEC_BENCH_PER_TASK * len(TASKS)


def differing_settings(measured, published) -> list[str]:
    """What differs between a measured configuration's row (a row of ``measured_stats``) and a published row (of
    ``_published_rows``), both as ``itertuples`` gives them, in words;
    a setting the published table does not state counts as differing ("not stated"), as nothing says it agrees."""
    found = []

    def differs(name, mine, theirs):
        if theirs in ("", None):
            found.append(f"{name}: measured {mine if mine not in ('', None) else 'unknown'}, not stated by the "
                         "published table")
        elif mine != theirs:
            found.append(f"{name}: measured {mine if mine not in ('', None) else 'unknown'} vs published {theirs}")

    differs("model", measured.model, published.model)
    if same_hardware(measured.hardware, published.hardware_match) is not True:
        differs("hardware", measured.hardware or "unknown", published.hardware or None)
    differs("dtype", measured.dtype, published.dtype)
    theirs = float(published.temperature) if published.temperature not in ("", None) else None
    differs("temperature", None if measured.temperature is None else f"{float(measured.temperature):g}",
            None if theirs is None else f"{theirs:g}")
    if not _full_question_set(measured):
        theirs = published.question_set or "unknown"
        found.append(f"questions: measured {_question_set(measured)} vs published {theirs}")
    if measured.label != measured.drafter:
        found.append(f"method: measured as {measured.label!r}, {measured.drafter} with settings of its own")
    if published.note:
        found.append(f"published note: {published.note}")
    return found


def _ratio(measured, published) -> float:
    return measured / published if published and not pd.isna(measured) else np.nan


def _published_rows(published: pd.DataFrame) -> pd.DataFrame:
    """One row per published table, method and task: speedup and mat (NaN where that table has none), with the
    table's settings."""
    keys = ["source", "reference", "method", "drafter", "task"]
    settings = ["hardware", "hardware_match", "model", "dtype", "temperature", "question_set", "note"]
    values = published.pivot_table(index=keys, columns="metric", values="value", aggfunc="first")
    values = values.reindex(columns=["speedup", "mat"])
    firsts = published.groupby(keys)[settings].first()
    return values.join(firsts).reset_index()


def compare_table(questions: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Measured beside published: one row per measured configuration, task and published table that has a
    number for its drafter and task (TABLE_COLUMNS). Only the tables of the run's own model are used when there
    are any (otherwise all, the model listed as differing); ratios are measured / published; same_hardware is
    True, False or None (unknown); differs lists, "; "-joined, the settings that differ (``differing_settings``).
    ``table`` numbers the published tables (T1, T2, ...) in the order of ``published``."""
    measured = measured_stats(questions)
    if not (published.drafter != "").any():  # nothing published that specbench can run
        return pd.DataFrame(columns=TABLE_COLUMNS)
    rows = _published_rows(published[published.drafter != ""])
    numbers = {reference: f"T{index}" for index, reference in enumerate(dict.fromkeys(published.reference), 1)}
    out = []
    for mine in measured.itertuples(index=False):
        candidates = rows[(rows.drafter == mine.drafter) & (rows.task == mine.task)]
        if (candidates.model == mine.model).any():
            candidates = candidates[candidates.model == mine.model]
        for theirs in candidates.itertuples(index=False):
            out.append({
                "label": mine.label, "drafter": mine.drafter, "model": mine.model, "task": mine.task,
                "table": numbers[theirs.reference], "source": theirs.source, "reference": theirs.reference,
                "method": theirs.method, "published_model": theirs.model, "published_hardware": theirs.hardware,
                "measured_hardware": mine.hardware, "mat": mine.mat, "mat_published": theirs.mat,
                "mat_ratio": _ratio(mine.mat, theirs.mat), "speedup": mine.speedup,
                "speedup_published": theirs.speedup, "speedup_ratio": _ratio(mine.speedup, theirs.speedup),
                "same_hardware": same_hardware(mine.hardware, theirs.hardware_match),
                "differs": "; ".join(differing_settings(mine, theirs))})
    table = pd.DataFrame(out, columns=TABLE_COLUMNS)
    # Each measured method's rows grouped by published table, its tasks in Spec-Bench's order: one block per table.
    order = {"label": {label: index for index, label in enumerate(dict.fromkeys(measured.label))},
             "table": {number: int(number[1:]) for number in numbers.values()},
             "method": {method: index for index, method in enumerate(dict.fromkeys(published.method))},
             "task": {task: index for index, task in enumerate((*TASKS, "overall"))}}
    keys = pd.DataFrame({column: table[column].map(ranks) for column, ranks in order.items()})
    return table.loc[keys.sort_values(list(order), kind="stable").index].reset_index(drop=True)


def _aligned(shown: pd.DataFrame, left: tuple[str, ...]) -> list[str]:
    """``shown`` (strings) as fixed-width lines: the ``left`` columns left-aligned, the numbers right-aligned."""
    widths = {column: max(len(column), *(len(value) for value in shown[column])) for column in shown.columns}

    def line(values) -> str:
        return "  ".join(value.ljust(widths[column]) if column in left else value.rjust(widths[column])
                         for column, value in zip(shown.columns, values)).rstrip()

    return [line(shown.columns), *(line(row) for row in shown.itertuples(index=False))]


def unmatched(questions: pd.DataFrame, published: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """(measured drafters no published row names, drafters published but not measured, published methods that
    have no specbench drafter), each sorted."""
    measured = set(questions.drafter)
    named = set(published.drafter) - {""}
    return (sorted(measured - named), sorted(named - measured),
            sorted(set(published[published.drafter == ""].method)))


def _wrap(text: str, width: int, **options) -> list[str]:
    """``text`` in lines of at most ``width``, broken at spaces only (never inside built-in or A100-SXM4)."""
    return textwrap.wrap(text, width, break_on_hyphens=False, **options)


def number_text(value, suffix: str = "") -> str:
    """A number as compare shows it, printed and in the report: two decimals and ``suffix``, "-" for none."""
    return "-" if pd.isna(value) else f"{value:.2f}{suffix}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def _hardware_flag(same) -> str:
    return "?" if same is None or (not isinstance(same, bool) and pd.isna(same)) else ("same" if same else "DIFF")


def compare_text(table: pd.DataFrame, questions: pd.DataFrame, published: pd.DataFrame) -> str:
    """The comparison as printed: the sentence on MAT and hardware, the table (no wider than WIDTH), the published
    tables it refers to (T1, ...), the numbered notes of differing settings, and one line each for methods
    measured but not published and published but not measured."""
    notes = {text: f"[{index}]" for index, text in enumerate(dict.fromkeys(table.differs), 1) if text}
    shown = pd.DataFrame({
        "method": [_cut(label, 18) for label in table.label], "task": list(table.task),
        "published": [_cut(f"{number} {method}", 24) for number, method in zip(table.table, table.method)],
        "MAT": table.mat.map(number_text), "pub MAT": table.mat_published.map(number_text),
        "ratio": table.mat_ratio.map(number_text), "speedup": table.speedup.map(lambda v: number_text(v, "x")),
        "pub speedup": table.speedup_published.map(lambda v: number_text(v, "x")),
        "ratio ": table.speedup_ratio.map(number_text), "hw": table.same_hardware.map(_hardware_flag),
        "notes": table.differs.map(lambda text: notes.get(text, ""))}).astype(str)
    lines = [*_wrap(AGREEMENT, WIDTH), ""]
    lines += (_aligned(shown, ("method", "task", "published", "hw", "notes")) if len(shown)
              else ["(no published number for any measured method)"])
    used = sorted(dict.fromkeys(table.table), key=lambda number: int(number[1:]))
    references = published.drop_duplicates("reference").set_index("reference")
    tables = {number: reference for reference, number in zip(table.reference, table.table)}
    if used:
        lines += ["", "published tables:"]
        for number in used:
            row = references.loc[tables[number]]
            where = ", ".join(filter(None, [row["hardware"], row["model"], row["dtype"],
                                            f"T={row['temperature']}" if row["temperature"] else ""]))
            lines += _wrap(f"{number} = {row['source']}: {tables[number]} ({where or 'settings not stated'})", WIDTH,
                                   subsequent_indent="    ")
    if notes:
        lines += ["", "settings that differ (measured vs published):"]
        for text, mark in notes.items():
            lines += _wrap(f"{mark} {text}", WIDTH, subsequent_indent="    ")
    measured_only, published_only, no_drafter = unmatched(questions, published)
    lines += [""]
    lines += _wrap("measured, not published in this selection: " + (", ".join(measured_only) or "none"), WIDTH)
    lines += _wrap("published, not measured: " + (", ".join(published_only) or "none")
                           + ("; published with no specbench drafter: " + ", ".join(no_drafter) if no_drafter else ""),
                           WIDTH)
    return "\n".join(lines)


def mat_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a comparison that have both a measured and a published MAT."""
    return table[table.mat.notna() & table.mat_published.notna()]


def mat_figure(table: pd.DataFrame, path) -> Path:
    """A PNG at ``path``: measured MAT against published MAT, one point per method and published table (marked
    with the table's number, T1, ...), one colour per measured method, and the line y = x where they agree. A
    one-line SpecbenchError when no row has both numbers."""
    pairs = mat_pairs(table)
    if pairs.empty:
        raise SpecbenchError("no measured method has a published MAT in this selection: no MAT figure to draw")
    path = Path(path)
    figure, ax = plt.subplots(figsize=(6, 5))
    labels = list(dict.fromkeys(pairs.label))
    for label in labels:
        part = pairs[pairs.label == label]
        color, _ = method_style(label, labels)
        ax.scatter(part.mat_published, part.mat, color=color, label=label, s=30,
                   marker="^" if "+" in label else "o")  # a tuned variant is never mistaken for the original
        for row in part.itertuples(index=False):  # which published table each point is set against
            ax.annotate(row.table, (row.mat_published, row.mat), xytext=(3, 3), textcoords="offset points",
                        fontsize=6)
    low = 0.9 * min(pairs.mat.min(), pairs.mat_published.min(), 1.0)
    high = 1.05 * max(pairs.mat.max(), pairs.mat_published.max())
    ax.plot([low, high], [low, high], color="black", linewidth=0.8, linestyle="--", label="measured = published")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("published MAT")
    ax.set_ylabel("measured MAT")
    ax.set_title("Mean accepted tokens: measured vs published")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=150, bbox_inches="tight", format="png")
    plt.close(figure)
    return path
