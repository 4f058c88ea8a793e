"""Load any set of run directories (single runs, or every job of a multirun) into pandas DataFrames, and
Spec-Bench's own model_answer files into the same per-question table.

    from analysis.runs import load_questions, load_steps, load_summaries
    questions = load_questions(["runs/"])   # one row per run and question, method and paired baseline
    steps = load_steps(["runs/"])           # every decoding step, tagged with its run

Runs are repeats of one configuration, averaged together by the tables, only when every result-affecting
setting of their run.json (``flat_settings``) and their set of questions match; otherwise their labels say
what differs (``pld dtype=bfloat16``, ``pld questions=2``), and a note says which settings split a label.

What bad inputs do (every message names the file; none stops the others' tables):

* a line of answers.jsonl, baseline_answers.jsonl or skipped.jsonl that is not a well-formed record of the
  run (half-written, not JSON, not a record, a repeated question, a question the run's question file does not
  select), a row of steps.parquet of that sort, and the lines and rows of unfinished questions are left out,
  named in one warning per file, exactly as resuming leaves them out (``specbench.results.readers.read_run_results``);
* one run reached by two paths (a symlink, ``DIR`` and ``./DIR``, a folder and a run inside it) or copied to
  another (the same answer ids) is counted once, with a warning;
* a run directory whose summary.json or run.json is empty, not JSON, of a schema version this code does not
  read (schema 1, or a newer one) or without a key it needs is left out with a warning saying which run is
  missing and why; reading such a file anyway could give wrong numbers;
* a run directory without a readable steps.parquet stays in the tables and is left out of the step-level
  analyses (throughput model, latency figures), with a warning;
* a run whose steps have no per-step times (an engine that runs its own loop, vLLM: ``draft_s``, ``verify_s``
  and ``overhead_s`` are null) stays in the tables, the acceptance figures included, and is left out of the
  analyses of step times (``timed_steps``: latency breakdown, throughput model, cost per token, draft latency),
  with one warning saying why;
* load.jsonl (a run under load, ``specbench.results.load``) is read into ``LoadedRuns.load``, one row per level
  and role, by the reader resuming uses too (``read_load_lines``): a line that is not a level (garbled, not an
  object, no role, a concurrency that is not a number, an impossible figure), repeats a (concurrency, role), or
  was measured over other questions or after another warm-up than the file's first is left out, named in one
  warning per file, exactly as resuming leaves it out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from specbench.measure import metrics
from specbench.measure.stalls import STALLED, describe, stall_verdict
from specbench.questions import task_of
from specbench.errors import SpecbenchError, damage_reason
from specbench.results.question_keys import question_key
from specbench.results.load import read_load_lines
from specbench.results.readers import (read_json_file, read_jsonl_records, read_result_lines, read_run_results,
                                       run_question_ids)
from specbench.results.schema import STEP_COLUMNS, SUMMARY_KEYS, SUPPORTED_SCHEMAS, TIMING_FIELDS
from specbench.results.validation import BASELINE_ANSWER, SPEC_BENCH_METHOD, LineKind, record_problem
from specbench.run.identity import PLACEMENT_KEYS, implied_placement
from specbench.settings import method_name

log = logging.getLogger(__name__)

# trustworthy: summary.json's timing.trustworthy (None when the run did not check: schema 2, Spec-Bench's
# files); timing_warnings: its warnings, joined by "; ".
RUN_COLUMNS = ["run_dir", "model", "drafter", "label", "trustworthy", "timing_warnings"]
# tokens_per_s: metrics.answer_rate; accept_lengths: the per-step list (MAT needs it); accepted, steps: its sum
# and length; drafted: candidate draft tokens verified (None in records that lack the count); mismatch: how the
# answer first differs from the baseline's (near_tie, violation, not_checked), None when it does not or when
# the record does not say; draft_depths: the per-step draft depths, parallel to accept_lengths (None in records
# that lack them, unless the run's steps.parquet gives them); stalls: the answer's verdict on stalls inside it
# (``specbench.measure.stalls.stall_verdict``: stalled, no stalls, not measured, not checked), stall_detail: what
# stalled (``stalls.describe``), "" unless stalled.
QUESTION_COLUMNS = [*RUN_COLUMNS, "question_id", "task", "category", "tokens", "seconds", "tokens_per_s",
                    "baseline_tokens", "baseline_seconds", "baseline_tokens_per_s", "identical", "mismatch",
                    "accept_lengths", "accepted", "steps", "drafted", "draft_depths", "stalls", "stall_detail"]

# Schema 2 wrote the run.* settings flat at the top of run.json; schema 3 nests them under "run". These are
# the flat keys that are run.* settings, so both layouts flatten to the same names.
SCHEMA2_RUN_KEYS = ("max_new_tokens", "temperature", "top_p", "seed", "baseline", "verify_padding", "draft_budget",
                    "linear_backend")
SCHEMA2_RENAMED = {"question_file": "task.path"}
# Recorded for the record only: a new commit or patch release of Python does not make another configuration.
# schema_version is the file's format, not a setting (a schema-2 and a schema-3 run can be repeats).
NOT_CONFIGURATION_KEYS = ("schema_version", "environment.git_sha", "environment.python")
# The software and machine facts that change results, under their run.json (schema 3) names; schema 2 kept
# them in summary.json's environment, where the device's name is "device" (run.json's "device" is "cpu").
ENVIRONMENT_KEYS = {"torch": "torch", "transformers": "transformers", "specbench": "specbench",
                    "device": "device_name", "device_name": "device_name"}
TIMING_OK, TIMING_UNTRUSTED, TIMING_UNCHECKED = "ok", "UNTRUSTED", "unchecked"


def find_run_dirs(paths, problems: list[str] | None = None) -> list[Path]:
    """Every directory at or below ``paths`` that holds a ``summary.json``, once each, sorted. A run is one run
    however it is reached: ``DIR`` and ``DIR/`` and ``./DIR`` typed twice, a symlink to it, or a folder and a
    run inside it, all resolve to one real directory, listed once (under the first path that reached it) with
    one warning naming every way it was reached. Symlinked folders are followed, each real folder walked once
    per path given; a folder that cannot be read is named in a warning (its runs are missing)."""
    problems = [] if problems is None else problems
    found: dict[Path, list[tuple[int, Path]]] = {}  # real path -> (which path given, the path that reached it)

    def reach(index: int, run_dir: Path) -> None:
        ways = found.setdefault(run_dir.resolve(), [])
        if (index, run_dir) not in ways:
            ways.append((index, run_dir))

    def unreadable(error: OSError) -> None:
        _problem(problems, f"{error.filename}: cannot be read ({error.strerror}); the runs under it are left out")

    for index, path in enumerate(map(Path, paths)):
        walked: set[Path] = set()
        for folder, names, files in os.walk(path, onerror=unreadable, followlinks=True):
            real = Path(folder).resolve()
            if real in walked:  # a symlink loop, or a folder reached twice under this path
                names[:] = []
                continue
            walked.add(real)
            names.sort()
            if "summary.json" in files:
                reach(index, Path(folder))
    for ways in found.values():
        if len(ways) > 1:
            shown = [f"{paths[index]!s} (as {run_dir})" if str(run_dir) != str(paths[index]) else str(paths[index])
                     for index, run_dir in ways]
            _problem(problems, f"run {ways[0][1].resolve()} is reached {len(ways)} times, by {', '.join(shown)}: "
                               "one run, counted once")
    return sorted(ways[0][1] for ways in found.values())


def check_schema(document: dict, path: Path, required: tuple[str, ...]) -> int:
    """``document``'s schema_version, after checking that this code reads it and that ``required`` keys are
    there; a one-line SpecbenchError naming ``path`` otherwise."""
    supported = ", ".join(map(str, SUPPORTED_SCHEMAS))
    version = document.get("schema_version")
    if isinstance(version, bool) or version not in SUPPORTED_SCHEMAS:
        found = "has no schema_version" if "schema_version" not in document else f"has schema_version {version!r}"
        newer = isinstance(version, int) and not isinstance(version, bool) and version > max(SUPPORTED_SCHEMAS)
        hint = ("written by a newer specbench: update this checkout" if newer
                else "not a specbench result file of a version this analysis reads")
        raise SpecbenchError(f"{path} {found}; this analysis reads schema versions {supported} ({hint})")
    missing = [key for key in required if key not in document]
    if missing:
        raise SpecbenchError(f"{path} (schema_version {version}) lacks {', '.join(map(repr, missing))}; the file is "
                             f"incomplete (supported schema versions: {supported})")
    return version


def read_summary(run_dir: Path) -> dict:
    """The run's summary.json, checked (``check_summary``)."""
    path = Path(run_dir) / "summary.json"
    summary = read_json_file(path, "run's summary")
    check_summary(summary, path)
    return summary


