"""How the report shows a table to a reader: names instead of code identifiers, a dash and its meaning instead of
NaN, and tables that fit the page. A table too wide for the page is split into groups of columns, each group
repeating the columns that identify a row (model, label), each under its own caption; an identifying column that
holds one value in every row is said once above the table instead. None of this knows a table's columns in advance: a
column with no reader name gets its code name in words, and every table is packed by its measured text, so
new leaderboard columns need no change here.

Widths are estimated from the characters of the cells (which stay on one line unless they are long) and of the
headers (which wrap at spaces); ``scripts/check_report_layout.py`` checks the estimate in a real browser.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass

import pandas as pd

MISSING = "–"  # what a cell without a value shows; each table's legend says what it means there
PAGE_PX = 1100  # the report's text column (STYLE's body max-width), which every table must fit
MAX_COLUMNS = 12  # at most this many columns in one table, however narrow: more is not readable at a glance
CHAR_PX = 7.6  # the widest average advance of a 13 px sans-serif cell's characters (digits, "x", "±")
CELL_PADDING_PX = 18  # 8 px padding each side and the border
WRAPPED_CELL_CHARS = 32  # a cell longer than this wraps at its spaces (run paths, sentences)

# Code names of columns and of the words in them -> what a reader is shown. A column missing here is shown
# as its code name in words (``reader_name``).
READER_NAMES = {
    "model": "model", "label": "method", "timing": "timing", "run_dir": "run", "steps": "decoding steps",
    "tokens_per_step": "tokens per step", "verified_per_step": "verified per step",
    "draft_ms": "draft ms", "verify_ms": "verify ms", "overhead_ms": "overhead ms",
    "calib_target_ms": "T target ms (calib)", "loo_target_ms": "T target ms (LOO)",
    "measured_tps": "measured tok/s", "calib_tps": "predicted tok/s (calib)", "loo_tps": "predicted tok/s (LOO)",
    "calib_dev": "deviation (calib)", "loo_dev": "deviation (LOO)", "dsd_form_tps": "DSD form tok/s",
    "loo_outside": "steps outside the LOO table", "loo_runs": "LOO runs",
    "loo_context_us": "context µs per token (LOO)",
    "reference": "T target from", "reference_target_ms": "T target ms (reference)",
    "best": "best method", "best_tps": "best tok/s", "needed_draft_ms": "draft ms to match the best",
    "needed_tokens_per_step": "tokens per step to match the best", "acceptance_factor": "acceptance factor",
    "ar_ms_per_token": "AR ms per token", "draft": "draft", "one_pass": "one pass", "extra_verify": "extra verify",
    "overhead": "overhead", "total": "total", "speedup_bound": "speedup bound",
    "needed_tokens_per_step_2x": "tokens per step for 2× speedup",
    "identical": "identical to AR", "runs": "runs", "questions": "questions",
    "git_sha": "commit", "cuda_driver": "CUDA driver", "cuda_device_count": "CUDA devices",
    "cuda_visible_devices": "CUDA_VISIBLE_DEVICES", "gpus": "GPUs", "gpus_not_used": "GPUs not used",
    "cuda": "CUDA", "python": "Python",
}
WORDS = {"mt_bench": "MT-Bench", "qa": "QA", "rag": "RAG", "math_reasoning": "math reasoning", "mat": "MAT",
         "tps": "tok/s", "vllm": "vLLM", "ar": "AR", "tpot": "TPOT", "ttft": "TTFT", "loo": "LOO", "calib": "calib",
         "dsd": "DSD", "p50": "p50", "p90": "p90", "p99": "p99",
         # LongBench's subsets by the names its paper gives them
         "gov_report": "GovReport", "qmsum": "QMSum", "multi_news": "Multi-News", "lcc": "LCC",
         "repobench-p": "RepoBench-P"}
# Abbreviations a header may use -> what the legend under its table says they mean.
ABBREVIATIONS = {
    "MAT": "mean accepted tokens per target forward pass, the bonus token included (AR = 1.00), the prefill counted",
    "AR": "autoregressive decoding, one target pass per token: the paired baseline",
    "tok/s": "tokens per second",
    "T target": "the time of one target forward pass over the step's verified tokens",
    "calib": "predicted from the run's own calibration at its start (verify_latency.json)",
    "LOO": "leave-one-out: predicted from the other runs of the same model, device, dtype, threads and software",
    "DSD": "the form of the paper \"Decoding Speculative Decoding\": tokens per step / (draft + T target), "
           "without the overhead",
    "TPOT": "time per output token", "TTFT": "time to the first token", "vLLM": "as vLLM defines it",
    "µs": "microseconds", "ms": "milliseconds",
}
CODE_IDENTIFIER = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")


def is_code_identifier(text: str) -> bool:
    """Whether ``text`` reads as a Python name (snake_case, e.g. ``loo_target_ms``) rather than words."""
    return bool(CODE_IDENTIFIER.match(str(text).strip()))


def reader_name(column) -> str:
    """The header a reader sees for a column's code name: READER_NAMES', else each word of it through WORDS,
    underscores read as spaces ("overall vllm_acceptance_rate" -> "overall vLLM acceptance rate")."""
    name = str(column)
    if name in READER_NAMES:
        return READER_NAMES[name]
    words = []
    for word in name.split(" "):
        words.append(WORDS.get(word) or WORDS.get(word.lower()) or
                     " ".join(WORDS.get(part.lower(), part) for part in word.split("_")))
    return " ".join(words)


def is_missing(value) -> bool:
    """A cell with nothing to show: None, NaN, or a dash another formatter already wrote."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip() in ("", "-", MISSING, "nan", "NaN", "None")
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def percent_text(share: float) -> str:
    """A signed deviation as percent: 0.0123 -> "+1.2%"."""
    return f"{100 * share:+.1f}%"


