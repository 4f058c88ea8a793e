"""What makes two sessions of a run directory the same run, recorded in its run.json: every result setting of
the configuration (``config_settings``), what the loaded engine is (``Engine.run_settings``: the model's source and weights,
how it runs, the software) and how the run was placed (``planned_settings`` and the engine's placement keys). A session that differs in any of them is refused
before anything is written (``check_resumable`` before loading, ``RunDirectory.open`` after).

How a run was placed: how many processes ran it (``processes``), how its target's weights were placed
(``placement``: single, device_map or tensor_parallel), the devices its target uses (``devices``; under tensor
parallelism rank 0's, each process using one of its own) and the linear kernels it ran on
(``linear_backend_used``: ``run.linear_backend=auto`` resolved, which depends on the dtype, the device and the
torch build). Each of these changes timings without changing the configuration's other keys (two processes of a
2-way tensor-parallel run, four GPUs of a ``device_map=auto`` instead of two), so each is part of the run's
identity: a resumed run must match them and analysis keeps runs that differ in them apart (``analysis.runs``).
Run directories written before these keys were recorded get what their other settings imply
(``implied_placement``), and ``UNRECORDED`` where they imply nothing.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.questions import Prompt
from specbench.results.load import finished_levels
from specbench.results.readers import read_json_file
from specbench.results.resumable import resume_refusal
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import SCHEMA_VERSION
from specbench.targets.choice import recorded_target

# Known before the model is loaded (checked before anything is loaded) ...
PLANNED_KEYS = ("processes",)
# ... and once it is.
LOADED_KEYS = ("placement", "devices", "linear_backend_used")
PLACEMENT_KEYS = PLANNED_KEYS + LOADED_KEYS
UNRECORDED = "unrecorded"


# Keys of the model, drafter, task and run groups that change neither outputs nor timings, and why. Every
# other resolved key of those groups goes into run.json and must match for a run directory to be
# resumed (tests/test_run_safety.py checks that every key of every config is covered, so a new key is recorded
# unless it is listed here). The engine group's are its engine's to say (``EngineSettings.NOT_RESULT_SETTINGS``).
NOT_RESULT_SETTINGS = {
    "model.cache_dir": "where the converted copy is kept; its content is checked by checksum",
    "drafter.cache_dir": "where databases are cached; they are keyed by content",
    "task.name": "a label",
    "task.tasks": "selects questions: a run directory can be extended to more tasks",
    "task.limit_per_task": "selects questions: a run directory can be extended to more questions",
    "task.min_prompt_tokens": "selects questions by prompt length: a run directory can be extended to more questions",
    "task.max_prompt_tokens": "selects questions by prompt length: a run directory can be extended to more questions",
    # Each answer records the rule it was judged by (specbench.stalls.rule), so a resumed run may judge by another.
    "run.stall_factor": "judges the timings, changes none of them (stalls inside a question)",
    "run.stall_min_s": "judges the timings, changes none of them (stalls inside a question)",
    "run.stall_share": "judges the timings, changes none of them (stalls inside a question)",
}
# run.regime and the settings only the compiled regime reads: recorded when the regime is not eager.
REGIME_KEYS = ("regime", "compile_buckets", "compile_mode")
# run.json's name for each config group.
RESULT_GROUPS = {"model": "model_config", "drafter": "drafter", "run": "run", "task": "task"}


def question_file_digest(path: str | None, tasks=()) -> str | None:
    """SHA-256 of the question file's content (when ``path`` is None, the built-in sample set's, or, when ``tasks``
    select ``longdoc``, the set written from the corpus; None for a hub dataset, whose id and revision name it, and
    for a folder): an edited file is another benchmark."""
    from specbench.long_context.documents import LONGDOC, longdoc_path
    from specbench.questions import SAMPLE_QUESTIONS
    from specbench.storage.manifest import file_digest

    if path is None:
        written = longdoc_path() if LONGDOC in tasks else None
        if written is not None and written.is_file():  # written by the run's reading of its questions
            return file_digest(written)
        return file_digest(SAMPLE_QUESTIONS)
    local = Path(path).expanduser()
    return file_digest(local) if local.is_file() else None


def config_settings(cfg: DictConfig, engine: dict | None) -> dict:
    """The part of run.json that the configuration alone fixes, derived from it: every resolved key of the
    model, drafter, run and task groups except NOT_RESULT_SETTINGS, plus the question file's content digest, and
    ``engine``: the engine's own settings that make the run (``EngineSettings.identity``), recorded under "engine"
    unless None (the specbench loop's run.json has none, as no run directory written before engines were a config
    group has)."""
    settings = {"schema_version": SCHEMA_VERSION, "model": cfg.model.name}
    for group, key in RESULT_GROUPS.items():
        node = OmegaConf.to_container(cfg[group], resolve=True)
        settings[key] = {name: value for name, value in node.items() if f"{group}.{name}" not in NOT_RESULT_SETTINGS}
    settings["task"]["content_sha256"] = question_file_digest(cfg.task.path, list(cfg.task.tasks))
    # The model's Target is recorded only when it is not the transformers one, which every run directory written
    # before the model config named its Target ran (so those still resume, and compare equal in analysis).
    # The regime's keys likewise only off the default: every run directory written before them ran eagerly.
    if settings["run"].get("regime", "eager") == "eager":
        for key in REGIME_KEYS:
            settings["run"].pop(key, None)
    target = recorded_target(settings["model_config"].pop("target", None))
    if target is not None:
        settings["model_config"]["target"] = target
    if engine is not None:
        settings["engine"] = engine
    return settings


def earlier_settings(output_dir: str | Path) -> dict | None:
    """The run.json of ``output_dir`` (None when there is none), refused with one line when it was written by
    an incompatible version of specbench or is damaged."""
    settings_file = Path(output_dir) / "run.json"
    if not settings_file.is_file():
        return None
    earlier = read_json_file(settings_file, "settings file of the run in that directory")
    if earlier.get("schema_version") != SCHEMA_VERSION:
        raise SpecbenchError(
            f"{output_dir} holds a run written by another version of specbench (run.json schema "
            f"{earlier.get('schema_version')!r}, this one writes {SCHEMA_VERSION}); it cannot be resumed: choose "
            "another hydra.run.dir (python -m analysis still reads it)")
    return earlier


def check_resumable(output_dir: str | Path, earlier: dict | None, settings: dict) -> None:
    """Refuse, without touching anything, to continue a run directory whose run.json (``earlier``) differs in
    ``settings``' keys, or that was recorded before its placement was (``unrecorded_refusal``). The rest
    (weights, dtype, devices, threads, software) is checked by RunDirectory.open once the model is loaded, before
    anything is written."""
    if earlier is None:
        return
    refusal = unrecorded_refusal(output_dir, earlier)
    if refusal is not None:
        raise refusal
    # "engine" is recorded only for an engine whose settings make the run (not the specbench loop), so a run.json
    # that has it is compared on it even when this configuration has none (a vLLM run directory resumed with
    # engine=specbench).
    refusal = resume_refusal(output_dir, earlier, settings, sorted(set(settings) | ({"engine"} & set(earlier))))
    if refusal is not None:
        raise refusal


def already_finished(output_dir: str, questions: list[Prompt], with_baseline: bool,
                     run_dir: RunDirectory | None = None, load_levels: list[int] = (),
                     paired: bool = True) -> dict | None:
    """The summary of ``output_dir`` when it already holds every selected question for these settings (unless the
    run measures no paired questions: ``paired`` false, ``EngineSettings.paired``), and every level of
    ``load_levels`` (``EngineSettings.load_levels``) for both roles, so a re-run sweep skips finished cells without
    loading anything; None otherwise. ``run_dir``: the RunDirectory the run opens afterwards, so that a bad line
    read here is not warned about twice."""
    summary_file = Path(output_dir) / "summary.json"
    if not summary_file.is_file():
        return None
    if not {(level, role) for level in load_levels for role in ("baseline", "method")} <= finished_levels(output_dir):
        return None  # an interrupted run under load, or one extended to more levels
    if paired:
        run_dir = run_dir or RunDirectory(output_dir, with_baseline=with_baseline)
        done = run_dir.finished_ids() | run_dir.skipped_ids()
        if not all(prompt.question_id in done for prompt in questions):
            return None
    return read_json_file(summary_file, "summary of the run in that directory")


def planned_settings(world_size: int) -> dict:
    """The placement settings known before loading: this job's number of processes."""
    return {"processes": int(world_size)}