def check_summary(summary: dict, path: Path) -> None:
    """A supported schema version, with model, drafter and per-task statistics, and a timing verdict that says
    true or false when there is one; a one-line SpecbenchError naming ``path`` otherwise."""
    check_schema(summary, path, ("model", "drafter", "tasks"))
    tasks = summary["tasks"]
    if not isinstance(tasks, dict) or not all(isinstance(stats, dict) for stats in tasks.values()):
        raise SpecbenchError(f"{path}: 'tasks' is not an object of per-task statistics; the file is damaged")
    timing = summary.get("timing")
    if timing is not None and not (isinstance(timing, dict) and isinstance(timing.get("trustworthy"), bool)):
        raise SpecbenchError(f"{path}: 'timing' has no true/false 'trustworthy'; the file is damaged")


def read_run_json(run_dir: Path) -> dict:
    """The run's run.json as written (either schema's layout), checked; empty when the run has none."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return {}
    settings = read_json_file(path, "run's settings")
    check_schema(settings, path, ("model", "drafter"))
    return settings


def compatible_settings(settings: dict) -> dict:
    """run.json in schema 2's shape whichever schema wrote it: schema 3's run.* settings also at the top level
    (where ``settings.get("temperature")`` finds them). The top-level keys win: its ``threads`` is the thread
    count the run used, run.threads only the configured one (None: the default)."""
    nested, task = settings.get("run"), settings.get("task")
    if not isinstance(nested, dict):
        return dict(settings)
    return {**nested, "question_file": task.get("path") if isinstance(task, dict) else None, **settings}


def run_settings(run_dir: Path) -> dict:
    """The run's run.json (empty when it has none), in schema 2's shape (``compatible_settings``)."""
    return compatible_settings(read_run_json(run_dir))


def _text(value) -> str:
    """A setting as comparable text: 0.0 and 0 read the same, as do schema 2's and 3's JSON for one value."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _flatten(node, prefix: str, flat: dict[str, str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), flat)
    else:
        flat[prefix] = _text(node)