def share_text(share: float) -> str:
    """A share of a whole as percent: 0.25 -> "25%"."""
    return f"{100 * share:.0f}%"


PERCENT_SUFFIXES = ("_dev",)  # signed deviations, shown as +1.2%
SHARE_COLUMNS = ("loo_outside",)  # shares of steps, shown as 25%


def cell_text(value, column: str = "") -> str:
    """What a cell shows: MISSING for no value, whole numbers without decimals, deviations and shares as
    percent, other numbers with two decimals, text as it is."""
    if is_missing(value):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) or hasattr(value, "dtype"):
        number = float(value)
        if str(column).endswith(PERCENT_SUFFIXES):
            return percent_text(number)
        if column in SHARE_COLUMNS:
            return share_text(number)
        if number.is_integer() and abs(number) < 1e15 and not isinstance(value, float):
            return str(int(number))
        return f"{number:.2f}"
    return str(value)


def text_width_px(text: str, wraps: bool) -> float:
    """Estimated width of ``text`` in a table cell: its longest word when it wraps at spaces, else all of it."""
    shown = max(text.split(" "), key=len) if wraps and text else text
    return len(shown) * CHAR_PX + CELL_PADDING_PX


def column_width_px(header: str, cells: list[str]) -> float:
    """Estimated width of a column: its header wraps at spaces; a cell wraps only when longer than
    WRAPPED_CELL_CHARS (a sentence, a path), else it stays on one line."""
    widths = [text_width_px(header, wraps=True)]
    widths += [text_width_px(cell, wraps=len(cell) > WRAPPED_CELL_CHARS) for cell in cells]
    return max(widths)


def column_groups(widths: dict[str, float], id_columns: list[str], families: list[list[str]],
                  page_px: float = PAGE_PX, max_columns: int = MAX_COLUMNS) -> list[list[str]]:
    """The other columns packed in order into groups that fit ``page_px`` and ``max_columns`` beside
    ``id_columns`` (which every group repeats). A family (the columns of one task, say) stays in one group
    unless it alone does not fit, when it is split like any run of columns.

    >>> column_groups({"id": 100, "a": 400, "b": 400, "c": 400}, ["id"], [["a", "b"], ["c"]], page_px=1000)
    [['a', 'b'], ['c']]
    """
    room_px = page_px - sum(widths[column] for column in id_columns)
    room_columns = max(1, max_columns - len(id_columns))
    groups: list[list[str]] = []
    current: list[str] = []
    for family in families:
        if current and not _fits(current + family, widths, room_px, room_columns):
            groups.append(current)
            current = []
        for column in family:
            if current and not _fits(current + [column], widths, room_px, room_columns):
                groups.append(current)
                current = []
            current.append(column)
    return groups + ([current] if current else [])


def _fits(columns: list[str], widths: dict[str, float], room_px: float, room_columns: int) -> bool:
    return len(columns) <= room_columns and sum(widths[column] for column in columns) <= room_px


