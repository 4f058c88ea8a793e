"""A run directory's result files, opened to start or continue a run, appended to as questions finish and
rewritten whole where a reader must never see half of one (the file list: ``specbench.results``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.errors import SpecbenchError, damage_reason
from specbench.measure import metrics
from specbench.measure.floor import cost_curve, verify_medians
from specbench.questions import Prompt
from specbench.results.question_keys import question_id_of_key, question_id_problem, question_key
from specbench.results.readers import RunResults, read_json_file, read_run_results, run_question_ids
from specbench.results.resumable import resume_refusal
from specbench.results.schema import SCHEMA_VERSION, SKIP_CAUSES, STEP_COLUMNS
from specbench.results.steps_file import write_steps_file
from specbench.results.summary import skip_counts, summarize
from specbench.storage.atomic import append_whole, write_atomically
from specbench.storage.refusal import refusing_writes



def append_line(path: Path, record: dict) -> None:
    """Append ``record`` to the .jsonl file ``path`` as one line, whole or not at all, synced to the disk
    (``storage.atomic.append_whole``); if even cutting a failed write back fails, the readers' check of every line
    leaves it out (``read_result_lines``). A filesystem that refuses is one line naming ``path``."""
    append_whole(path, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"), sync=True)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with path.open("wb") as handle:  # a handle: np.savez would add ".npz" to the staging name
        np.savez(handle, **arrays)


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
            refusal = resume_refusal(self.path, earlier, settings)
            if refusal is not None:
                raise refusal
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
            question = question_id_of_key(text)
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
        summary["cost_curve"] = self.cost_curve(baseline, header.get("pass_floor"))
        write_atomically(self.summary_file, lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
        return summary

    def cost_curve(self, baseline: list[dict] | None, pass_floor: dict | None) -> dict:
        """The run's own cost curve beside the machine's floor (``specbench.measure.floor.cost_curve``): the method's
        verify time per size from its steps so far, AR's pass from the baseline's decoding after each prefill."""
        frame = self.steps()
        medians = verify_medians(frame.itertuples())
        rates = [metrics.answer_decoding_rate(record) for record in baseline or []]
        ar_pass_s = statistics.median(1 / rate for rate in rates if rate) if any(rates) else None
        return cost_curve(medians, ar_pass_s, (pass_floor or {}).get("bytes_per_pass", 0),
                          (pass_floor or {}).get("bandwidth"))

    @staticmethod
    def _rewrite_jsonl(path: Path, records: list[dict]) -> None:
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        write_atomically(path, lambda p: p.write_text(text, encoding="utf-8"))

    def _write_steps(self) -> None:
        frame = self.steps()
        write_atomically(self.steps_file, lambda p: write_steps_file(frame, p))