def flat_settings(settings: dict, summary_environment: dict | None = None) -> dict[str, str]:
    """The result-affecting settings of a run.json of either layout, as {dotted key: value as text}:
    "run.temperature", "dtype", "threads", "drafter.gamma", "model_config.num_layers", "environment.torch", ...

    Schema 2's flat run keys get their schema-3 names ("temperature" -> "run.temperature", "question_file" ->
    "task.path"), so runs of equal settings written by either compare equal on the keys both record. Schema 2
    kept the software versions and the device's name in summary.json's environment: pass it as
    ``summary_environment`` to have them too (ignored when run.json has its own). environment.git_sha,
    environment.python and schema_version are left out (they do not change results); so is task.path when
    the question file's content digest is recorded (the same questions read from another path are the same
    benchmark).

    >>> flat_settings({"schema_version": 2, "temperature": 0.0, "drafter": {"name": "pld", "gamma": 4}})
    {'run.temperature': '0', 'drafter.name': 'pld', 'drafter.gamma': '4'}
    """
    nested = isinstance(settings.get("run"), dict)
    flat: dict[str, str] = {}
    for key, value in settings.items():
        if not nested and key in SCHEMA2_RUN_KEYS:
            key = f"run.{key}"
        elif not nested and key in SCHEMA2_RENAMED:
            key = SCHEMA2_RENAMED[key]
        _flatten(value, key, flat)
    environment = settings.get("environment")
    if not isinstance(environment, dict):
        environment = summary_environment or {}
    for key in [key for key in flat if key.startswith("environment.")]:
        del flat[key]
    for key, value in environment.items():
        if key in ENVIRONMENT_KEYS:
            flat[f"environment.{ENVIRONMENT_KEYS[key]}"] = _text(value)
        elif key not in ("dtype", "threads"):  # schema 2's summary repeats these; run.json has them at the top
            flat[f"environment.{key}"] = _text(value)
    if flat.get("task.content_sha256") not in (None, "null"):
        flat.pop("task.path", None)
    for key in NOT_CONFIGURATION_KEYS:
        flat.pop(key, None)
    return flat


def run_label(summary: dict, settings: dict) -> str:
    """The name a run is shown under: its method's name (``hd``, ``hd+budget``: drafter plus specbench's
    tunings), with the temperature when it samples (``pld T=0.7``). Summaries written before the method name
    was recorded get it from run.json's tuning switches (``settings``, either layout)."""
    settings = compatible_settings(settings)
    method = summary.get("method")
    if not method:
        method = method_name(summary["drafter"], settings.get("draft_budget", "off"),
                             settings.get("verify_padding", "off"), settings.get("regime", "eager"))
    temperature = settings.get("temperature") or 0.0
    return method if temperature == 0 else f"{method} T={temperature:g}"


