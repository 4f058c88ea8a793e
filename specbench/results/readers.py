"""Every result file of a run directory read the one way that resuming, the summary and analysis all share
(``read_run_results``): a line or step row counts only when it is a well-formed record of its file and of a
question of the run, the first one of its question, of a finished question; each file's others are named in one
warning and left out, and none of that is fatal."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.errors import SpecbenchError
from specbench.questions import HUB_PREFIX, SAMPLE_QUESTIONS, read_questions, select_questions
from specbench.results.left_out import SHOWN_PROBLEMS, numbers_text, warn_once
from specbench.results.question_keys import cut_short, question_key, shown
from specbench.results.steps_file import checked_step_rows, read_steps_file
from specbench.results.validation import (ANY_RECORD, BASELINE_ANSWER, FILE_KINDS, METHOD_ANSWER, SKIPPED_QUESTION,
                                          LineKind, record_problem)


@dataclass
class ResultLines:
    """What ``read_result_lines`` kept of one .jsonl result file: the well-formed ``records``, read from the
    1-based lines ``numbers``; and what it left out: (line, why) pairs, and ``cut``, the (line, bytes) of a
    last line without its newline. ``exists`` is False when there is no such file."""

    path: Path
    records: list[dict] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    left_out: list[tuple[int, str]] = field(default_factory=list)
    cut: tuple[int, int] | None = None
    exists: bool = True

    def keys(self) -> set[str]:
        return {question_key(record["question_id"]) for record in self.records}

    def keep_only(self, keys: set[str], why) -> None:
        """Leave out the records whose question is not in ``keys``; ``why(key)`` says why (a verb phrase)."""
        kept = [(number, record) for number, record in zip(self.numbers, self.records)
                if question_key(record["question_id"]) in keys]
        for number, record in zip(self.numbers, self.records):
            key = question_key(record["question_id"])
            if key not in keys:
                self.left_out.append((number, why(key)))
        self.numbers = [number for number, _ in kept]
        self.records = [record for _, record in kept]

    def warning(self) -> str | None:
        """The one warning naming every line left out and why; None when none was."""
        parts = [] if self.cut is None else [
            f"the last line is incomplete (line {self.cut[0]}, {self.cut[1]} bytes: a write cut short)"]
        ordered = sorted(self.left_out)
        parts += [f"line {number} {why}" for number, why in ordered[:SHOWN_PROBLEMS]]
        if len(ordered) > SHOWN_PROBLEMS:
            rest = [number for number, _ in ordered[SHOWN_PROBLEMS:]]
            parts.append(f"and {len(rest)} more (lines {numbers_text(rest)})")
        if not parts:
            return None
        count = len(ordered) + (self.cut is not None)
        return f"{self.path}: {'; '.join(parts)} ({count} line(s) left out, not counted)"


def read_result_lines(path: str | Path, kind: LineKind | None = None, question_ids=None) -> ResultLines:
    """The lines of a .jsonl result file that count, and why each of the others does not; nothing is fatal but a
    file that cannot be read at all. The file is read as bytes, so a cut inside a multi-byte UTF-8 character
    cannot break the read.

    A line counts when it is whole (ends in a newline: a write interrupted by a kill or a full disk leaves the
    last line without one), UTF-8 JSON, a well-formed record of ``kind`` (``record_problem``; default: the kind
    of the file's name in FILE_KINDS), of a question in ``question_ids`` when that is given, and not a repeat:
    the first well-formed line of a question is kept and every later one left out, since a run appends one
    line per question in the order it finishes them and a second one can only come from outside (a copy, a
    concatenation, an edit). Ids are compared by ``question_key``. Blank lines hold nothing and are passed over."""
    path = Path(path)
    kind = kind or FILE_KINDS.get(path.name, ANY_RECORD)
    lines = ResultLines(path)
    if not path.is_file():
        lines.exists = False
        return lines
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SpecbenchError(f"{path}: cannot be read ({error.strerror or error})") from None
    wanted = None if question_ids is None else {question_key(question) for question in question_ids}
    first_line: dict[str, int] = {}
    pieces = data.split(b"\n")
    if pieces[-1].strip():
        lines.cut = (len(pieces), len(pieces[-1]))
    for number, raw in enumerate(pieces[:-1], start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            lines.left_out.append((number, "is not UTF-8 text"))
            continue
        except (ValueError, RecursionError):  # JSONDecodeError, an integer past Python's 4300 digits, deep nesting
            lines.left_out.append((number, "is not valid JSON"))
            continue
        problem = record_problem(record, kind)
        if problem is None:
            key = question_key(record["question_id"])
            if wanted is not None and key not in wanted:
                problem = f"is of question {shown(record['question_id'])}, not one of this run's questions"
            elif key in first_line:
                problem = f"repeats question {shown(record['question_id'])} of line {first_line[key]} (the first is kept)"
            else:
                first_line[key] = number
        if problem:
            lines.left_out.append((number, problem))
            continue
        lines.records.append(record)
        lines.numbers.append(number)
    return lines



def read_jsonl_records(path: str | Path, kind: LineKind | str | None = None, question_ids=None) -> list[dict]:
    """The records of a .jsonl result file that count (``read_result_lines``), with one warning naming the file,
    the lines left out and why. A string ``kind`` (the label older callers passed) reads as None: the kind of
    the file's name."""
    lines = read_result_lines(path, kind if isinstance(kind, LineKind) else None, question_ids)
    warn_once(lines.warning(), [])
    return lines.records


def read_json_file(path: str | Path, what: str) -> dict:
    """A JSON object file (run.json, summary.json), with a one-line error naming the file when it is empty,
    cut short or not an object."""
    path = Path(path)
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        raise SpecbenchError(f"{path}: cannot be read ({error.strerror or error})") from None
    except Exception:  # not UTF-8, not JSON, an integer past 4300 digits, RecursionError (deep nesting), ...
        raise SpecbenchError(f"{path} is empty or damaged (not valid JSON); it is the {what}") from None
    if not isinstance(value, dict):
        raise SpecbenchError(f"{path} is damaged (not a JSON object); it is the {what}")
    return value


def run_question_ids(settings: dict) -> set | None:
    """The ids of the questions a run may answer, from its run.json (``settings``): those of its question file,
    narrowed to task.tasks and task.limit_per_task where recorded (they are not: a run directory may be extended
    to more questions). None when they cannot be known here: no task settings (schema 2, tests), a hub dataset
    (not downloaded for this), or a question file that is gone or no longer holds what the run read (its
    content_sha256 differs)."""
    from specbench.storage.manifest import file_digest

    task = settings.get("task") if isinstance(settings, dict) else None
    if not isinstance(task, dict) or not task.get("content_sha256"):
        return None
    path = task.get("path")
    if path is not None and (not isinstance(path, str) or path.startswith(HUB_PREFIX)):
        return None
    file = SAMPLE_QUESTIONS if path is None else Path(path).expanduser()
    try:
        if not file.is_file() or file_digest(file) != task["content_sha256"]:
            return None
        prompts = read_questions(path)
        if task.get("tasks") is not None:
            prompts = select_questions(prompts, list(task["tasks"]), task.get("limit_per_task"))
    except (SpecbenchError, OSError, TypeError, ValueError):
        return None
    return {prompt.question_id for prompt in prompts}


@dataclass
class RunResults:
    """What ``read_run_results`` kept of a run directory: the answer and baseline records and the step rows of
    its finished questions (``finished``: their ids), its skipped-question records, whether the answer files
    exist, and the warnings it gave. ``steps`` is None, with ``steps_problem`` saying why, when the steps
    were not required and could not be read."""

    answers: list[dict]
    baseline: list[dict]
    skipped: list[dict]
    steps: pd.DataFrame | None
    finished: set
    warnings: list[str]
    steps_problem: str | None = None
    has_answers: bool = True
    has_baseline: bool = True


def read_run_results(run_dir: str | Path, with_baseline: bool, question_ids=None,
                     steps_required: bool = True, already_warned: set[str] | None = None) -> RunResults:
    """Every result file of ``run_dir`` read the one way that resuming, the summary and analysis all share.

    A line of answers.jsonl, baseline_answers.jsonl or skipped.jsonl counts as ``read_result_lines`` says
    (well-formed, of a question in ``question_ids`` when known, the first of its question), and so does a row
    of steps.parquet (a well-formed id, turn and step; the first row of each). A question is finished when
    it has its method answer, its baseline answer (``with_baseline``) and its steps; the lines and rows of the
    others are left out too. Each file's left-out lines or rows are named in one warning: the file, their
    numbers, why. None of that is fatal.

    ``steps_required``: a steps.parquet that is damaged is a SpecbenchError (resuming: its questions cannot be
    told finished); without it (analysis) such a file, or none, leaves ``steps`` None and the questions are
    finished by their answers alone."""
    run_dir = Path(run_dir)
    wanted = None if question_ids is None else {question_key(question) for question in question_ids}
    answers = read_result_lines(run_dir / "answers.jsonl", METHOD_ANSWER, question_ids)
    baseline = read_result_lines(run_dir / "baseline_answers.jsonl", BASELINE_ANSWER, question_ids)
    skipped = read_result_lines(run_dir / "skipped.jsonl", SKIPPED_QUESTION, question_ids)
    steps_file, steps_problem, steps = run_dir / "steps.parquet", None, None
    try:
        if steps_required or steps_file.is_file():
            steps = checked_step_rows(steps_file, read_steps_file(steps_file), wanted)
        else:
            steps_problem = f"{steps_file} not found"
    except SpecbenchError as error:
        if steps_required:
            raise SpecbenchError(f"{error}; remove it to re-run the questions it held (their answers are then "
                                 "re-run too)") from None
        steps_problem = str(error)

    answer_keys, baseline_keys = answers.keys(), baseline.keys() if with_baseline else None
    step_keys = None if steps is None else set(steps.keys)
    finished = answer_keys.intersection(*[keys for keys in (baseline_keys, step_keys) if keys is not None])

    def unfinished(verb: str, *needed):
        def why(key: str) -> str:
            missing = [name for name, keys in needed if keys is not None and key not in keys]
            return f"{verb} of question {cut_short(key)}, which is not finished (no {', no '.join(missing)})"
        return why

    answers.keep_only(finished, unfinished("is", ("baseline answer", baseline_keys), ("steps", step_keys)))
    baseline.keep_only(finished, unfinished("is", ("method answer", answer_keys), ("steps", step_keys)))
    if steps is not None:
        steps.keep_only(finished, unfinished("are", ("method answer", answer_keys), ("baseline answer", baseline_keys)))
    warnings: list[str] = []
    for part in (answers, baseline, skipped, *([steps] if steps is not None else [])):
        warn_once(part.warning(), warnings, already_warned)
    frame = None if steps is None else steps.frame.drop(columns="_row").reset_index(drop=True)
    return RunResults(answers.records, baseline.records, skipped.records, frame,
                      {record["question_id"] for record in answers.records}, warnings, steps_problem,
                      answers.exists, baseline.exists)


def read_answers(run_dir: str | Path) -> list[dict]:
    """The method's answers of the finished questions of a run directory (``read_run_results``; none when it has
    no answers yet)."""
    run_dir = Path(run_dir)
    settings_file = run_dir / "run.json"
    settings = read_json_file(settings_file, "run's settings") if settings_file.is_file() else {}
    return read_run_results(run_dir, (run_dir / "baseline_answers.jsonl").is_file(), run_question_ids(settings)).answers
