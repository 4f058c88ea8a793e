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
from specbench.settings import method_name

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


def run_settings(run_dir: Path) -> dict:
    """The run's run.json (empty when it has none)."""
    settings_file = run_dir / "run.json"
    return json.loads(settings_file.read_text()) if settings_file.is_file() else {}


def run_label(summary: dict, settings: dict) -> str:
    """The name a run is shown under: its method's name (``hd``, ``hd+budget``: drafter plus specbench's
    tunings), with the temperature when it samples (``pld T=0.7``). Summaries written before the method name
    was recorded get it from run.json's tuning switches (``settings``)."""
    method = summary.get("method")
    if not method:
        method = method_name(summary["drafter"], settings.get("draft_budget", "off"), settings.get("verify_padding", "off"))
    temperature = settings.get("temperature") or 0.0
    return method if temperature == 0 else f"{method} T={temperature:g}"


def sweep_overrides(run_dir: Path) -> dict[str, str]:
    """The drafter overrides of a sweep job (``.hydra/overrides.yaml``), as {key without "drafter.": value}."""
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    if not overrides_file.is_file():
        return {}
    found = {}
    for override in yaml.safe_load(overrides_file.read_text()) or []:
        key, _, value = str(override).lstrip("+~").partition("=")
        if key.startswith("drafter.") and key != "drafter.name":
            found[key.removeprefix("drafter.")] = value
    return found


def drafter_settings(settings: dict) -> dict[str, str]:
    """The drafter's resolved settings that run.json (``settings``) recorded, flattened:
    {"statistics_corpus": "sharegpt", "model_db_build.max_prompts": "96", ...}."""
    drafter = settings.get("drafter")
    flat: dict[str, str] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = json.dumps(node) if isinstance(node, (list, dict)) else str(node)

    walk(drafter if isinstance(drafter, dict) else {}, "")
    flat.pop("name", None)
    return flat


def run_infos(run_dirs: list[Path]) -> dict[Path, dict]:
    """run_dir, model, drafter and label of each run. Runs of one model whose labels coincide but whose drafter
    settings differ (a sweep's ``drafter.gamma=2`` vs ``=4``, or REST on another corpus) get the differing
    settings appended, so that they stay apart; repeats of one configuration keep one label and are averaged
    together by the tables."""
    infos, overrides = {}, {}
    for run_dir in run_dirs:
        summary, settings = json.loads((run_dir / "summary.json").read_text()), run_settings(run_dir)
        infos[run_dir] = {"run_dir": str(run_dir), "model": summary["model"], "drafter": summary["drafter"],
                          "label": run_label(summary, settings)}
        overrides[run_dir] = {**drafter_settings(settings), **sweep_overrides(run_dir)}
    groups: dict[tuple, list[Path]] = {}
    for run_dir, info in infos.items():
        groups.setdefault((info["model"], info["label"]), []).append(run_dir)
    for members in groups.values():
        keys = sorted({key for run_dir in members for key in overrides[run_dir]})
        differing = [key for key in keys if len({overrides[run_dir].get(key) for run_dir in members}) > 1]
        for run_dir in members:
            extra = " ".join(f"{key}={overrides[run_dir].get(key, '-')}" for key in differing)
            if extra:
                infos[run_dir]["label"] += f" {extra}"
    return infos


def load_summaries(paths) -> pd.DataFrame:
    """One row per (run, task) with the run's model and drafter and the summary's statistics."""
    rows = []
    infos = run_infos(find_run_dirs(paths))
    for run_dir, info in infos.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        for task, stats in summary["tasks"].items():
            rows.append({**info, "task": task, **{key: stats.get(key) for key in SUMMARY_KEYS}})
    return pd.DataFrame(rows, columns=[*RUN_COLUMNS, "task", *SUMMARY_KEYS])


def load_steps(paths) -> pd.DataFrame:
    """Every step record of every run, with the run's columns added."""
    frames = []
    for run_dir, info in run_infos(find_run_dirs(paths)).items():
        steps_file = run_dir / "steps.parquet"
        if not steps_file.is_file():
            continue
        frame = pd.read_parquet(steps_file)
        for column, value in reversed(list(info.items())):
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
    for run_dir, info in run_infos(find_run_dirs(paths)).items():
        answers_file, baseline_file = run_dir / "answers.jsonl", run_dir / "baseline_answers.jsonl"
        if not answers_file.is_file():
            continue
        baseline = read_jsonl(baseline_file) if baseline_file.is_file() else None
        rows += question_rows(read_jsonl(answers_file), baseline, info)
    return pd.DataFrame(rows, columns=QUESTION_COLUMNS)


def read_spec_bench(method_file: str | Path, baseline_file: str | Path, model: str, drafter: str) -> pd.DataFrame:
    """Spec-Bench's own model_answer files (``evaluation/inference_*.py`` output): a method's answers and the
    baseline's, as per-question rows that sit in one table with specbench's runs."""
    info = {"run_dir": str(method_file), "model": model, "drafter": drafter, "label": drafter}
    rows = question_rows(read_jsonl(Path(method_file)), read_jsonl(Path(baseline_file)), info)
    return pd.DataFrame(rows, columns=QUESTION_COLUMNS)