def unrecorded_refusal(output_dir: str | Path, earlier: dict) -> SpecbenchError | None:
    """The one-line refusal to resume a run directory whose run.json (``earlier``) predates the placement keys,
    or None when it records them all: whether this run is placed as that one was cannot be checked."""
    missing = [key for key in PLACEMENT_KEYS if key not in earlier]
    if not missing:
        return None
    return SpecbenchError(
        f"{output_dir} holds a run recorded before specbench kept how a run is placed (its run.json lacks "
        f"{', '.join(missing)}), so whether this run is placed as that one was cannot be checked and it cannot be "
        "resumed: choose another hydra.run.dir (python -m analysis still reads it, apart from runs that record "
        "their placement)")


def implied_placement(settings: dict) -> dict[str, str]:
    """For a run.json (either schema's layout) that lacks placement keys, what its other settings imply for
    them, as text; ``UNRECORDED`` where they imply nothing. Keys it records are not returned.

    Configs without ``tp_plan`` and ``device_map`` predate both: one process, one device. A tensor-parallel run
    did not record its process count, nor a placed run its devices. ``run.linear_backend=auto`` is aten on
    anything but a float32 model on one CPU, where it depended on the torch build."""
    model_config = settings.get("model_config")
    model_config = model_config if isinstance(model_config, dict) else {}
    run = settings.get("run") if isinstance(settings.get("run"), dict) else settings  # schema 2 kept run.* flat
    if model_config.get("tp_plan") is not None:
        kind = "tensor_parallel"
    elif model_config.get("device_map") is not None:
        kind = "device_map"
    else:
        kind = "single"
    device = settings.get("device")
    backend = run.get("linear_backend")
    if backend not in ("aten", "onednn"):
        dtype = settings.get("dtype")
        off_cpu_float32 = (kind != "single" or (device is not None and device != "cpu")
                           or (device == "cpu" and dtype not in (None, "float32")))
        backend = "aten" if off_cpu_float32 else UNRECORDED
    implied = {"processes": "1" if kind != "tensor_parallel" else UNRECORDED, "placement": kind,
               "devices": str(device) if kind == "single" and device is not None else UNRECORDED,
               "linear_backend_used": backend}
    return {key: value for key, value in implied.items() if key not in settings}
