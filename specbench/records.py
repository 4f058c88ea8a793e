"""Result files of one run directory, written as questions finish so an interrupted run can resume.

    run.json                 settings that make results comparable; a resumed run must match them
    answers.jsonl            the method's answers, Spec-Bench model_answer schema (one line per question)
    baseline_answers.jsonl   the paired autoregressive answers, same schema (absent with run.baseline=false)
    steps.parquet            one row per decoding step of the method (columns: STEP_COLUMNS)
    summary.json             per-task and overall speedup, acceptance, throughput, exactness (SCHEMA_VERSION)
    drafter_state.npz        what the drafter carries across questions (Token Recycling's matrix) after the
                             questions listed in it, for drafters that carry any: a resumed run continues from it
    skipped.jsonl            questions that cannot be run here, and why: a prompt longer than the model's context
                             (cause "too_long"), or a question that ran out of GPU memory ("out_of_memory", with
                             the memory figures of every GPU the target uses)
    verify_latency.json      the start-up verify-latency calibration (with run.verify_padding or run.draft_budget)
    specbench.log            the run's log; .hydra/ the composed config and overrides (CLI runs)
    .specbench.lock          held by the process running here (pid, host, start); a second run is refused

Both answer files can be fed to Spec-Bench's own ``evaluation/speed.py`` as --file-path / --base-path.

Every reader (resuming, the summary, ``python -m analysis``) reads these files through ``read_run_results``: a
line or step row counts only when it is a well-formed record of its file and of a question of the run, the
first one of its question, of a finished question; each file's others are named in one warning and left out.
Question ids are compared by ``question_key`` (their JSON text), so ``1`` and ``"1"`` are two questions and big
integers keep every digit. Every write goes through ``write_atomically`` or ``append_line``: a refusing
filesystem is one line naming the file, and nothing half-written is left for a reader to trust.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specbench.measure import metrics
from specbench.questions import HUB_PREFIX, SAMPLE_QUESTIONS, TASKS, Prompt, read_questions, select_questions
from specbench.errors import SpecbenchError, damage_reason
from specbench.storage.atomic import append_whole, write_atomically
from specbench.storage.refusal import refusing_writes
from specbench.measure.mismatch import KINDS as MISMATCH_KINDS
from specbench.measure.mismatch import Mismatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepRecord:
    """Timings and counts of one decoding step (one row of steps.parquet). Step 0 is the prefill, which
    yields the first token; its draft_s holds ``Drafter.begin`` and the first ``accept``.

    draft_tokens:     draft tokens verified (after the cuts), non-candidates (Lookahead's window) included.
    verify_tokens:    tokens in the target's forward pass: last committed token + draft + shape padding
                      (for the prefill: the prompt length).
    accepted_tokens:  tokens appended to the output, the bonus token included.
    draft_s:          time in the drafter (propose and accept), its device work included.
    verify_s:         the target's forward pass, up to its choices (argmax, top-k) being on the host.
    overhead_s:       the rest of the step: planning (cuts, draft budget), building the inputs, the acceptance
                      walk, the KV-cache compaction, bookkeeping.
    context_len:      prompt + generated tokens before the step.
    draft_depth:      longest path of candidate draft tokens verified (a chain's length); with
                      accepted_tokens it gives the acceptance per draft position.
    source:           label of the last accepted draft token (Draft.sources), "" when none was accepted or
                      the drafter gives no labels.
    candidate_tokens: draft tokens verified that could be accepted (draft_tokens minus non-candidates); the
                      denominator of the acceptance rate.

    Every phase boundary is a fenced clock read (see ``specbench.decoding.loop``). Changing these fields
    changes steps.parquet: bump SCHEMA_VERSION (tests/test_records.py pins the columns of each version).
    """

    step: int
    draft_tokens: int
    verify_tokens: int
    accepted_tokens: int
    draft_s: float
    verify_s: float
    overhead_s: float
    context_len: int
    draft_depth: int = 0
    source: str = ""
    candidate_tokens: int = 0


SCHEMA_VERSION = 3
# Schemas the readers (analysis, resuming) understand: 3 adds run.json's full settings, the weights fingerprint,
# summary.json's "timing" and "skipped"; steps.parquet is unchanged from 2.
SUPPORTED_SCHEMAS = (2, 3)
STEP_COLUMNS = ["question_id", "turn", *StepRecord.__dataclass_fields__]
SUMMARY_KEYS = ("questions", "identical_to_baseline", "near_ties", "violations", "speedup", "speedup_mean_of_ratios",
                "mean_accepted_tokens", "acceptance_rate", "mean_acceptance_length", "acceptance_by_position",
                "per_position_acceptance_rate", "acceptance_histogram", "tokens_per_s", "baseline_tokens_per_s", "tpot_ms",
                *(f"tpot_p{percentile}_ms" for percentile in metrics.TPOT_PERCENTILES))


@dataclass
class Answer:
    """One decoder's answer to one question: per turn the text, the token ids, the steps, the wall time and
    the target's top-k tokens and logits per generated token (kept in memory for mismatch diagnosis only), and
    on a GPU the peak memory allocated while it was decoded (``specbench.measure.gpu_memory.peak_bytes``)."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    steps: list[list[StepRecord]] = field(default_factory=list)
    wall_times: list[float] = field(default_factory=list)
    top: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    peak_gpu_memory_bytes: int | None = None

    def to_record(self, prompt: Prompt, model_id: str, identical_to_baseline: bool | None,
                  mismatch: Mismatch | None = None) -> dict:
        """Spec-Bench's model_answer line, plus a ``specbench`` key that Spec-Bench's scripts ignore.

        accept_lengths has one entry per forward pass of the original method's run (``original_passes``),
        counting the bonus token, so plain decoding gives [1, 1, ...] exactly as Spec-Bench's baseline records
        it, and Spec-Bench's ``evaluation/speed.py`` (the mean of every entry) gives the summary's MAT. The
        ``specbench`` key holds the draft depths parallel to it and vLLM's acceptance histogram of this
        request (``specbench.measure.metrics.acceptance_histogram``); on a GPU also ``peak_gpu_memory_bytes`` (a CPU
        answer has no such key).
        """
        passes = [original_passes(steps) for steps in self.steps]
        lengths = [step.accepted_tokens for turn in passes for step in turn]
        depths = [step.draft_depth for turn in passes for step in turn]
        choice = {
            "index": 0,
            "turns": self.texts,
            "decoding_steps": [len(turn) for turn in passes],
            "new_tokens": [len(ids) for ids in self.token_ids],
            "wall_time": self.wall_times,
            "accept_lengths": lengths,
        }
        ours = {
            "task": prompt.task,
            "identical_to_baseline": identical_to_baseline,
            "drafted_tokens": sum(step.candidate_tokens for steps in self.steps for step in steps),
            # Per step, parallel to accept_lengths: the per-position and vLLM acceptance figures need them.
            "draft_depths": depths,
            "acceptance_histogram": metrics.acceptance_histogram(lengths, depths),
            "mismatch": None if mismatch is None else mismatch.to_dict(),
        }
        if self.peak_gpu_memory_bytes is not None:
            ours["peak_gpu_memory_bytes"] = self.peak_gpu_memory_bytes
        return {
            "question_id": prompt.question_id,
            "category": prompt.category,
            "answer_id": uuid.uuid4().hex,
            "model_id": model_id,
            "choices": [choice],
            "tstamp": time.time(),
            "specbench": ours,
        }

    def step_rows(self, question_id) -> list[dict]:
        return [
            {"question_id": question_id, "turn": turn, **asdict(step)}
            for turn, steps in enumerate(self.steps)
            for step in steps
        ]


def original_passes(steps: list[StepRecord]) -> list[StepRecord]:
    """One turn's steps as its original method's run counts its forward passes, for the answer file: a
    prefill that settled nothing (``Drafter.first_draft_from_prompt``: PLD, SpS, Token Recycling) is left
    out, since the originals verify the first draft in the pass that reads the prompt (PLD, SpS: Spec-Bench
    ``model/pld/pld.py:86-135`` and ``model/sps/decoding.py:253-362`` append one accept length per pass of
    their loop, the first one reading the prompt) or leave the prompt pass out of their counts (Token
    Recycling); Spec-Bench's ``evaluation/eval.py:223-230`` writes those entries and their count
    (decoding_steps). Written as a 0, the prefill would be averaged in by ``evaluation/speed.py:29, 65`` (the
    mean of every entry), which ``metrics.mean_accepted_tokens`` leaves out. steps.parquet keeps every step."""
    if steps and steps[0].step == 0 and steps[0].accepted_tokens == 0:
        return steps[1:]
    return steps


def append_line(path: Path, record: dict) -> None:
    """Append ``record`` to the .jsonl file ``path`` as one line, whole or not at all, synced to the disk
    (``storage.atomic.append_whole``); if even cutting a failed write back fails, the readers' check of every line
    leaves it out (``read_result_lines``). A filesystem that refuses is one line naming ``path``."""
    append_whole(path, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"), sync=True)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with path.open("wb") as handle:  # a handle: np.savez would add ".npz" to the staging name
        np.savez(handle, **arrays)


# Why a question is in skipped.jsonl, as the summary counts them. Records written before causes were kept have
# none: those were all prompts too long for the context.
SKIP_CAUSES = {"too_long": "too long for the context", "out_of_memory": "out of GPU memory"}

# Settings recorded for the record only: a resumed run may differ in them (a new commit of specbench).
NOT_COMPARED = ("git_sha",)


def settings_differences(earlier: dict, now: dict, keys=None) -> list[str]:
    """``key: earlier -> now`` for each setting (nested ones dotted) that differs, over ``keys`` (default: all)."""
    def flat(node, prefix=""):
        if isinstance(node, dict):
            out = {}
            for name, value in node.items():
                out.update(flat(value, f"{prefix}{name}."))
            return out
        return {prefix[:-1]: node}

    keys = sorted(set(earlier) | set(now)) if keys is None else keys
    before = flat({key: earlier.get(key) for key in keys})
    after = flat({key: now.get(key) for key in keys})
    return [f"{key}: {before.get(key)!r} -> {after.get(key)!r}" for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key) and key.rsplit(".", 1)[-1] not in NOT_COMPARED]


def question_key(question_id) -> str:
    """The one form in which question ids are compared, and stored where a column must hold a single type: their
    JSON text. ``1`` and ``"1"`` stay two questions, as in the question file, and an integer beyond 64 bits keeps
    every digit.

    >>> question_key(1), question_key("q2"), question_key(2**70)
    ('1', '"q2"', '1180591620717411303424')
    """
    if isinstance(question_id, np.integer):  # a row of an int64 column
        question_id = int(question_id)
    return json.dumps(question_id, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def question_id_problem(question_id) -> str | None:
    """Why ``question_id`` cannot be a question's id, or None: ``specbench.questions`` takes integers and strings."""
    if isinstance(question_id, bool) or not isinstance(question_id, (int, str, np.integer)):
        return f"has a question_id {_shown(question_id)} that is not an integer or a string"
    return None


def _shown(value) -> str:
    """A JSON value as a message shows it: its JSON text, cut short."""
    try:
        return _cut(question_key(value))
    except (TypeError, ValueError):
        return _cut(repr(value))


def _cut(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _json_type(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _is_count(value) -> bool:
    """A token or step count: a non-negative whole number (JSON may write it 3.0)."""
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0 and float(value).is_integer())


def _is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class LineKind:
    """What a line of one kind of result file must hold to be counted (``record_problem``), beyond a JSON object
    with an integer or string question_id.

    choice_lists: the lists an answer's ``choices[0]`` must hold; none: the record is not an answer.
    own_task:     specbench's method answers: a ``specbench`` object with the task the summary groups them by.
    skip:         a skipped-question record: a reason and, where recorded, one of SKIP_CAUSES.
    """

    choice_lists: tuple[str, ...] = ()
    own_task: bool = False
    skip: bool = False


METHOD_ANSWER = LineKind(("new_tokens", "wall_time", "accept_lengths"), own_task=True)
# A baseline answer, specbench's or Spec-Bench's own (analysis --spec-bench): no accept lengths needed.
BASELINE_ANSWER = LineKind(("new_tokens", "wall_time"))
# A method's answer in Spec-Bench's own model_answer files, which have no specbench key.
SPEC_BENCH_METHOD = LineKind(("new_tokens", "wall_time", "accept_lengths"))
SKIPPED_QUESTION = LineKind(skip=True)
ANY_RECORD = LineKind()
FILE_KINDS = {"answers.jsonl": METHOD_ANSWER, "baseline_answers.jsonl": BASELINE_ANSWER,
              "skipped.jsonl": SKIPPED_QUESTION}
MISMATCH_FIELDS = tuple(Mismatch.__dataclass_fields__)


def record_problem(record, kind: LineKind) -> str | None:
    """Why ``record`` (one parsed line) is not a well-formed record of ``kind``, or None. Everything a reader of
    results takes from a record (summary, analysis, resuming, the timing check) is checked here, once, so no
    later sum or lookup meets a missing key or a wrong type."""
    if not isinstance(record, dict):
        return f"is a JSON {_json_type(record)}, not an object"
    if "question_id" not in record:
        return "has no question_id"
    problem = question_id_problem(record["question_id"])
    if problem:
        return problem
    if kind.skip:
        return _skip_problem(record)
    if kind.choice_lists:
        return _answer_problem(record, kind)
    return None


def _skip_problem(record: dict) -> str | None:
    if not isinstance(record.get("reason"), str):
        return "has no reason (a string)"
    if "cause" in record and record["cause"] not in SKIP_CAUSES:
        return f"has an unknown cause {_shown(record['cause'])} (one of {', '.join(SKIP_CAUSES)})"
    return None


def _answer_problem(record: dict, kind: LineKind) -> str | None:
    choices = record.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        if "turns" in record:
            return "has turns but no choices: it is a question (Spec-Bench's question.jsonl), not an answer"
        return "has no choices"
    if not isinstance(record.get("category"), str):
        return "has no category (a string)"
    choice = choices[0]
    for key in kind.choice_lists:
        if not isinstance(choice.get(key), list):
            return f"has no choices[0].{key}"
    new_tokens, wall_time = choice["new_tokens"], choice["wall_time"]
    if not all(_is_count(value) for value in new_tokens):
        return "has a choices[0].new_tokens that is not a list of token counts"
    if not all(_is_seconds(value) for value in wall_time):
        return "has a choices[0].wall_time that is not a list of seconds"
    if len(new_tokens) != len(wall_time):
        return f"has {len(new_tokens)} new_tokens but {len(wall_time)} wall_time entries (one per turn each)"
    if not sum(wall_time) > 0:
        return "has no positive wall_time (its tokens/s would divide by zero)"
    if "accept_lengths" in kind.choice_lists:
        lengths = choice["accept_lengths"]
        if not lengths or not all(_is_count(value) for value in lengths):
            return "has a choices[0].accept_lengths that is not a non-empty list of token counts"
        depths = (record.get("specbench") or {}).get("draft_depths") if isinstance(record.get("specbench"), dict) else None
        if depths is not None and not (isinstance(depths, list) and len(depths) == len(lengths)
                                       and all(_is_count(value) for value in depths)):
            return "has a specbench.draft_depths that is not a list of draft depths, one per accept length"
        if depths is not None:
            # No step appends more than its draft's depth + the bonus token; a record that says so has its
            # depths wrong, and every per-position figure computed from it would be.
            beyond = next((index for index, (length, depth) in enumerate(zip(lengths, depths))
                           if length > depth + 1), None)
            if beyond is not None:
                return (f"has a step (accept_lengths[{beyond}]) that appends {lengths[beyond]} tokens after a draft "
                        f"{depths[beyond]} deep (specbench.draft_depths): at most depth + 1")
    return _specbench_problem(record.get("specbench"), kind)


def _specbench_problem(ours, kind: LineKind) -> str | None:
    """What is wrong with an answer's ``specbench`` object (None where Spec-Bench's own files have none)."""
    if ours is None and not kind.own_task:
        return None
    if not isinstance(ours, dict):
        return "has no specbench object"
    if kind.own_task and ours.get("task") not in TASKS:
        return f"has no known specbench.task ({_shown(ours.get('task'))})"
    if ours.get("identical_to_baseline") is not None and not isinstance(ours["identical_to_baseline"], bool):
        return "has a specbench.identical_to_baseline that is not true, false or null"
    if ours.get("drafted_tokens") is not None and not _is_count(ours["drafted_tokens"]):
        return "has a specbench.drafted_tokens that is not a token count"
    mismatch = ours.get("mismatch")
    if mismatch is not None:
        if not isinstance(mismatch, dict) or mismatch.get("kind") not in MISMATCH_KINDS:
            return f"has a specbench.measure.mismatch without a kind ({', '.join(MISMATCH_KINDS)})"
        if mismatch["kind"] == "violation" and any(key not in mismatch for key in MISMATCH_FIELDS):
            return "has a specbench.measure.mismatch violation without its tokens and margins"
    contention = ours.get("contention")
    if contention is not None and not (isinstance(contention, dict) and (contention.get("other_cores") is None
                                                                         or _is_seconds(contention["other_cores"]))):
        return "has a specbench.contention without a number of other_cores"
    if ours.get("peak_gpu_memory_bytes") is not None and not _is_count(ours["peak_gpu_memory_bytes"]):
        return "has a specbench.peak_gpu_memory_bytes that is not a byte count"
    return None


SHOWN_PROBLEMS = 10  # left-out lines described one by one in a warning; the rest are listed by number


def _numbers_text(numbers) -> str:
    """1-based line or row numbers as ranges: ``3, 7-9``."""
    ranges: list[list[int]] = []
    for number in sorted(numbers):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


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
            parts.append(f"and {len(rest)} more (lines {_numbers_text(rest)})")
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
                problem = f"is of question {_shown(record['question_id'])}, not one of this run's questions"
            elif key in first_line:
                problem = f"repeats question {_shown(record['question_id'])} of line {first_line[key]} (the first is kept)"
            else:
                first_line[key] = number
        if problem:
            lines.left_out.append((number, problem))
            continue
        lines.records.append(record)
        lines.numbers.append(number)
    return lines


def _warn(message: str | None, warnings: list[str], already: set[str] | None = None) -> None:
    """Keep ``message`` in ``warnings`` and log it, unless it is in ``already`` (the warnings a RunDirectory
    gave before: a resumed run reads its files twice, the finished-run check then the opening, and one bad line
    is one warning)."""
    if message:
        if already is None or message not in already:
            log.warning("%s", message)
            if already is not None:
                already.add(message)
        warnings.append(message)


def read_jsonl_records(path: str | Path, kind: LineKind | str | None = None, question_ids=None) -> list[dict]:
    """The records of a .jsonl result file that count (``read_result_lines``), with one warning naming the file,
    the lines left out and why. A string ``kind`` (the label older callers passed) reads as None: the kind of
    the file's name."""
    lines = read_result_lines(path, kind if isinstance(kind, LineKind) else None, question_ids)
    _warn(lines.warning(), [])
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
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if not native:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), ID_FORM_KEY: JSON_IDS})
    pq.write_table(table, path)


def _decoded_id(text):
    """An id back from its question_key text; None (a row left out as malformed) for text that is not one."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None


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
        frame["question_id"] = pd.Series([_decoded_id(text) for text in frame["question_id"]], index=frame.index,
                                         dtype=object)
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
        parts = [f"rows {_numbers_text(rows)} {why}" for why, rows in by_why.items()]
        shown = parts[:SHOWN_PROBLEMS] + ([f"and {len(parts) - SHOWN_PROBLEMS} more"] if len(parts) > SHOWN_PROBLEMS else [])
        return f"{self.path}: {'; '.join(shown)} ({len(self.left_out)} row(s) left out, not counted)"


def _step_rows(path: Path, frame: pd.DataFrame, wanted: set[str] | None) -> StepRows:
    """The rows of a steps table with a well-formed question id, turn and step, of a question in ``wanted``
    (when known), each (question, turn, step) once: the first is kept, as for the lines of the answer files."""
    frame = frame.assign(_row=range(1, len(frame) + 1))
    keys, mask, left_out, seen = [], [], [], set()
    for row, question, turn, step in zip(frame["_row"], frame["question_id"], frame["turn"], frame["step"]):
        problem = question_id_problem(question)
        key = None if problem else question_key(question)
        if problem is None and not (_is_count(turn) and _is_count(step)):
            problem = f"of question {_shown(question)} have a turn or step that is not a count"
        elif problem is None and wanted is not None and key not in wanted:
            problem = f"are of question {_shown(question)}, not one of this run's questions"
        elif problem is None and (key, int(turn), int(step)) in seen:
            problem = f"repeat steps of question {_shown(question)} (the first are kept)"
        if problem is None:
            seen.add((key, int(turn), int(step)))
            keys.append(key)
        else:
            left_out.append((row, problem))
        mask.append(problem is None)
    return StepRows(path, frame[np.array(mask, dtype=bool)], keys, left_out)


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
            steps = _step_rows(steps_file, read_steps_file(steps_file), wanted)
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
            return f"{verb} of question {_cut(key)}, which is not finished (no {', no '.join(missing)})"
        return why

    answers.keep_only(finished, unfinished("is", ("baseline answer", baseline_keys), ("steps", step_keys)))
    baseline.keep_only(finished, unfinished("is", ("method answer", answer_keys), ("steps", step_keys)))
    if steps is not None:
        steps.keep_only(finished, unfinished("are", ("method answer", answer_keys), ("baseline answer", baseline_keys)))
    warnings: list[str] = []
    for part in (answers, baseline, skipped, *([steps] if steps is not None else [])):
        _warn(part.warning(), warnings, already_warned)
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


class RunDirectory:
    """Reads and writes the result files of one run directory."""

    def __init__(self, path: str | Path, with_baseline: bool):
        self.path = Path(path)
        self.with_baseline = with_baseline
        self.answers_file = self.path / "answers.jsonl"
        self.baseline_file = self.path / "baseline_answers.jsonl"
        self.steps_file = self.path / "steps.parquet"
        self.summary_file = self.path / "summary.json"
        self.settings_file = self.path / "run.json"
        self.drafter_state_file = self.path / "drafter_state.npz"
        self.skipped_file = self.path / "skipped.jsonl"
        self.answers: list[dict] = []
        self.skipped: list[dict] = []
        self.baseline_answers: list[dict] = []
        self._step_frames: list[pd.DataFrame] = []
        self._warned: set[str] = set()  # the warnings about this directory's lines given so far, each given once
        self._peeked: RunResults | None = None  # what skipped_ids / finished_ids read, read (and warned about) once

    def open(self, settings: dict) -> set:
        """Start or continue the run here with ``settings`` (already checked against an earlier run.json by the
        runner), load what an earlier session finished and return the ids of the finished questions. What counts
        is what ``read_run_results`` keeps (finished questions of this run's question set, as run.json's task
        settings select it when its question file is at hand); the files are rewritten without the rest, so
        appends continue from a clean state."""
        with refusing_writes(self.path, "create"):
            self.path.mkdir(parents=True, exist_ok=True)
        if self.settings_file.is_file():  # the runner checked before loading; this guards every other caller
            earlier = read_json_file(self.settings_file, "settings file of the run in this directory")
            changed = settings_differences(earlier, settings)
            if changed:
                raise SpecbenchError(f"{self.path} holds results of a run with other settings "
                                     f"({'; '.join(changed)}); choose another hydra.run.dir or remove that directory")
        else:
            text = json.dumps(settings, indent=2, sort_keys=True) + "\n"
            write_atomically(self.settings_file, lambda p: p.write_text(text))
        results = read_run_results(self.path, self.with_baseline, run_question_ids(settings),
                                   already_warned=self._warned)
        self._peeked = None
        self.answers, self.baseline_answers, self.skipped = results.answers, results.baseline, results.skipped
        self._step_frames = [results.steps] if len(results.steps) else []
        self._rewrite_jsonl(self.answers_file, self.answers)
        if self.with_baseline:
            self._rewrite_jsonl(self.baseline_file, self.baseline_answers)
        self._rewrite_jsonl(self.skipped_file, self.skipped)
        self._write_steps()
        return results.finished

    def skip(self, prompt: Prompt, reason: str, cause: str = "too_long", details: dict | None = None) -> None:
        """Record that ``prompt`` cannot be run here and why (the summary lists it; a resumed run passes it by).
        ``cause`` is one of SKIP_CAUSES; ``details`` (the memory figures of an out-of-memory question) are kept
        in the record as they are."""
        if cause not in SKIP_CAUSES:
            raise ValueError(f"unknown skip cause {cause!r}; one of {', '.join(SKIP_CAUSES)}")
        record = {"question_id": prompt.question_id, "task": prompt.task, "reason": reason, "cause": cause,
                  **(details or {})}
        append_line(self.skipped_file, record)
        self.skipped.append(record)
        self._peeked = None

    def _recorded(self) -> RunResults:
        """The results here as ``read_run_results`` keeps them, for the question set of the run.json here; read
        once per RunDirectory before it is opened."""
        if self._peeked is None:
            settings = (read_json_file(self.settings_file, "settings file of the run in this directory")
                        if self.settings_file.is_file() else {})
            self._peeked = read_run_results(self.path, self.with_baseline, run_question_ids(settings),
                                            already_warned=self._warned)
        return self._peeked

    def skipped_ids(self) -> set:
        """Ids of the questions recorded as skipped, read without changing anything."""
        return {record["question_id"] for record in self._recorded().skipped} if self.path.is_dir() else set()

    def finished_ids(self) -> set:
        """Ids of the questions finished here, read without changing anything."""
        return self._recorded().finished if self.path.is_dir() else set()

    def add(self, answer: dict, baseline: dict | None, step_rows: list[dict]) -> None:
        """Record one finished question: answers first, steps last (the steps mark it finished)."""
        if baseline is not None:
            append_line(self.baseline_file, baseline)
            self.baseline_answers.append(baseline)
        append_line(self.answers_file, answer)
        self.answers.append(answer)
        self._peeked = None
        self._step_frames.append(pd.DataFrame(step_rows, columns=STEP_COLUMNS))
        self._write_steps()

    def save_drafter_state(self, state: dict[str, np.ndarray]) -> None:
        """Keep a drafter's cross-question state, with the questions finished so far (written after them)."""
        finished = np.array([question_key(record["question_id"]) for record in self.answers])
        write_atomically(self.drafter_state_file, lambda p: _save_npz(p, {**state, "_questions": finished}))

    def drafter_state(self) -> tuple[dict[str, np.ndarray], set[str]] | None:
        """The saved drafter state and the ids (as ``str(question_id)``) of the questions it has seen; None if
        none. The file keeps their question_key; files written before that kept ``str`` forms, read alike."""
        if not self.drafter_state_file.is_file():
            return None
        try:
            with np.load(self.drafter_state_file, allow_pickle=False) as saved:
                arrays = {key: saved[key] for key in saved.files}
        except Exception as error:  # numpy and zipfile raise OSError, ValueError, BadZipFile, EOFError, zlib.error, ...
            raise SpecbenchError(f"{self.drafter_state_file} is damaged ({damage_reason(error)}); remove it to start "
                                 "the drafter's state afresh (the resumed questions then differ from an uninterrupted "
                                 "run)") from None
        if "_questions" not in arrays:
            raise SpecbenchError(f"{self.drafter_state_file} is damaged (it does not list the questions it has seen); "
                                 "remove it to start the drafter's state afresh")
        seen = set()
        for text in arrays.pop("_questions").tolist():
            question = _decoded_id(text)
            seen.add(str(question) if question_id_problem(question) is None else text)
        return arrays, seen

    def steps(self) -> pd.DataFrame:
        frames = [frame for frame in self._step_frames if len(frame)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=STEP_COLUMNS)

    def write_summary(self, header: dict, timing=None) -> dict:
        """Write and return summary.json: per-task statistics, the questions skipped and why (each record, and
        how many of each cause), and, given the run's ``specbench.measure.machine.TimingCheck``, whether its timings can
        be trusted."""
        baseline = self.baseline_answers if self.with_baseline else None
        summary = {"schema_version": SCHEMA_VERSION, **header, "tasks": summarize(self.answers, baseline),
                   "skipped": self.skipped, "skipped_by_cause": skip_counts(self.skipped)}
        if timing is not None:
            summary["timing"] = timing.report(self.answers, baseline)
        write_atomically(self.summary_file, lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
        return summary

    @staticmethod
    def _rewrite_jsonl(path: Path, records: list[dict]) -> None:
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        write_atomically(path, lambda p: p.write_text(text, encoding="utf-8"))

    def _write_steps(self) -> None:
        frame = self.steps()
        write_atomically(self.steps_file, lambda p: write_steps_file(frame, p))


def summarize(answers: list[dict], baseline_answers: list[dict] | None) -> dict:
    """Per-task and overall statistics (``specbench.measure.metrics.group_statistics``: Spec-Bench's definitions),
    with, when there is a baseline, how many answers are identical to it and how many differ at a near-tie
    or by a violation (``specbench.measure.mismatch``)."""
    baseline_by_id = {question_key(record["question_id"]): record for record in baseline_answers or []}
    groups: dict[str, list[dict]] = {}
    for record in answers:
        groups.setdefault(record["specbench"]["task"], []).append(record)
    ordered = [task for task in TASKS if task in groups]
    result = {task: _group_summary(groups[task], baseline_by_id, baseline_answers is not None) for task in ordered}
    if answers:
        result["overall"] = _group_summary(answers, baseline_by_id, baseline_answers is not None)
    return result


def _group_summary(records: list[dict], baseline_by_id: dict, with_baseline: bool) -> dict:
    baseline = [baseline_by_id[question_key(record["question_id"])] for record in records] if with_baseline else None
    statistics = metrics.group_statistics(records, baseline)
    identical = [r["specbench"]["identical_to_baseline"] if with_baseline else None for r in records]
    counts = metrics.exactness_counts(identical, [metrics.answer_mismatch_kind(r) for r in records])
    statistics.update(identical_to_baseline=counts["identical"], near_ties=counts["near_ties"],
                      violations=counts["violations"])
    return {key: statistics[key] for key in SUMMARY_KEYS}


SHOWN_POSITIONS = 8  # draft positions printed under the summary table; summary.json holds them all


def format_summary_table(summary: dict) -> str:
    """The summary as an aligned text table, one row per task and one for overall. ``exact`` reads
    identical / near-tie / violation counts out of the questions ("-" without a baseline)."""

    def show(value, fmt: str, suffix: str = "") -> str:
        return "-" if value is None else format(value, fmt) + suffix

    def exact(stats) -> str:
        if stats["identical_to_baseline"] is None:
            return "-"
        if stats.get("near_ties") is None:  # sampling: outputs are not expected to be identical
            return f"{stats['identical_to_baseline']}/{stats['questions']} (sampled)"
        return f"{stats['identical_to_baseline']}/{stats.get('near_ties', 0)}/{stats.get('violations', 0)}"

    header = ("task", "questions", "exact", "speedup", "per-q", "MAT", "MAL", "accept", "TPOT ms", "p90",
              "tok/s", "AR tok/s")
    rows = [header]
    for task, stats in summary["tasks"].items():
        rows.append((
            task,
            str(stats["questions"]),
            exact(stats),
            show(stats["speedup"], ".2f", "x"),
            show(stats.get("speedup_mean_of_ratios"), ".2f", "x"),
            show(stats["mean_accepted_tokens"], ".2f"),
            show(stats.get("mean_acceptance_length"), ".2f"),
            show(stats.get("acceptance_rate"), ".2f"),
            show(stats.get("tpot_ms"), ".1f"),
            show(stats.get("tpot_p90_ms"), ".1f"),
            show(stats["tokens_per_s"], ".1f"),
            show(stats["baseline_tokens_per_s"], ".1f"),
        ))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                       for column, (cell, width) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    positions = (summary["tasks"].get("overall") or {}).get("acceptance_by_position")
    if positions:
        shown = " ".join(f"{share:.2f}" for share in positions[:SHOWN_POSITIONS])
        more = f" (of {len(positions)})" if len(positions) > SHOWN_POSITIONS else ""
        lines.append(f"acceptance by draft position 1-{min(len(positions), SHOWN_POSITIONS)}{more}, overall: {shown}")
    lines += ["exact = identical / near-tie / violation (see specbench.measure.mismatch); speedup = mean tok/s over mean AR "
              "tok/s (Spec-Bench);",
              "per-q = mean of per-question speedups; MAT = mean accepted tokens per target pass, prefill and bonus "
              "token included;",
              "MAL = vLLM's mean acceptance length (1 + accepted / drafts); accept = accepted / drafted tokens; TPOT = "
              "ms per output token",
              "(mean over questions, p90 its 90th percentile); docs/measurement.md defines each"]
    return "\n".join(lines + summary_flags(summary))


def skip_counts(skipped: list[dict]) -> dict[str, int]:
    """How many skipped-question records there are of each cause (SKIP_CAUSES), in order of first appearance."""
    return dict(Counter(record.get("cause", "too_long") for record in skipped))


def summary_flags(summary: dict, shown: int = 5) -> list[str]:
    """Lines that must not be missed under a summary table: timings taken on a busy machine (the numbers stay,
    flagged), a run on the CPU of a machine whose GPUs torch could not use, and questions skipped (how many, by
    cause, and the first few with their reasons)."""
    lines = []
    unused = (summary.get("environment") or {}).get("gpus_not_used")
    if unused:
        lines.append(f"RAN ON THE CPU: nvidia-smi lists {len(unused['listed'])} GPU(s) ({'; '.join(unused['listed'])}) "
                     f"that torch could not use: {unused['reason']}")
    timing = summary.get("timing") or {}
    if timing and not timing.get("trustworthy", True):
        warnings = timing.get("warnings", [])
        lines.append(f"TIMINGS UNTRUSTWORTHY (busy machine, {len(warnings)} warning(s)): "
                     + "; ".join(warnings[:shown]) + (" ..." if len(warnings) > shown else ""))
    skipped = summary.get("skipped") or []
    if skipped:
        counted = ", ".join(f"{count} {SKIP_CAUSES.get(cause, cause)}" for cause, count in skip_counts(skipped).items())
        lines.append(f"skipped {len(skipped)} question(s): "
                     + "; ".join(f"{record['question_id']}: {record['reason']}" for record in skipped[:shown])
                     + (" ..." if len(skipped) > shown else "") + f" ({counted})")
    return lines


def violation_report(summary: dict, answers: list[dict]) -> str | None:
    """A loud paragraph naming every answer whose difference from the baseline is a violation, or None."""
    bad = [record for record in answers if metrics.answer_mismatch_kind(record) == "violation"]
    if not bad:
        return None
    lines = [f"LOSSLESSNESS VIOLATION: {len(bad)} answer(s) differ from the baseline beyond a numerical near-tie:"]
    for record in bad:
        found = record["specbench"]["mismatch"]
        lines.append(f"  question {record['question_id']} turn {found['turn'] + 1}, token {found['index']}: method "
                     f"{found['method_token']} vs baseline {found['baseline_token']} (logit margins: method "
                     f"{found['method_margin']}, baseline {found['baseline_margin']})")
    return "\n".join(lines)
