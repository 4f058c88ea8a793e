"""Load any set of run directories (single runs, or every job of a multirun) into pandas DataFrames, and
Spec-Bench's own model_answer files into the same per-question table.

    from analysis.runs import load_questions, load_steps, load_summaries
    questions = load_questions(["runs/"])   # one row per run and question, method and paired baseline
    steps = load_steps(["runs/"])           # every decoding step, tagged with its run
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from specbench import metrics
from specbench.data import task_of
from specbench.records import STEP_COLUMNS, SUMMARY_KEYS

RUN_COLUMNS = ["run_dir", "model", "drafter", "label"]
# tokens_per_s: metrics.answer_rate; accept_lengths: the per-step list (MAT needs it); accepted, steps: its sum
# and length; drafted: candidate draft tokens verified (None in records that lack the count); mismatch: how the
# answer first differs from the baseline's (near_tie, violation, not_checked), None when it does not or when
# the record does not say.
QUESTION_COLUMNS = [*RUN_COLUMNS, "question_id", "task", "category", "tokens", "seconds", "tokens_per_s",
                    "baseline_tokens", "baseline_seconds", "baseline_tokens_per_s", "identical", "mismatch",
                    "accept_lengths", "accepted", "steps", "drafted"]


def find_run_dirs(paths) -> list[Path]:
    """Every directory at or below ``paths`` that holds a ``summary.json``, sorted."""
    found = set()
    for path in map(Path, paths):
        if (path / "summary.json").is_file():
            found.add(path)
        found.update(summary.parent for summary in path.rglob("summary.json"))
    return sorted(found)


def run_label(run_dir: Path, drafter: str) -> str:
    """The drafter's name, plus the drafter/temperature overrides of a sweep job (``.hydra/overrides.yaml``),
    so that the cells of an ablation stay apart: ``hd drafter.order=[context,model]``."""
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    if not overrides_file.is_file():
        return drafter
    overrides = yaml.safe_load(overrides_file.read_text()) or []
    salient = [o for o in overrides if o.startswith(("drafter.", "run.temperature", "run.top_p", "run.draft_budget"))
               and not o.startswith("drafter.name")]
    return " ".join([drafter, *sorted(salient)])


def _run_info(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"run_dir": str(run_dir), "model": summary["model"], "drafter": summary["drafter"],
            "label": run_label(run_dir, summary["drafter"])}


def load_summaries(paths) -> pd.DataFrame:
    """One row per (run, task) with the run's model and drafter and the summary's statistics."""
    rows = []
    for run_dir in find_run_dirs(paths):
        summary = json.loads((run_dir / "summary.json").read_text())
        info = _run_info(run_dir)
        for task, stats in summary["tasks"].items():
            rows.append({**info, "task": task, **{key: stats.get(key) for key in SUMMARY_KEYS}})
    return pd.DataFrame(rows, columns=[*RUN_COLUMNS, "task", *SUMMARY_KEYS])


def load_steps(paths) -> pd.DataFrame:
    """Every step record of every run, with the run's columns added."""
    frames = []
    for run_dir in find_run_dirs(paths):
        steps_file = run_dir / "steps.parquet"
        if not steps_file.is_file():
            continue
        frame = pd.read_parquet(steps_file)
        for column, value in reversed(list(_run_info(run_dir).items())):
            frame.insert(0, column, value)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*RUN_COLUMNS, *STEP_COLUMNS])
    return pd.concat(frames, ignore_index=True)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def record_task(record: dict) -> str:
    """The Spec-Bench task of an answer record: specbench's own field, else the one its category maps to,
    else the category itself."""
    return (record.get("specbench") or {}).get("task") or task_of(record["category"]) or record["category"]


def question_rows(answers: list[dict], baseline: list[dict] | None, info: dict) -> list[dict]:
    """Per-question rows from model_answer records (specbench's or Spec-Bench's schema). Tokens are the
    recorded new_tokens on both sides, so method and baseline are counted the same way; rates come from
    ``specbench.metrics``. Keys that only specbench's records carry (task, identical, mismatch, drafted) are
    None when absent, except the task, which then follows from the category."""
    by_id = {record["question_id"]: record for record in baseline or []}
    rows = []
    for record in answers:
        choice = record["choices"][0]
        base = by_id.get(record["question_id"])
        extra = record.get("specbench") or {}
        task = record_task(record)
        lengths = metrics.answer_accept_lengths(record)
        rows.append({
            **info, "question_id": record["question_id"], "task": task, "category": record["category"],
            "tokens": sum(choice["new_tokens"]), "seconds": sum(choice["wall_time"]),
            "tokens_per_s": metrics.answer_rate(record),
            "baseline_tokens": sum(base["choices"][0]["new_tokens"]) if base else None,
            "baseline_seconds": sum(base["choices"][0]["wall_time"]) if base else None,
            "baseline_tokens_per_s": metrics.answer_rate(base) if base else None,
            "identical": extra.get("identical_to_baseline"),
            "mismatch": metrics.answer_mismatch_kind(record),
            "accept_lengths": lengths, "accepted": sum(lengths), "steps": len(lengths),
            "drafted": metrics.answer_drafted_tokens(record),
        })
    return rows


def load_questions(paths) -> pd.DataFrame:
    """One row per (run, question): the method's and the paired baseline's tokens and seconds."""
    rows = []
    for run_dir in find_run_dirs(paths):
        answers_file, baseline_file = run_dir / "answers.jsonl", run_dir / "baseline_answers.jsonl"
        if not answers_file.is_file():
            continue
        baseline = read_jsonl(baseline_file) if baseline_file.is_file() else None
        rows += question_rows(read_jsonl(answers_file), baseline, _run_info(run_dir))
    return pd.DataFrame(rows, columns=QUESTION_COLUMNS)


def read_spec_bench(method_file: str | Path, baseline_file: str | Path, model: str, drafter: str) -> pd.DataFrame:
    """Spec-Bench's own model_answer files (``evaluation/inference_*.py`` output): a method's answers and the
    baseline's, as per-question rows that sit in one table with specbench's runs."""
    info = {"run_dir": str(method_file), "model": model, "drafter": drafter, "label": drafter}
    rows = question_rows(read_jsonl(Path(method_file)), read_jsonl(Path(baseline_file)), info)
    return pd.DataFrame(rows, columns=QUESTION_COLUMNS)
