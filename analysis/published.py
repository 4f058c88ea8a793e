"""Published speedups and mean accepted tokens (MAT), as data: ``specbench/data/published_results.csv`` (or a
user's CSV of the same columns), one number per row, loaded and checked.

    from analysis.published import select_published
    published = select_published("spec-bench")   # a source id, "all", or the path of a CSV file

Each row is one number of one published table: its ``source`` (a short id) and ``reference`` (the file and
table, or the paper and table, it was read from), the setting it was measured in (``hardware``,
``hardware_match``: the text that names that chip in torch's device name, ``model`` under specbench's model
name, ``dtype``, ``temperature``, ``question_set``), the ``method`` as published and the specbench ``drafter`` it
corresponds to (empty where specbench has none), the specbench ``task`` (or ``overall``), the ``metric``
(speedup or mat) and its ``value``, a ``note``, and ``drafter_settings``: the drafter configuration the published
row ran, in specbench's drafter keys (``auxiliary=eagle2; corpus=null``; a key without a value: the source
does not say), which ``analysis.compare`` pairs and footnotes runs by. Lines starting with ``#`` are comments; a
byte-order mark is ignored. A row without a source or reference, with a metric or task this code does not
know, a value that is not a positive number, a temperature that is not a number, a drafter_settings entry that
is not key=value, or a second value for a cell another row already gave (same source, table, setting, method,
task and metric) stops the load with one line naming the file, the line and the bad value.
"""

from __future__ import annotations

import csv
import math
from importlib import resources
from pathlib import Path

import pandas as pd

from specbench.questions import ALL_TASKS
from specbench.errors import SpecbenchError

COLUMNS = ("source", "reference", "hardware", "hardware_match", "model", "dtype", "temperature", "question_set",
           "method", "drafter", "task", "metric", "value", "note", "drafter_settings")
REQUIRED = ("source", "reference", "method", "task", "metric", "value")  # the columns a row cannot leave empty
# What makes two rows one cell: a file giving two values for it would otherwise keep one of them silently.
CELL = ("source", "reference", "hardware", "hardware_match", "model", "dtype", "temperature", "question_set", "method",
        "drafter_settings", "task", "metric")
METRICS = ("speedup", "mat")
PUBLISHED_TASKS = (*ALL_TASKS, "overall")
# The sources the packaged file draws on; hd and dsd were searched for and not found (published_results.md),
# so they are valid ids that select no rows, which is said, not silently an empty comparison.
SOURCES = ("spec-bench", "hd", "recycling", "samd", "dsd", "self-spec", "swift", "gsd", "hsddw", "longspec")
ALL = "all"


def packaged_file() -> Path:
    """The published results that ship with specbench."""
    return Path(str(resources.files("specbench") / "data" / "published_results.csv"))