def sweep_overrides(run_dir: Path) -> dict[str, str]:
    """The drafter overrides of a sweep job (``.hydra/overrides.yaml``), as {key without "drafter.": value}."""
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    if not overrides_file.is_file():
        return {}
    try:
        overrides = yaml.safe_load(overrides_file.read_text()) or []
        if not isinstance(overrides, list):
            raise ValueError("not a list of overrides")
    except Exception as error:  # yaml's ScannerError and ParserError, OSError, not UTF-8, a mapping: damaged
        # Hydra writes this file; one damaged copy must not stop the analysis of the other runs
        log.warning("%s is damaged (%s); the run is shown without its drafter overrides", overrides_file,
                    damage_reason(error))
        return {}
    found = {}
    for override in overrides:
        key, _, value = str(override).lstrip("+~").partition("=")
        if key.startswith("drafter.") and key != "drafter.name":
            found[key.removeprefix("drafter.")] = value
    return found


def drafter_settings(settings: dict) -> dict[str, str]:
    """The drafter's resolved settings that run.json (``settings``) recorded, flattened:
    {"statistics_corpus": "sharegpt", "model_db_build.max_prompts": "96", ...}."""
    drafter = settings.get("drafter")
    flat: dict[str, str] = {}
    _flatten(drafter if isinstance(drafter, dict) else {}, "", flat)
    flat.pop("name", None)
    return flat


def run_timing(summary: dict) -> tuple[bool | None, list[str]]:
    """summary.json's timing verdict: (trustworthy, warnings); (None, []) when the run did not check (schema 2)."""
    timing = summary.get("timing")
    if not timing:
        return None, []
    return bool(timing["trustworthy"]), [str(warning) for warning in timing.get("warnings") or []]


def timing_flag(trustworthy) -> str:
    """One run's timing as shown: "ok", "UNTRUSTED" (timed on a busy machine), "unchecked" (not recorded)."""
    if trustworthy is None or (not isinstance(trustworthy, str) and pd.isna(trustworthy)):
        return TIMING_UNCHECKED
    return TIMING_OK if bool(trustworthy) else TIMING_UNTRUSTED


def timing_warnings_text(joined, shown: int = 5) -> str:
    """A run's timing_warnings ("; "-joined) cut to the first ``shown``: a busy machine can flag every question."""
    warnings = [warning for warning in (joined if isinstance(joined, str) else "").split("; ") if warning]
    if not warnings:
        return "no reason recorded"
    return "; ".join(warnings[:shown]) + (f" (and {len(warnings) - shown} more)" if len(warnings) > shown else "")


def untrusted_runs(frame: pd.DataFrame) -> list[str]:
    """One line per run of ``frame`` (any table with the run columns) whose timings summary.json flags as
    untrustworthy: "model label (run_dir): warnings"."""
    if frame.empty or "trustworthy" not in frame:
        return []
    return [f"{row.model} {row.label} ({row.run_dir}): {timing_warnings_text(row.timing_warnings)}"
            for row in frame.drop_duplicates("run_dir").itertuples()
            if timing_flag(row.trustworthy) == TIMING_UNTRUSTED]


def answer_record_problem(record, needed: tuple[str, ...]) -> str | None:
    """What keeps ``record`` from being a model_answer record with ``choices[0]``'s ``needed`` lists, or None
    (``specbench.results.validation.record_problem``, the one check every reader of results shares)."""
    return record_problem(record, LineKind(needed))


def check_answer_records(records: list[dict], path: Path, needed: tuple[str, ...]) -> None:
    """A one-line SpecbenchError naming ``path`` and the first record that is not a model_answer record with
    ``choices[0]``'s ``needed`` lists (new_tokens and wall_time at least), or when there is none."""
    if not records:
        raise SpecbenchError(f"{path} holds no answer records")
    for number, record in enumerate(records, start=1):
        problem = answer_record_problem(record, needed)
        if problem:
            known_id = isinstance(record, dict) and "question_id" in record
            which = f" (question_id {record['question_id']})" if known_id else ""
            raise SpecbenchError(f"{path}: record {number}{which} {problem}; expected model_answer records with "
                                 f"choices[0].{', '.join(needed)}")


METHOD_NEEDS = SPEC_BENCH_METHOD.choice_lists
BASELINE_NEEDS = BASELINE_ANSWER.choice_lists


def _ids_digest(question_keys: frozenset) -> str:
    return hashlib.sha256(json.dumps(sorted(question_keys)).encode()).hexdigest()[:6]


