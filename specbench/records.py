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
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from specbench import metrics
from specbench.data import TASKS, Prompt
from specbench.errors import SpecbenchError
from specbench.mismatch import Mismatch

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
SUMMARY_KEYS = ("questions", "identical_to_baseline", "near_ties", "violations", "speedup", "mean_accepted_tokens",
                "acceptance_rate", "tokens_per_s", "baseline_tokens_per_s")


@dataclass
class Answer:
    """One decoder's answer to one question: per turn the text, the token ids, the steps, the wall time and
    the target's top-k tokens and logits per generated token (kept in memory for mismatch diagnosis only), and
    on a GPU the peak memory allocated while it was decoded (``specbench.gpu_memory.peak_bytes``)."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    steps: list[list[StepRecord]] = field(default_factory=list)
    wall_times: list[float] = field(default_factory=list)
    top: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    peak_gpu_memory_bytes: int | None = None

    def to_record(self, prompt: Prompt, model_id: str, identical_to_baseline: bool | None,
                  mismatch: Mismatch | None = None) -> dict:
        """Spec-Bench's model_answer line, plus a ``specbench`` key that Spec-Bench's scripts ignore.

        accept_lengths has one entry per forward pass of the target (the prefill included), counting the
        bonus token, so plain decoding gives [1, 1, ...] exactly as Spec-Bench's baseline records it. On a GPU
        the ``specbench`` key also holds ``peak_gpu_memory_bytes`` (a CPU answer has no such key).
        """
        choice = {
            "index": 0,
            "turns": self.texts,
            "decoding_steps": [len(steps) for steps in self.steps],
            "new_tokens": [len(ids) for ids in self.token_ids],
            "wall_time": self.wall_times,
            "accept_lengths": [step.accepted_tokens for steps in self.steps for step in steps],
        }
        ours = {
            "task": prompt.task,
            "identical_to_baseline": identical_to_baseline,
            "drafted_tokens": sum(step.candidate_tokens for steps in self.steps for step in steps),
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


def write_atomically(path: Path, write) -> None:
    """``write(staging)`` then rename over ``path``: a reader sees the old file or the new one, never half of one."""
    staging = path.with_name(path.name + ".partial")
    write(staging)
    os.replace(staging, path)


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


def read_jsonl_records(path: str | Path, what: str = "record") -> list[dict]:
    """The JSON records of a .jsonl file, one per line, read as bytes so that a cut inside a multi-byte UTF-8
    character cannot break the read: a last line without its newline (a write interrupted by a kill) is
    dropped with a warning naming the file; a damaged line before it is an error naming file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SpecbenchError(f"{path}: cannot be read ({error.strerror or error})") from None
    lines = data.split(b"\n")
    if lines[-1].strip():
        log.warning("%s: the last line is incomplete (%d bytes, a write cut short); ignoring it", path, len(lines[-1]))
    records = []
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise SpecbenchError(f"{path}, line {number}: not a valid JSON {what}; the file is damaged") from None
    return records