def _data_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the file's lines that are not comments or blank: line numbers stay the file's own,
    so an error can point at the line a reader opens."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's BOM would become part of "source"
    except OSError as error:
        raise SpecbenchError(f"published results {path}: cannot be read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise SpecbenchError(f"published results {path}: not UTF-8 text; give a CSV file") from None
    return [(number, line) for number, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.lstrip().startswith("#")]


def _checked_row(cells: dict, path: Path, number: int) -> dict:
    """One row with its value as a float, or a one-line SpecbenchError naming the file, line and bad value."""
    where = f"{path} line {number}"
    for column in REQUIRED:
        if not cells.get(column, "").strip():
            raise SpecbenchError(f"{where}: no {column}; every row needs {', '.join(REQUIRED)}")
    if cells["metric"] not in METRICS:
        raise SpecbenchError(f"{where}: metric {cells['metric']!r} is not one of {', '.join(METRICS)}")
    if cells["task"] not in PUBLISHED_TASKS:
        raise SpecbenchError(f"{where}: task {cells['task']!r} is not one of {', '.join(PUBLISHED_TASKS)}")
    try:
        value = float(cells["value"])
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecbenchError(f"{where}: value {cells['value']!r} is not a positive number")
    temperature = cells.get("temperature", "").strip()
    if temperature:
        try:
            number = float(temperature)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < 0:
            raise SpecbenchError(f"{where}: temperature {temperature!r} is not a number >= 0 (0 for greedy "
                                 "decoding; empty when the source does not say)")
    row = {**{column: cells.get(column, "").strip() for column in COLUMNS}, "value": value}
    if temperature:
        row["temperature"] = f"{number:g}"  # "0.0" and "0" are one setting, so one cell
    row["drafter_settings"] = settings_text(parse_settings(row["drafter_settings"], where))
    return row


def parse_settings(text: str, where: str = "drafter_settings") -> dict[str, str]:
    """A ``drafter_settings`` cell as {key: value}: "; "-separated key=value entries, in specbench's drafter keys
    (conf/drafter/); an empty value means the source does not state that setting. A one-line SpecbenchError
    for an entry without "=" or a key given twice.

    >>> parse_settings("auxiliary=eagle2; corpus=null; n_predicts=")
    {'auxiliary': 'eagle2', 'corpus': 'null', 'n_predicts': ''}
    """
    found: dict[str, str] = {}
    for entry in (part.strip() for part in text.split(";")):
        if not entry:
            continue
        key, equals, value = (piece.strip() for piece in entry.partition("="))
        if not equals or not key:
            raise SpecbenchError(f"{where}: drafter_settings entry {entry!r} is not key=value (e.g. "
                                 "auxiliary=eagle2; corpus=null)")
        if key in found:
            raise SpecbenchError(f"{where}: drafter_settings names {key!r} twice")
        found[key] = value
    return found


def settings_text(settings: dict[str, str]) -> str:
    """``parse_settings``' inverse, one spelling per configuration (so rows of one configuration group)."""
    return "; ".join(f"{key}={value}" for key, value in settings.items())


def load_published(path: str | Path | None = None) -> pd.DataFrame:
    """Every row of a published-results CSV (the packaged one by default), checked, as a DataFrame of COLUMNS
    with ``value`` a float."""
    path = packaged_file() if path is None else Path(path)
    lines = _data_lines(path)
    if not lines:
        raise SpecbenchError(f"published results {path}: no header and no rows; expected the columns "
                             f"{', '.join(COLUMNS)}")
    header = [cell.strip() for cell in next(csv.reader([lines[0][1]]))]
    missing = [column for column in REQUIRED if column not in header]
    if missing:
        raise SpecbenchError(f"published results {path} line {lines[0][0]}: header lacks {', '.join(missing)}; "
                             f"expected the columns {', '.join(COLUMNS)}")
    rows = []
    for (number, line), cells in zip(lines[1:], csv.reader(line for _, line in lines[1:])):
        if len(cells) != len(header):
            raise SpecbenchError(f"{path} line {number}: {len(cells)} fields where the header has {len(header)}")
        rows.append(_checked_row(dict(zip(header, cells)), path, number))
    _refuse_second_values(rows, [number for number, _ in lines[1:]], path)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _refuse_second_values(rows: list[dict], numbers: list[int], path: Path) -> None:
    """A one-line SpecbenchError naming the cell and both lines when two rows give a value for one cell (CELL):
    which one a comparison showed would be an accident of order."""
    first: dict[tuple, int] = {}
    for row, number in zip(rows, numbers):
        key = tuple(row[column] for column in CELL)
        if key in first:
            raise SpecbenchError(
                f"{path} line {number}: a second value ({row['value']:g}) for the cell of line {first[key]}: "
                f"{row['method']} {row['task']} {row['metric']} of {row['reference']} (model "
                f"{row['model'] or 'not stated'}, hardware {row['hardware'] or row['hardware_match'] or 'not stated'}"
                f"{', settings ' + row['drafter_settings'] if row['drafter_settings'] else ''}); keep one")
        first[key] = number


def select_published(choice: str, packaged: str | Path | None = None) -> pd.DataFrame:
    """The published rows ``--published choice`` names: one source's rows of the packaged file, all of them
    (``all``), or every row of a CSV file of the same columns (a path). An unknown id, or a source none of
    whose tables were found, is a one-line SpecbenchError listing the valid choices."""
    choices = f"{', '.join(SOURCES)}, {ALL}, or the path of a CSV file of the same columns"
    if choice not in (*SOURCES, ALL):
        if Path(choice).is_file():
            return load_published(choice)
        raise SpecbenchError(f"--published {choice}: not a source id nor a CSV file; choose {choices}")
    table = load_published(packaged)
    if choice == ALL:
        return table
    chosen = table[table.source == choice].reset_index(drop=True)
    if chosen.empty:
        found = ", ".join(sorted(set(table.source)))
        raise SpecbenchError(f"--published {choice}: no numbers of that source were found to transcribe "
                             f"(published_results.md says where they were looked for); choose one of {found}, "
                             f"{ALL}, or a CSV path")
    return chosen


def of_model(published: pd.DataFrame, model: str | None) -> pd.DataFrame:
    """The published rows of ``model`` (``--published-model``), or all of them when None; a model that no row of
    the selection names is a one-line SpecbenchError listing those it does name."""
    if model is None:
        return published
    chosen = published[published.model == model]
    if chosen.empty:
        named = ", ".join(sorted(set(published.model) - {""})) or "none"
        raise SpecbenchError(f"--published-model {model}: no published table of that model in this selection; "
                             f"choose one of {named}")
    return chosen.reset_index(drop=True)