@dataclass
class _Run:
    """One run directory as read: its files' contents, the settings that tell repeats apart, its row info."""

    path: Path
    summary: dict
    settings: dict
    compared: dict[str, str]
    answers: list[dict] | None  # None: no answers.jsonl
    baseline: list[dict] | None  # None: no baseline_answers.jsonl
    steps: pd.DataFrame | None  # None: no readable steps.parquet (steps_problem says why)
    steps_problem: str | None = None
    info: dict = field(default_factory=dict)

    @property
    def question_ids(self) -> frozenset:
        """The questions it answered, by ``question_key``."""
        return frozenset(question_key(record["question_id"]) for record in self.answers or [])

    @property
    def answer_ids(self) -> set[str]:
        """The answer_id of each answer (a uuid written once per answer): what makes a copy of the run one."""
        return {record["answer_id"] for record in self.answers or [] if isinstance(record.get("answer_id"), str)}


def _read_run(run_dir: Path, problems: list[str]) -> _Run | None:
    """``run_dir`` read and checked, or None (with the reason appended to ``problems`` and logged) when its
    summary.json or run.json is damaged or of a schema this code does not read: one such run among others is
    left out rather than stopping the tables of the rest. Its answer files and steps are read as resuming
    reads them (``specbench.results.readers.read_run_results``): lines that are not well-formed records of this run,
    repeats and unfinished questions are left out, each file's named in one warning."""
    settings_file = run_dir / "run.json"
    try:
        summary = read_json_file(run_dir / "summary.json", "run's summary")
        settings = read_json_file(settings_file, "run's settings") if settings_file.is_file() else {}
        check_summary(summary, run_dir / "summary.json")
        if settings_file.is_file():  # runs written before run.json existed have none: their settings are unknown
            check_schema(settings, settings_file, ("model", "drafter"))
        results = read_run_results(run_dir, (run_dir / "baseline_answers.jsonl").is_file(),
                                   run_question_ids(settings), steps_required=False)
    except SpecbenchError as error:
        _problem(problems, f"{error}: run {run_dir} left out")
        return None
    problems += results.warnings  # logged where they were found
    environment = summary.get("environment")
    compared = flat_settings(settings, environment if isinstance(environment, dict) else None)
    compared.update({f"drafter.{key}": value for key, value in sweep_overrides(run_dir).items()})
    if settings:  # a run.json that predates the placement keys: what it implies, "unrecorded" where nothing
        compared.update(implied_placement(settings))
    trustworthy, warnings = run_timing(summary)
    info = {"run_dir": str(run_dir), "model": summary["model"], "drafter": summary["drafter"],
            "label": run_label(summary, settings), "trustworthy": trustworthy, "timing_warnings": "; ".join(warnings)}
    return _Run(run_dir, summary, settings, compared, results.answers if results.has_answers else None,
                results.baseline if results.has_baseline else None, results.steps, results.steps_problem, info)


def _drop_copies(runs: list[_Run], problems: list[str]) -> list[_Run]:
    """The runs without copies of another: a run directory copied elsewhere has the same answers (each answer
    record's answer_id is written once), and counting both would make one run two repeats. The first is kept."""
    kept: list[_Run] = []
    owner: dict[str, _Run] = {}
    for run in runs:
        ids = run.answer_ids
        earlier = next((owner[answer] for answer in ids if answer in owner), None)
        if earlier is not None:
            shared = len(ids & earlier.answer_ids)
            _problem(problems, f"run {run.path} holds {shared} of the answers of run {earlier.path} (the same "
                               "answer_id: a copy of it): one run, counted once; "
                               f"{run.path} left out")
            continue
        owner.update(dict.fromkeys(ids, run))
        kept.append(run)
    return kept


def _problem(problems: list[str], text: str) -> None:
    problems.append(text)
    log.warning("%s", text)


def _split_labels(runs: list[_Run], notes: list[str]) -> None:
    """Give runs of one model and label that are not repeats of one configuration labels of their own.

    Runs are repeats when every compared setting that both record is equal and they answered the same
    questions. Within a (model, label) group, a setting "differs" when the runs that record it hold more than
    one value; each run's label gets every differing setting (``key=value``, "-" where the run does not record
    it; drafter settings without their "drafter." prefix, as sweeps name them) and, when the runs answered
    different question sets, ``questions=N`` (plus a digest of the ids when two sets of N differ). A key only
    some runs record is not a difference by itself: a schema-2 run lacks schema 3's new keys but may well be
    a repeat of a schema-3 run."""
    groups: dict[tuple, list[_Run]] = {}
    for run in runs:
        groups.setdefault((run.info["model"], run.info["label"]), []).append(run)
    for (model, label), members in groups.items():
        if len(members) < 2:
            continue
        keys = sorted({key for run in members for key in run.compared} - {"model", "drafter.name"})
        differing = [key for key in keys if len({run.compared[key] for run in members if key in run.compared}) > 1
                     and _placement_told(key, members)]
        id_sets = {run.question_ids for run in members}
        if not differing and len(id_sets) == 1:
            continue
        sizes = Counter(len(ids) for ids in id_sets)
        for run in members:
            parts = [f"{key.removeprefix('drafter.')}={run.compared.get(key, '-')}" for key in differing]
            if len(id_sets) > 1:
                ids = run.question_ids
                parts.append(f"questions={len(ids)}" + (f"#{_ids_digest(ids)}" if sizes[len(ids)] > 1 else ""))
            run.info["label"] = " ".join([label, *parts])
        what = [key.removeprefix("drafter.") for key in differing] + (["questions"] if len(id_sets) > 1 else [])
        shown = sorted({run.info["label"] for run in members})
        note = (f"{model} {label}: its {len(members)} runs are not all repeats (they differ in {', '.join(what)}); "
                f"shown apart as {', '.join(repr(name) for name in shown)}")
        notes.append(note)
        log.info("%s", note)