def legend_lines(headers: list[str], missing_meanings: list[str]) -> list[str]:
    """The legend under a table: each abbreviation its headers use, then what a dash means in it."""
    text = " ".join(headers)
    lines = [f"{short}: {meaning}" for short, meaning in ABBREVIATIONS.items()
             if re.search(rf"(?<![\w/]){re.escape(short)}(?![\w/])", text)]
    return lines + [f"{MISSING}: {meaning}" for meaning in dict.fromkeys(missing_meanings)]


@dataclass(frozen=True)
class TableLayout:
    """How one table is shown: ``id_columns`` repeated in every group of columns (said once above the table
    when they hold one value), ``families`` (runs of columns kept in one group), ``missing`` (a column, or the
    start of column names, -> what a dash means there; ``missing_default`` elsewhere) and ``headers`` (a column
    -> its header, where the caption names what its columns share)."""

    id_columns: tuple[str, ...] = ("model", "label", "timing")
    families: tuple[tuple[str, ...], ...] = ()
    missing: tuple[tuple[str, str], ...] = ()
    missing_default: str = "not measured"
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, column) -> str:
        return dict(self.headers).get(column) or reader_name(column)

    def missing_meaning(self, column) -> str:
        return next((meaning for start, meaning in self.missing if str(column).startswith(start)),
                    self.missing_default)


def constant_columns(frame: pd.DataFrame, candidates) -> dict[str, str]:
    """Of ``candidates`` (identifying columns), those with one shown value in every row of a table of more than
    one row: said once above the table rather than repeated in every row."""
    if len(frame) < 2:
        return {}
    shown = {}
    for column in candidates:
        if column in frame.columns:
            values = {cell_text(value, column) for value in frame[column]}
            if len(values) == 1:
                shown[column] = values.pop()
    return shown


def render_table(frame: pd.DataFrame, caption: str, layout: TableLayout | None = None) -> str:
    """HTML of ``frame`` (one row per shown row, columns by code name) that fits the page: the identifying
    columns that hold one value said above it, the other columns in groups (``column_groups``), each its own
    table under ``caption`` (with "part i of n" when split) and a legend of its abbreviations and dashes."""
    layout = layout or TableLayout()
    if frame.empty:
        return f"<p class='note'>{html.escape(caption)}: no rows.</p>"
    frame = frame.reset_index(drop=True)
    said = constant_columns(frame, layout.id_columns)
    ids = [column for column in layout.id_columns if column in frame.columns and column not in said]
    others = [column for column in frame.columns if column not in ids and column not in said]
    cells = {column: [cell_text(value, column) for value in frame[column]] for column in frame.columns}
    widths = {column: column_width_px(layout.header(column), cells[column]) for column in frame.columns}
    families = [[column for column in family if column in others] for family in layout.families]
    grouped = {column for family in families for column in family}
    families = [family for family in families if family] + [[column] for column in others if column not in grouped]
    families.sort(key=lambda family: others.index(family[0]))
    groups = column_groups(widths, ids, families) if others else [[]]
    parts = []
    if said:
        parts.append("<p class='note'>" + "; ".join(f"{html.escape(layout.header(column))}: "
                                                     f"<b>{html.escape(value)}</b>" for column, value in said.items())
                     + (" (every row)" if len(frame) > 1 else "") + ".</p>")
    for number, group in enumerate(groups, start=1):
        title = caption if len(groups) == 1 else f"{caption} (part {number} of {len(groups)})"
        parts.append(_table(ids + group, cells, title, layout))
    return "".join(parts)


def _table(columns: list[str], cells: dict[str, list[str]], caption: str, layout: TableLayout) -> str:
    headers = [layout.header(column) for column in columns]
    numeric = [is_numeric_column(cells[column]) for column in columns]
    rows = len(cells[columns[0]]) if columns else 0
    body = []
    for row in range(rows):
        body.append("<tr>" + "".join(_cell(cells[column][row], right) for column, right in zip(columns, numeric))
                    + "</tr>")
    missing = [layout.missing_meaning(column) for column in columns
               if any(cell == MISSING for cell in cells[column])]
    legend = legend_lines(headers, missing)
    return (f"<table><caption>{html.escape(caption)}</caption><thead><tr>"
            + "".join(f"<th{' class=num' if right else ''}>{html.escape(header)}</th>"
                      for header, right in zip(headers, numeric))
            + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>"
            + (f"<p class='legend'>{'<br>'.join(html.escape(line) for line in legend)}</p>" if legend else ""))