def read_json_file(path: str | Path, what: str) -> dict:
    """A JSON object file (run.json, summary.json), with a one-line error naming the file when it is empty,
    cut short or not an object."""
    path = Path(path)
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        raise SpecbenchError(f"{path}: cannot be read ({error.strerror or error})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SpecbenchError(f"{path} is empty or damaged (not valid JSON); it is the {what}") from None
    if not isinstance(value, dict):
        raise SpecbenchError(f"{path} is damaged (not a JSON object); it is the {what}")
    return value


def _read_steps(path: Path) -> pd.DataFrame:
    """steps.parquet, or an empty table when there is none. It is replaced atomically, so a damaged one was
    damaged from outside: say so rather than guess which questions it held."""
    if not path.is_file():
        return pd.DataFrame(columns=STEP_COLUMNS)
    try:
        return pd.read_parquet(path)
    except Exception as error:  # pyarrow raises several kinds for a damaged file
        raise SpecbenchError(f"{path} is damaged ({type(error).__name__}); remove it to re-run the questions it "
                             "held (their answers are then re-run too)") from None


def read_answers(run_dir: str | Path) -> list[dict]:
    """The method's answer records of a run directory (none when it has no answers yet)."""
    return read_jsonl_records(Path(run_dir) / "answers.jsonl", "answer record")


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

    def open(self, settings: dict) -> set:
        """Start or continue the run here with ``settings`` (already checked against an earlier run.json by the
        runner), load what an earlier session finished and return the ids of the finished questions. A question
        counts as finished only when all of its files were written."""
        try:
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
            answers, baseline, steps, finished = self._read()
            self.answers = [r for r in answers if r["question_id"] in finished]
            self.baseline_answers = [r for r in baseline if r["question_id"] in finished]
            self.skipped = read_jsonl_records(self.skipped_file, "skipped-question record")
            kept_steps = steps[steps["question_id"].isin(list(finished))]
            self._step_frames = [kept_steps] if len(kept_steps) else []
            # Rewrite the files without any half-finished question, so appends continue from a clean state.
            self._rewrite_jsonl(self.answers_file, self.answers)
            if self.with_baseline:
                self._rewrite_jsonl(self.baseline_file, self.baseline_answers)
            self._rewrite_jsonl(self.skipped_file, self.skipped)
            self._write_steps()
        except PermissionError as error:
            raise SpecbenchError(f"cannot write to the run directory {self.path} ({error.strerror}: "
                                 f"{error.filename}); choose a writable hydra.run.dir") from None
        return finished

    def skip(self, prompt: Prompt, reason: str, cause: str = "too_long", details: dict | None = None) -> None:
        """Record that ``prompt`` cannot be run here and why (the summary lists it; a resumed run passes it by).
        ``cause`` is one of SKIP_CAUSES; ``details`` (the memory figures of an out-of-memory question) are kept
        in the record as they are."""
        if cause not in SKIP_CAUSES:
            raise ValueError(f"unknown skip cause {cause!r}; one of {', '.join(SKIP_CAUSES)}")
        record = {"question_id": prompt.question_id, "task": prompt.task, "reason": reason, "cause": cause,
                  **(details or {})}
        self._append_jsonl(self.skipped_file, record)
        self.skipped.append(record)

    def skipped_ids(self) -> set:
        """Ids of the questions recorded as skipped, read without changing anything."""
        return {record["question_id"] for record in read_jsonl_records(self.skipped_file, "skipped-question record")}

    def _read(self):
        answers = read_jsonl_records(self.answers_file, "answer record")
        baseline = read_jsonl_records(self.baseline_file, "answer record")
        steps = _read_steps(self.steps_file)
        finished = {record["question_id"] for record in answers} & set(steps["question_id"].tolist())
        if self.with_baseline:
            finished &= {record["question_id"] for record in baseline}
        return answers, baseline, steps, finished

    def finished_ids(self) -> set:
        """Ids of the questions finished here, read without changing anything."""
        return self._read()[3] if self.path.is_dir() else set()

    def add(self, answer: dict, baseline: dict | None, step_rows: list[dict]) -> None:
        """Record one finished question: answers first, steps last (the steps mark it finished)."""
        if baseline is not None:
            self._append_jsonl(self.baseline_file, baseline)
            self.baseline_answers.append(baseline)
        self._append_jsonl(self.answers_file, answer)
        self.answers.append(answer)
        self._step_frames.append(pd.DataFrame(step_rows, columns=STEP_COLUMNS))
        self._write_steps()

    def save_drafter_state(self, state: dict[str, np.ndarray]) -> None:
        """Keep a drafter's cross-question state, with the questions finished so far (written after them)."""
        finished = np.array([str(record["question_id"]) for record in self.answers])
        write_atomically(self.drafter_state_file, lambda p: _save_npz(p, {**state, "_questions": finished}))

    def drafter_state(self) -> tuple[dict[str, np.ndarray], set[str]] | None:
        """The saved drafter state and the ids (as strings) of the questions it has seen; None if none."""
        if not self.drafter_state_file.is_file():
            return None
        try:
            with np.load(self.drafter_state_file, allow_pickle=False) as saved:
                arrays = {key: saved[key] for key in saved.files}
        except (OSError, ValueError) as error:
            raise SpecbenchError(f"{self.drafter_state_file} is damaged ({error}); remove it to start the drafter's "
                                 "state afresh (the resumed questions then differ from an uninterrupted run)") from None
        seen = set(arrays.pop("_questions").tolist())
        return arrays, seen

    def steps(self) -> pd.DataFrame:
        frames = [frame for frame in self._step_frames if len(frame)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=STEP_COLUMNS)

    def write_summary(self, header: dict, timing=None) -> dict:
        """Write and return summary.json: per-task statistics, the questions skipped and why (each record, and
        how many of each cause), and, given the run's ``specbench.machine.TimingCheck``, whether its timings can
        be trusted."""
        baseline = self.baseline_answers if self.with_baseline else None
        summary = {"schema_version": SCHEMA_VERSION, **header, "tasks": summarize(self.answers, baseline),
                   "skipped": self.skipped, "skipped_by_cause": skip_counts(self.skipped)}
        if timing is not None:
            summary["timing"] = timing.report(self.answers, baseline)
        write_atomically(self.summary_file, lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
        return summary

    @staticmethod
    def _append_jsonl(path: Path, record: dict) -> None:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    @staticmethod
    def _rewrite_jsonl(path: Path, records: list[dict]) -> None:
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        write_atomically(path, lambda p: p.write_text(text, encoding="utf-8"))

    def _write_steps(self) -> None:
        frame = self.steps()
        write_atomically(self.steps_file, lambda p: frame.to_parquet(p, index=False))


def summarize(answers: list[dict], baseline_answers: list[dict] | None) -> dict:
    """Per-task and overall statistics (``specbench.metrics.group_statistics``: Spec-Bench's definitions),
    with, when there is a baseline, how many answers are identical to it and how many differ at a near-tie
    or by a violation (``specbench.mismatch``)."""
    baseline_by_id = {record["question_id"]: record for record in baseline_answers or []}
    groups: dict[str, list[dict]] = {}
    for record in answers:
        groups.setdefault(record["specbench"]["task"], []).append(record)
    ordered = [task for task in TASKS if task in groups]
    result = {task: _group_summary(groups[task], baseline_by_id, baseline_answers is not None) for task in ordered}
    if answers:
        result["overall"] = _group_summary(answers, baseline_by_id, baseline_answers is not None)
    return result


def _group_summary(records: list[dict], baseline_by_id: dict, with_baseline: bool) -> dict:
    baseline = [baseline_by_id[record["question_id"]] for record in records] if with_baseline else None
    statistics = metrics.group_statistics(records, baseline)
    identical = [r["specbench"]["identical_to_baseline"] if with_baseline else None for r in records]
    counts = metrics.exactness_counts(identical, [metrics.answer_mismatch_kind(r) for r in records])
    statistics.update(identical_to_baseline=counts["identical"], near_ties=counts["near_ties"],
                      violations=counts["violations"])
    return {key: statistics[key] for key in SUMMARY_KEYS}


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

    header = ("task", "questions", "exact", "speedup", "MAT", "accept", "tok/s", "AR tok/s")
    rows = [header]
    for task, stats in summary["tasks"].items():
        rows.append((
            task,
            str(stats["questions"]),
            exact(stats),
            show(stats["speedup"], ".2f", "x"),
            show(stats["mean_accepted_tokens"], ".2f"),
            show(stats.get("acceptance_rate"), ".2f"),
            show(stats["tokens_per_s"], ".1f"),
            show(stats["baseline_tokens_per_s"], ".1f"),
        ))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                       for column, (cell, width) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines.append("exact = identical / near-tie / violation (see specbench.mismatch); accept = accepted / drafted "
                 "tokens; MAT = mean accepted tokens per target pass, bonus token included")
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