def _placement_told(key: str, members: list[_Run]) -> bool:
    """Whether ``key`` can tell these runs apart: any key but a placement key (``specbench.run.identity``), and a
    placement key when some run records it. Among runs that all predate those keys, what their other settings
    imply follows from settings that already differ, so it would only lengthen the labels."""
    return key not in PLACEMENT_KEYS or any(key in run.settings for run in members)


def _read_runs(run_dirs: list[Path], problems: list[str], notes: list[str]) -> list[_Run]:
    runs = [run for run in (_read_run(run_dir, problems) for run_dir in run_dirs) if run is not None]
    runs = _drop_copies(runs, problems)
    _split_labels(runs, notes)
    return runs


def run_infos(run_dirs: list[Path]) -> dict[Path, dict]:
    """The run columns (RUN_COLUMNS) of each readable run: run_dir, model, drafter, label, timing. Runs of one
    model whose labels coincide but that are not repeats of one configuration (another drafter, dtype, thread
    count, software version, question set, ...) get what differs appended to their labels (``_split_labels``);
    repeats keep one label and are averaged together by the tables."""
    return {run.path: run.info for run in _read_runs(list(run_dirs), [], [])}


# One row per (run, concurrency, role) of the runs' load.jsonl: the run columns, then the level's fields, its
# {mean, p50, p90, p99} distributions flattened (ttft_s_p50, tpot_s_mean, ...).
DISTRIBUTIONS = ("ttft_s", "tpot_s", "latency_s")
DISTRIBUTION_KEYS = ("mean", "p50", "p90", "p99")
LOAD_LEVEL_COLUMNS = ["concurrency", "role", "method", "requests", "output_tokens", "duration_s",
                      "output_tokens_per_s", "requests_per_s",
                      *(f"{name}_{key}" for name in DISTRIBUTIONS for key in DISTRIBUTION_KEYS),
                      "mean_acceptance_length", "per_position_acceptance_rate", "identical_to_baseline"]
# What a proposer drafting inside the engine's steps did (engine=vllm-custom's ``proposer``), flattened; None otherwise.
PROPOSER_KEYS = ("draft_s", "draft_ms_per_call")
LOAD_COLUMNS = [*RUN_COLUMNS, *LOAD_LEVEL_COLUMNS, *(f"proposer_{key}" for key in PROPOSER_KEYS)]

# Why a run is left out of the analyses of step times when none of its steps has them.
NO_STEP_TIMES = "no per-step times: recorded by an engine that does not expose them"
STEP_TIME_ANALYSES = "latency breakdown, throughput model, cost per token, draft latency"


@dataclass
class LoadedRuns:
    """What ``load_runs`` read: per-question rows, step rows, the load levels of runs under load (LOAD_COLUMNS;
    empty when no run has load.jsonl), and the messages a reader must see: problems (runs or files left out, and
    why) and notes (labels split because their runs are not repeats)."""

    questions: pd.DataFrame
    steps: pd.DataFrame
    problems: list[str]
    notes: list[str]
    load: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LOAD_COLUMNS))


def untimed_runs(steps: pd.DataFrame) -> dict[str, str]:
    """The runs of ``steps`` (run_dir -> why) whose step times (``TIMING_FIELDS``) cannot be used: NO_STEP_TIMES
    when no step has them (an engine that reports what each step accepted but not how long it took), "k of n
    steps have no per-step times" when only some lack them (their sums would silently leave those steps out)."""
    if steps.empty or not all(column in steps for column in ("run_dir", *TIMING_FIELDS)):
        return {}
    lacking = steps[list(TIMING_FIELDS)].isna().any(axis=1)
    found = {}
    for run_dir, missing in lacking.groupby(steps.run_dir, sort=False):
        if missing.all():
            found[run_dir] = NO_STEP_TIMES
        elif missing.any():
            found[run_dir] = f"{int(missing.sum())} of {len(missing)} steps have no per-step times"
    return found


