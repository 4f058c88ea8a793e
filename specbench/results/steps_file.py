"""steps.parquet: one row per decoding step of the method (columns: ``schema.STEP_COLUMNS``), written whole
after each question and read back with its rows checked (``StepRows``).

A step's seconds (``schema.TIMING_FIELDS``) may be null: an engine that runs its own loop reports what each step
accepted but not how long its phases took. They are stored as nullable float columns and read back as NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specbench.errors import SpecbenchError
from specbench.results.left_out import SHOWN_PROBLEMS, numbers_text
from specbench.results.question_keys import question_id_of_key, question_id_problem, question_key, shown
from specbench.results.schema import STEP_COLUMNS, TIMING_FIELDS
from specbench.results.validation import is_count

# steps.parquet's question_id column holds the ids themselves when they are all 64-bit integers or all strings,
# as every schema has written them; otherwise (1 and "q2" in one run, an integer beyond int64, which one
# Arrow column cannot hold) it holds their question_key JSON text, and this key of the file's metadata says so.
ID_FORM_KEY, JSON_IDS = b"specbench.question_id", b"json"
INT64 = np.iinfo(np.int64)


def _fits_int64(value) -> bool:
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and INT64.min <= int(value) <= INT64.max)


def write_steps_file(frame: pd.DataFrame, path: Path) -> None:
    """Write step rows (STEP_COLUMNS) to the parquet file ``path``, ids as the module's comment above says."""
    ids = frame["question_id"].tolist()
    native = all(map(_fits_int64, ids)) or all(isinstance(question, str) for question in ids)
    if not native:
        frame = frame.assign(question_id=[question_key(question) for question in ids])
    table = _timings_as_floats(pa.Table.from_pandas(frame, preserve_index=False))
    if not native:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), ID_FORM_KEY: JSON_IDS})
    pq.write_table(table, path)


def _timings_as_floats(table: pa.Table) -> pa.Table:
    """``table`` with each seconds column typed float64: a column that holds no timing at all (every step of an
    engine without per-step times) would otherwise be written as Arrow's null type, not as a float column of
    nulls; a column that holds floats is left as it is."""
    for name in TIMING_FIELDS:
        index = table.schema.get_field_index(name)
        if index >= 0 and pa.types.is_null(table.schema.field(index).type):
            table = table.set_column(index, name, table.column(index).cast(pa.float64()))
    return table


def read_steps_file(path: Path) -> pd.DataFrame:
    """steps.parquet with the question ids as the question file has them (``write_steps_file``), or an empty
    table when there is none. It is replaced atomically, so one that cannot be read or lacks a column was
    damaged from outside: a SpecbenchError naming it (the caller says what follows)."""
    if not path.is_file():
        return pd.DataFrame(columns=STEP_COLUMNS)
    try:
        table = pq.read_table(path)
        frame = table.to_pandas()
    except Exception as error:  # pyarrow raises several kinds for a cut or foreign file
        if isinstance(error, OSError) and error.errno is not None:
            raise SpecbenchError(f"{path}: cannot be read ({error.strerror or error})") from None
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SpecbenchError(f"{path} is damaged ({reason})") from None
    missing = [column for column in STEP_COLUMNS if column not in frame]
    if missing:
        raise SpecbenchError(f"{path} lacks the columns {', '.join(missing)}")
    if (table.schema.metadata or {}).get(ID_FORM_KEY) == JSON_IDS:
        frame["question_id"] = pd.Series([question_id_of_key(text) for text in frame["question_id"]],
                                         index=frame.index, dtype=object)
    return frame


@dataclass
class StepRows:
    """What ``read_run_results`` kept of steps.parquet: the rows, each one's question key, and (row, why) of the
    rows left out (1-based, in file order)."""

    path: Path
    frame: pd.DataFrame
    keys: list[str]
    left_out: list[tuple[int, str]] = field(default_factory=list)

    def keep_only(self, keys: set[str], why) -> None:
        mask = [key in keys for key in self.keys]
        rows = self.frame["_row"].tolist()
        self.left_out += [(row, why(key)) for row, key, kept in zip(rows, self.keys, mask) if not kept]
        self.frame = self.frame[np.array(mask, dtype=bool)]
        self.keys = [key for key, kept in zip(self.keys, mask) if kept]

    def warning(self) -> str | None:
        if not self.left_out:
            return None
        by_why: dict[str, list[int]] = {}
        for row, why in sorted(self.left_out):
            by_why.setdefault(why, []).append(row)
        parts = [f"rows {numbers_text(rows)} {why}" for why, rows in by_why.items()]
        listed = parts[:SHOWN_PROBLEMS]
        if len(parts) > SHOWN_PROBLEMS:
            listed.append(f"and {len(parts) - SHOWN_PROBLEMS} more")
        return f"{self.path}: {'; '.join(listed)} ({len(self.left_out)} row(s) left out, not counted)"


def checked_step_rows(path: Path, frame: pd.DataFrame, wanted: set[str] | None) -> StepRows:
    """The rows of a steps table with a well-formed question id, turn and step, of a question in ``wanted``
    (when known), each (question, turn, step) once: the first is kept, as for the lines of the answer files."""
    frame = frame.assign(_row=range(1, len(frame) + 1))
    keys, mask, left_out, seen = [], [], [], set()
    for row, question, turn, step in zip(frame["_row"], frame["question_id"], frame["turn"], frame["step"]):
        problem = question_id_problem(question)
        key = None if problem else question_key(question)
        if problem is None and not (is_count(turn) and is_count(step)):
            problem = f"of question {shown(question)} have a turn or step that is not a count"
        elif problem is None and wanted is not None and key not in wanted:
            problem = f"are of question {shown(question)}, not one of this run's questions"
        elif problem is None and (key, int(turn), int(step)) in seen:
            problem = f"repeat steps of question {shown(question)} (the first are kept)"
        if problem is None:
            seen.add((key, int(turn), int(step)))
            keys.append(key)
        else:
            left_out.append((row, problem))
        mask.append(problem is None)
    return StepRows(path, frame[np.array(mask, dtype=bool)], keys, left_out)