# A number as cell_text writes it ("1.50x ± 0.04", "+5.2%", "24"), not a version ("3.11.7")
NUMBER_TEXT = re.compile(r"^[+-]?\d[\d,]*(\.\d+)?(x|%)?( ± \d+(\.\d+)?)?$")


def is_numeric_column(cells: list[str]) -> bool:
    """Whether a column reads as numbers (aligned right): most of its cells with a value are numbers (a needed
    draft time column may say "cannot" in some rows)."""
    shown = [cell for cell in cells if cell != MISSING]
    return bool(shown) and 2 * sum(bool(NUMBER_TEXT.match(cell)) for cell in shown) >= len(shown)


def _cell(text: str, right: bool) -> str:
    """A cell, aligned right in a column of numbers; text longer than WRAPPED_CELL_CHARS may wrap."""
    if len(text) > WRAPPED_CELL_CHARS:
        return f"<td class='prose'>{html.escape(text)}</td>"
    return f"<td{' class=num' if right else ''}>{html.escape(text)}</td>"


def split_by_part(frame: pd.DataFrame, keys, id_columns) -> tuple[list[tuple[str, pd.DataFrame]], pd.DataFrame]:
    """A table whose columns are named "<key> <part>" (a task and a statistic: "qa speedup") as one table per
    part, its columns the keys: [(part, frame of id_columns + one column per key)], and the frame of the
    columns that are neither (overall counts), with the id columns. Keys keep their order in ``keys``.

    >>> tables, rest = split_by_part(pd.DataFrame({"label": ["a"], "qa speedup": ["2x"], "qa MAT": ["3"],
    ...                                            "runs": [1]}), ["qa"], ["label"])
    >>> [(part, list(table.columns)) for part, table in tables], list(rest.columns)
    ([('speedup', ['label', 'qa']), ('MAT', ['label', 'qa'])], ['label', 'runs'])
    """
    ids = [column for column in id_columns if column in frame.columns]
    parts: dict[str, dict[str, str]] = {}
    rest = []
    for column in frame.columns:
        if column in ids:
            continue
        key, _, part = str(column).partition(" ")
        if key in keys and part:
            parts.setdefault(part, {})[key] = column
        else:
            rest.append(column)
    tables = []
    for part, by_key in parts.items():
        ordered = [key for key in keys if key in by_key]
        tables.append((part, frame[ids + [by_key[key] for key in ordered]].set_axis(ids + ordered, axis=1)))
    return tables, frame[ids + rest]


def environment_rows(environments: dict[str, dict], shown_keys, optional_keys) -> tuple[dict, pd.DataFrame]:
    """From each run's recorded environment (a run's name -> summary.json's ``environment``; {} when not
    recorded): the fields every run shares (field -> value), and one row per distinct environment with the
    fields that differ and the runs that have it (column "runs"). ``shown_keys`` are always shown, in order;
    ``optional_keys`` and any other recorded key only when some run records a value."""
    recorded = [key for environment in environments.values() for key in environment]
    keys = list(shown_keys) + [key for key in dict.fromkeys([*optional_keys, *recorded]) if key not in shown_keys
                               and any(not is_missing(_text(env.get(key))) for env in environments.values())]
    values = {run: {key: _text(environment.get(key)) for key in keys} for run, environment in environments.items()}
    shared = {key: next(iter(values.values()))[key] for key in keys
              if len({run_values[key] for run_values in values.values()}) == 1} if values else {}
    differing = [key for key in keys if key not in shared]
    rows: dict[tuple, list[str]] = {}
    for run, run_values in values.items():
        rows.setdefault(tuple(run_values[key] for key in differing), []).append(run)
    table = pd.DataFrame([{**dict(zip(differing, key)), "runs": ", ".join(runs)} for key, runs in rows.items()],
                         columns=[*differing, "runs"]) if differing else pd.DataFrame()
    return shared, table


def _text(value) -> str:
    """An environment value as text (a list of GPUs joined by "; "); MISSING for none."""
    if isinstance(value, (list, dict)) and not value:
        return MISSING
    if not isinstance(value, (list, dict)) and is_missing(value):
        return MISSING
    if isinstance(value, list):
        return "; ".join(_text(item) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{key} {_text(item)}" for key, item in value.items())
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value)