def timed_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` without the runs whose step times cannot be used (``untimed_runs``): what every analysis of
    step times reads (the warning saying so is ``load_runs``')."""
    untimed = untimed_runs(steps)
    return steps[~steps.run_dir.isin(list(untimed))] if untimed else steps


def _load_rows(run: _Run, problems: list[str]) -> list[dict]:
    """The rows of the run's load.jsonl (LOAD_COLUMNS): its levels as the one reader resuming uses too keeps them
    (``specbench.results.load.read_load_lines``: a damaged line, an impossible figure, a repeated level, a level
    over other questions or warmed otherwise than the first is left out), the others named in one warning."""
    rows = []
    lines = read_load_lines(run.path)
    for level in lines.levels:
        row = {**run.info, **{key: level.get(key) for key in LOAD_LEVEL_COLUMNS}}
        for name in DISTRIBUTIONS:
            row.update({f"{name}_{key}": level[name].get(key) for key in DISTRIBUTION_KEYS})
        proposer = level.get("proposer") or {}
        row.update({f"proposer_{key}": proposer.get(key) for key in PROPOSER_KEYS})
        rows.append(row)
    if lines.warning() is not None:
        _problem(problems, lines.warning())
    return rows


def _run_steps(run: _Run, problems: list[str]) -> pd.DataFrame | None:
    """The run's step rows, or None with a warning that it is left out of the step-level analyses."""
    if run.steps is None:
        _problem(problems, f"{run.steps_problem}: run {run.path} is left out of the step-level analyses")
        return None
    return run.steps.copy()


def load_runs(paths, with_steps: bool = True, step_times: bool = True) -> LoadedRuns:
    """Every run directory at or below ``paths``, read once: per-question rows (QUESTION_COLUMNS), the levels of
    runs under load (LOAD_COLUMNS), and with ``with_steps`` every step record with the run columns in front.
    ``step_times``: the caller analyses step times, so each run whose steps lack them (``untimed_runs``) gets
    one warning saying it is left out of those analyses. Problems and notes are also logged."""
    problems, notes = [], []
    runs = _read_runs(find_run_dirs(paths, problems), problems, notes)
    rows, frames, levels = [], [], []
    for run in runs:
        run_rows = question_rows(run.answers, run.baseline, run.info) if run.answers is not None else []
        rows += run_rows
        levels += _load_rows(run, problems)
        if with_steps:
            frame = _run_steps(run, problems)
            # A run whose every question was skipped has an empty steps.parquet whose columns are all of object
            # dtype: concatenated, it would turn every other run's timings into objects and break the figures.
            if frame is not None and not frame.empty:
                fill_draft_depths(run_rows, frame)
                for column, value in reversed(list(run.info.items())):
                    frame.insert(0, column, [value] * len(frame))
                # an engine without per-step times: nulls, as float NaN (never objects, never zeros)
                frame = frame.astype({column: "float64" for column in TIMING_FIELDS})
                frames.append(frame)
                why = untimed_runs(frame).get(str(run.path)) if step_times else None
                if why:
                    _problem(problems, f"run {run.path}: {why}; left out of the analyses of step times "
                                       f"({STEP_TIME_ANALYSES}), kept in the tables")
    questions = pd.DataFrame(rows, columns=QUESTION_COLUMNS)
    steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*RUN_COLUMNS, *STEP_COLUMNS])
    return LoadedRuns(questions, steps, problems, notes, pd.DataFrame(levels, columns=LOAD_COLUMNS))


def fill_draft_depths(rows: list[dict], steps: pd.DataFrame) -> None:
    """Give the question rows whose records carry no draft depths (runs written before specbench recorded
    them) those of the run's step records, in turn and step order, where they are as many as the accept
    lengths (a question whose steps are incomplete keeps None)."""
    missing = [row for row in rows if row["draft_depths"] is None]
    if not missing or steps.empty:
        return
    ordered = steps.sort_values(["turn", "step"], kind="stable")
    depths = {key: list(map(int, group.draft_depth))
              for key, group in ordered.groupby(ordered.question_id.map(question_key), sort=False)}
    for row in missing:
        found = depths.get(question_key(row["question_id"]))
        if found is not None and len(found) == len(row["accept_lengths"]):
            row["draft_depths"] = found


def load_questions(paths) -> pd.DataFrame:
    """One row per (run, question): the method's and the paired baseline's tokens and seconds."""
    return load_runs(paths, with_steps=False).questions


def load_summaries(paths) -> pd.DataFrame:
    """One row per (run, task) with the run's columns and the summary's statistics."""
    rows = []
    for run in _read_runs(find_run_dirs(paths), [], []):
        for task, stats in run.summary["tasks"].items():
            rows.append({**run.info, "task": task, **{key: stats.get(key) for key in SUMMARY_KEYS}})
    return pd.DataFrame(rows, columns=[*RUN_COLUMNS, "task", *SUMMARY_KEYS])


def load_steps(paths) -> pd.DataFrame:
    """Every step record of every run, with the run's columns added."""
    return load_runs(paths).steps


def read_jsonl(path: Path) -> list[dict]:
    """The records of a run's .jsonl result file that count (``specbench.results.readers.read_jsonl_records``: every
    other line, a half-written last one included, is named in one warning and left out)."""
    return read_jsonl_records(path)


def record_task(record: dict) -> str:
    """The Spec-Bench task of an answer record: specbench's own field, else the one its category maps to,
    else the category itself."""
    return (record.get("specbench") or {}).get("task") or task_of(record["category"]) or record["category"]


def question_rows(answers: list[dict], baseline: list[dict] | None, info: dict) -> list[dict]:
    """Per-question rows from model_answer records (specbench's or Spec-Bench's schema). Tokens are the
    recorded new_tokens on both sides, so method and baseline are counted the same way; rates come from
    ``specbench.measure.metrics``. Keys that only specbench's records carry (task, identical, mismatch, drafted) are
    None when absent, except the task, which then follows from the category."""
    by_id = {question_key(record["question_id"]): record for record in baseline or []}
    info = {"trustworthy": None, "timing_warnings": "", **info}
    rows = []
    for record in answers:
        choice = record["choices"][0]
        base = by_id.get(question_key(record["question_id"]))
        extra = record.get("specbench") or {}
        task = record_task(record)
        lengths = metrics.answer_accept_lengths(record)
        stalls = stall_verdict(extra)
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
            "draft_depths": metrics.answer_draft_depths(record),
            "stalls": stalls, "stall_detail": describe(extra["stalls"]) if stalls == STALLED else "",
        })
    return rows


def _read_spec_bench_file(path: Path, kind: LineKind, role: str) -> list[dict]:
    """One --spec-bench file's records that count, read as a run's answer files are (lines that are not
    model_answer records, or repeat a question, named in one warning and left out); a one-line SpecbenchError
    naming it when it is missing or nothing in it counts."""
    advice = "expected Spec-Bench's model_answer .jsonl, the output of its evaluation/inference_*.py"
    if not path.exists():
        raise SpecbenchError(f"--spec-bench {role} file {path} not found")
    if not path.is_file():
        raise SpecbenchError(f"--spec-bench {role} file {path} is not a file; {advice}")
    lines = read_result_lines(path, kind)
    if not lines.records:
        reasons = ([f"line {number} {why}" for number, why in sorted(lines.left_out)[:1]]
                   + (["its last line is incomplete"] if lines.cut else []))
        what = f"no usable model_answer records ({reasons[0]})" if reasons else "no answer records"
        raise SpecbenchError(f"--spec-bench {role} file {path} holds {what}; {advice} with choices[0]."
                             f"{', '.join(kind.choice_lists)}")
    warning = lines.warning()
    if warning:
        log.warning("%s", warning)
    return lines.records


def read_spec_bench(method_file: str | Path, baseline_file: str | Path, model: str, drafter: str) -> pd.DataFrame:
    """Spec-Bench's own model_answer files (``evaluation/inference_*.py`` output): a method's answers and the
    baseline's, as per-question rows that sit in one table with specbench's runs. A file that is missing, not
    JSON lines, or whose records lack choices[0].new_tokens / wall_time (and, for the method, accept_lengths)
    is a one-line SpecbenchError naming it."""
    method_file, baseline_file = Path(method_file), Path(baseline_file)
    answers = _read_spec_bench_file(method_file, SPEC_BENCH_METHOD, "method")
    baseline = _read_spec_bench_file(baseline_file, BASELINE_ANSWER, "baseline")
    unpaired = ({question_key(record["question_id"]) for record in answers}
                - {question_key(record["question_id"]) for record in baseline})
    if unpaired:
        log.warning("%s lacks %d of %s's questions (e.g. %s): their speedup is unknown", baseline_file, len(unpaired),
                    method_file, sorted(unpaired)[0])
    info = {"run_dir": str(method_file), "model": model, "drafter": drafter, "label": drafter}
    return pd.DataFrame(question_rows(answers, baseline, info), columns=QUESTION_COLUMNS)
