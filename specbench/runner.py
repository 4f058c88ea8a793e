"""A benchmark run: every question decoded by the method and, back to back, by the AR baseline."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import specbench
from specbench.measure import gpu_memory
from specbench.questions import Prompt, read_questions, select_questions
from specbench.decoding.budget import DraftBudget, VerifyCost
from specbench.decoding.contract import Drafter
from specbench.decoding.loop import Decoder, VerifyShapes
from specbench.decoding.sampling import Sampling
from specbench.distributed import Processes
from specbench.models.devices import resolve_device
from specbench.drafters.ar import NoDraft
from specbench.errors import SpecbenchError, damage_reason
from specbench.measure.mismatch import diagnose
from specbench.models import LoadedModel
from specbench.models.devices import driver_version, gpus_listed_by_driver, why_no_cuda
from specbench.targets.transformers import weights_fingerprint
from specbench.models.prompt_format import too_long_for_context
from specbench.config import check_config
from specbench.measure.machine import ContentionMeter, TimingCheck, is_contended, other_load, safe_threads, usable_cores
from specbench.records import (SCHEMA_VERSION, Answer, RunDirectory, read_json_file, settings_differences,
                               write_atomically)
from specbench.run_identity import loaded_placement, planned_settings, unrecorded_refusal
from specbench.runlock import RunLock
from specbench.settings import RunSettings

log = logging.getLogger(__name__)


def build(node: DictConfig, **kwargs):
    """``hydra.utils.instantiate``, letting a user-facing error from the constructor through unwrapped."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        while cause is not None and not isinstance(cause, SpecbenchError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise


class TurnTooLong(SpecbenchError):
    pass


def turn_seed(seed: int, question_id, turn: int) -> int:
    """The random seed of one turn: the same for the method and its baseline, independent of question order."""
    return zlib.crc32(f"{seed}:{question_id}:{turn}".encode())


def answer_question(
    model: LoadedModel, decoder: Decoder, drafter: Drafter, prompt: Prompt, max_new_tokens: int, on_step=None
) -> Answer:
    """Decode every turn of ``prompt``; a later turn's prompt holds the earlier turns and this decoder's own
    answers to them."""
    answer = Answer()
    # What the draft budget learned belongs to one question, so that a question measures the same whatever ran
    # before it, and a resumed run the same as an uninterrupted one.
    decoder.forget_learning()
    for turn in range(len(prompt.turns)):
        prompt_ids = model.encode_conversation(list(prompt.turns[: turn + 1]), answer.texts)
        budget = model.max_context - len(prompt_ids)
        if budget < 1:
            raise TurnTooLong(too_long_for_context(prompt.question_id, turn + 1, len(prompt_ids), model.name,
                                                   model.max_context))
        generation = decoder.generate(prompt_ids, drafter, min(max_new_tokens, budget), on_step=on_step,
                                      seed=turn_seed(decoder.sampling.seed, prompt.question_id, turn))
        answer.texts.append(model.decode(generation.token_ids))
        answer.token_ids.append(generation.token_ids)
        answer.steps.append(generation.steps)
        answer.wall_times.append(generation.wall_s)
        answer.top.append((generation.top_ids, generation.top_logits))
    return answer


def environment(model: LoadedModel) -> dict:
    """The software and machine a run runs on. On a GPU also: torch's CUDA version (``cuda``), the NVIDIA
    driver's (``cuda_driver``), how many CUDA devices the process sees (``cuda_device_count``,
    ``cuda_visible_devices``) and each GPU the target uses (``gpus``: name, memory, compute capability); those are
    None on a CPU. ``gpus_not_used`` names the GPUs nvidia-smi lists when the run is on the CPU because torch
    cannot use them, and why (None otherwise): the summary table flags it."""
    import transformers

    device = model.device
    gpus = [used for used in model.devices if used.type == "cuda"]
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = _cpu_name()
    unused = None
    if not gpus and not torch.cuda.is_available():
        listed = gpus_listed_by_driver()
        unused = {"listed": listed, "reason": why_no_cuda(listed)} if listed else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "specbench": specbench.__version__,
        "device": f"{device.type}: {device_name}",
        "dtype": str(model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "git_sha": _git_sha(),
        "cuda": torch.version.cuda if gpus else None,
        "cuda_driver": _cuda_driver() if gpus else None,
        "cuda_device_count": torch.cuda.device_count() if gpus else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES") if gpus else None,
        "gpus": [_gpu_description(used) for used in gpus] if gpus else None,
        "gpus_not_used": unused,
    }


def _gpu_description(device: torch.device) -> dict:
    properties = torch.cuda.get_device_properties(device)
    return {"device": str(device), "name": properties.name, "total_memory_bytes": int(properties.total_memory),
            "capability": f"{properties.major}.{properties.minor}"}


def _cuda_driver() -> str | None:
    """The NVIDIA driver's version from nvidia-smi; without it, the CUDA version the driver supports, as torch
    reads it ("CUDA 12.4 (driver API)")."""
    version = driver_version()
    if version is not None:
        return version
    try:
        api = int(torch._C._cuda_getDriverVersion())  # e.g. 12040; torch has no public name for it
    except (AttributeError, RuntimeError, ValueError):
        return None
    return f"CUDA {api // 1000}.{api % 1000 // 10} (driver API)" if api > 0 else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _git_sha() -> str | None:
    root = Path(specbench.__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


class LiveRate:
    """Progress-bar postfix with the tokens/s of the decode in flight, refreshed at most twice a second."""

    def __init__(self, bar: tqdm):
        self.bar = bar
        self.label = ""
        self.last_refresh = 0.0

    def __call__(self, generated: int, elapsed: float) -> None:
        now = time.monotonic()
        if now - self.last_refresh >= 0.5 and elapsed > 0:
            self.last_refresh = now
            self.bar.set_postfix_str(f"{self.label}: {generated} tok, {generated / elapsed:.1f} tok/s")


# Keys of the model, drafter and task groups that change neither outputs nor timings, and why. Every other
# resolved key of those groups and of ``run`` goes into run.json and must match for a run directory to be
# resumed (tests/test_run_safety.py checks that every key of every config is covered, so a new key is recorded
# unless it is listed here).
NOT_RESULT_SETTINGS = {
    "model.cache_dir": "where the converted copy is kept; its content is checked by checksum",
    "drafter.cache_dir": "where databases are cached; they are keyed by content",
    "task.name": "a label",
    "task.tasks": "selects questions: a run directory can be extended to more tasks",
    "task.limit_per_task": "selects questions: a run directory can be extended to more questions",
}
# run.json's name for each config group.
RESULT_GROUPS = {"model": "model_config", "drafter": "drafter", "run": "run", "task": "task"}


def question_file_digest(path: str | None) -> str | None:
    """SHA-256 of the question file's content (the built-in sample set's when ``path`` is None; None for a hub
    dataset, whose id and revision name it): an edited file is another benchmark."""
    from specbench.questions import SAMPLE_QUESTIONS
    from specbench.artefacts import file_digest

    if path is None:
        return file_digest(SAMPLE_QUESTIONS)
    local = Path(path).expanduser()
    return file_digest(local) if local.is_file() else None


def config_settings(cfg: DictConfig) -> dict:
    """The part of run.json that the configuration alone fixes, derived from it: every resolved key of the
    model, drafter, run and task groups except NOT_RESULT_SETTINGS, plus the question file's content digest."""
    settings = {"schema_version": SCHEMA_VERSION, "model": cfg.model.name}
    for group, key in RESULT_GROUPS.items():
        node = OmegaConf.to_container(cfg[group], resolve=True)
        settings[key] = {name: value for name, value in node.items() if f"{group}.{name}" not in NOT_RESULT_SETTINGS}
    settings["task"]["content_sha256"] = question_file_digest(cfg.task.path)
    return settings


def loaded_settings(model: LoadedModel, drafter: Drafter) -> dict:
    """The part of run.json known once the model and the drafter are loaded: the target's source and weights
    (and a draft model's: the drafters that run one keep it as ``drafter.draft``), how it runs, and the software
    that runs it."""
    env = environment(model)
    draft = getattr(drafter, "draft", None)
    return {
        "model_source": model.source,
        "weights_fingerprint": model.weights_fingerprint,
        "draft_weights_fingerprint": weights_fingerprint(draft) if isinstance(draft, torch.nn.Module) else None,
        "dtype": env["dtype"],
        "device": str(model.device),
        "threads": torch.get_num_threads(),
        # The driver, the device count and CUDA_VISIBLE_DEVICES stay in the summary's environment only: a job
        # requeued onto another node of the same GPUs resumes.
        "environment": {key: env[key] for key in ("python", "torch", "transformers", "specbench", "device", "git_sha",
                                                  "cuda", "gpus")},
    }


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
    ``settings``' keys, or that was recorded before its placement was (``specbench.run_identity``). The rest
    (weights, dtype, devices, threads, software) is checked by RunDirectory.open once the model is loaded, before
    anything is written."""
    if earlier is None:
        return
    refusal = unrecorded_refusal(output_dir, earlier)
    if refusal is not None:
        raise refusal
    changed = settings_differences(earlier, settings, sorted(settings))
    if changed:
        raise SpecbenchError(f"{output_dir} holds results of a run with other settings ({'; '.join(changed)}); "
                             "choose another hydra.run.dir or remove that directory")


def already_finished(cfg: DictConfig, output_dir: str, questions: list[Prompt],
                     run_dir: RunDirectory | None = None) -> dict | None:
    """The summary of ``output_dir`` when it already holds every selected question for these settings, so a
    re-run sweep skips finished cells without loading anything; None otherwise. ``run_dir``: the RunDirectory
    the run opens afterwards, so that a bad line read here is not warned about twice."""
    summary_file = Path(output_dir) / "summary.json"
    if not summary_file.is_file():
        return None
    run_dir = run_dir or RunDirectory(output_dir, with_baseline=cfg.run.baseline)
    done = run_dir.finished_ids() | run_dir.skipped_ids()
    if not all(prompt.question_id in done for prompt in questions):
        return None
    return read_json_file(summary_file, "summary of the run in that directory")


def choose_threads(settings: RunSettings, earlier: dict | None, processes: int = 1) -> tuple[int, TimingCheck]:
    """torch's thread count for this run and what the machine looked like at start. ``run.threads: null`` takes
    the count an earlier session of this run directory used (so the run resumes on equal terms), else one per
    usable core that other processes leave free (``specbench.measure.machine.safe_threads``). The ``processes`` of one
    tensor-parallel run on one machine split its cores between them."""
    cores = usable_cores()
    if processes > 1:
        # The other ranks are this run, not other load; CPU tensor parallelism is for checking, not timing.
        share = max(1, int(cores // processes))
        threads = settings.threads if settings.threads is not None else share
        return threads, TimingCheck(threads=threads, usable_cores=share, other_load_at_start=0.0)
    other = other_load()
    if settings.threads is not None:
        threads = settings.threads
    else:
        threads = earlier["threads"] if earlier and isinstance(earlier.get("threads"), int) else safe_threads(cores, other)
        if threads > cores:  # the earlier session ran on a machine with more cores; run.json pins the count
            log.warning("this run began with %d threads and resumes with them, but this machine has %g usable "
                        "core(s): threads will share cores and its timings will be flagged; resume it on a machine "
                        "like the first", threads, cores)
        elif other and threads > safe_threads(cores, other):
            log.warning("other processes keep %.1f of %g cores busy; this run resumes with the %d threads it began "
                        "with, so its timings will be flagged", other, cores, threads)
    if is_contended(other, threads, cores):
        fewer = safe_threads(cores, other)
        log.warning("other processes keep %.1f of %g cores busy and this run uses %d thread(s): its timings will be "
                    "flagged as untrustworthy (quiet the machine%s)", other, cores, threads,
                    f", or set run.threads={fewer}" if fewer < threads else "")
    return threads, TimingCheck(threads=threads, usable_cores=cores, other_load_at_start=other)


def run_benchmark(cfg: DictConfig, output_dir: str, on_open=None) -> dict:
    """Run the benchmark described by ``cfg`` into ``output_dir`` and return the summary. ``on_open(path)``
    is called once the directory has passed every check and is locked (the CLI saves Hydra's files there).

    Under torchrun (``model.tp_plan=auto``) every process runs this; rank 0 decides and writes, the others
    decode beside it in a scratch directory (``specbench.distributed``)."""
    settings = check_config(cfg)
    questions = select_questions(read_questions(cfg.task.path), list(cfg.task.tasks), cfg.task.limit_per_task)
    if settings.device != "auto":
        resolve_device(settings.device)  # a device torch cannot give is refused before anything else happens
    processes = Processes.from_environment(cfg.model.get("tp_plan"), settings.device)
    if processes.world_size > 1 and settings.draft_budget == "auto":
        raise SpecbenchError("run.draft_budget=auto decides every step from that process's own clock, so the "
                             "processes of a tensor-parallel run would verify different drafts; use run.draft_budget=off")
    # processes.run: a process that fails reaches the others as one line, not as their collectives' tracebacks.
    if not processes.primary:
        logging.getLogger("specbench").setLevel(logging.ERROR)  # rank 0 speaks for the run
        with tempfile.TemporaryDirectory(prefix=f"specbench-rank{processes.rank}-") as scratch:
            return processes.run(_run, cfg, settings, questions, scratch, None, processes)
    return processes.run(_run, cfg, settings, questions, output_dir, on_open, processes)


def _run(cfg: DictConfig, settings: RunSettings, questions: list[Prompt], output_dir: str, on_open,
         processes: Processes) -> dict:
    wanted = {**config_settings(cfg), **planned_settings(processes.world_size)}
    run_dir = RunDirectory(output_dir, with_baseline=settings.baseline)

    def check_directory():
        # Everything the configuration fixes is checked before anything is loaded or written.
        earlier = earlier_settings(output_dir)
        check_resumable(output_dir, earlier, wanted)
        return earlier, already_finished(cfg, output_dir, questions, run_dir)

    earlier, finished_summary = processes.decide(check_directory)
    if finished_summary is not None:
        log.info("%s: every selected question is already done; nothing to run", output_dir)
        return finished_summary
    threads, timing = choose_threads(settings, earlier, processes.world_size)
    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)

    with RunLock(output_dir) as lock:
        drafter: Drafter = build(cfg.drafter)
        model: LoadedModel = build(cfg.model, device=settings.device, linear_backend=settings.linear_backend)
        # A hub or GGUF model tells its context only once loaded; check the token counts before the drafter's
        # databases are built.
        settings.check_context(model.max_context, f"{model.name}'s context of {model.max_context} tokens")
        sampling = Sampling(temperature=float(settings.temperature), top_p=float(settings.top_p), seed=settings.seed)
        drafter.prepare(model, sampling)
        # every process: the weights' fingerprint gathers shards
        loaded = {**loaded_settings(model, drafter), **loaded_placement(model)}
        finished = processes.decide(lambda: run_dir.open({**wanted, **loaded}))  # checks the loaded part too
        lock.keep()
        if on_open is not None:
            on_open(run_dir.path)
        return _measure(cfg, settings, model, drafter, sampling, run_dir, finished, questions, timing, processes)


def _measure(cfg, settings: RunSettings, model: LoadedModel, drafter: Drafter, sampling: Sampling,
             run_dir: RunDirectory, finished: set, questions: list[Prompt], timing: TimingCheck,
             processes: Processes) -> dict:
    """Decode every pending question by the method and the baseline, recording each as it finishes."""
    output_dir = run_dir.path
    skipped = processes.share({record["question_id"] for record in run_dir.skipped})
    pending = [prompt for prompt in questions if prompt.question_id not in finished and prompt.question_id not in skipped]
    baseline = NoDraft()
    dtype = str(model.dtype).removeprefix("torch.")
    method = settings.method_name(drafter.name)
    header = {"model": model.name, "drafter": drafter.name, "method": method, "environment": environment(model),
              "drafter_sources": drafter.sources()}
    for database, source in header["drafter_sources"].items():
        log.info("%s %s built from %s", drafter.name, database, source.get("prompt_set") or source)
    if finished:
        log.info("resuming in %s: %d of %d questions already done", output_dir, len(finished), len(questions))

    decoder = Decoder(model.target, model.eos_token_ids, settings.max_draft_tokens, sampling=sampling,
                      target_top_k=settings.target_top_k, diagnostic_top_k=settings.mismatch_top_k)
    pending = _skip_too_long(model, pending, run_dir)
    if pending:
        saved_state = _saved_drafter_state(drafter, run_dir, finished, processes)
        pending = _warm_up_on_one_that_fits(settings, model, decoder, drafter, baseline, pending, run_dir, processes,
                                            teach_state=saved_state is None)
        _restore_drafter_state(drafter, run_dir, finished, saved_state)

    bar = tqdm(total=len(questions), initial=len(questions) - len(pending), unit="q", file=sys.stderr,
               desc=f"{method} vs ar" if settings.baseline else method, dynamic_ncols=True,
               disable=not processes.primary)
    live = LiveRate(bar)
    summary = run_dir.write_summary(header, timing)
    meter = ContentionMeter()
    try:
        for index, prompt in enumerate(pending):
            decoders = [("method", drafter)] + ([("baseline", baseline)] if settings.baseline else [])
            if settings.alternate_order and index % 2 == 1:
                decoders.reverse()
            answers = {}
            out_of_memory = None
            meter.start()
            try:
                for role, which in decoders:
                    live.label = f"q{prompt.question_id} {which.name}"
                    gpu_memory.reset_peak(model.devices)
                    answers[role] = answer_question(model, decoder, which, prompt, settings.max_new_tokens, live)
                    answers[role].peak_gpu_memory_bytes = gpu_memory.peak_bytes(model.devices)
            except TurnTooLong as reason:  # a later turn outgrew the context: the question cannot be answered whole
                log.warning("skipping %s", reason)
                run_dir.skip(prompt, str(reason))
                bar.update(1)
                continue
            except gpu_memory.OUT_OF_MEMORY_ERRORS as error:  # read the figures while the failed step's tensors live
                out_of_memory = gpu_memory.out_of_memory_record(error, model.devices, prompt.question_id, which.name,
                                                                len(first_turn_ids(model, prompt)))
            if out_of_memory is not None:  # the traceback is gone: what the failed step held can be freed
                _skip_out_of_memory(model, run_dir, prompt, out_of_memory)
                bar.update(1)
                continue
            other_cores = meter.stop()
            method_answer, baseline_answer = answers["method"], answers.get("baseline")
            identical, mismatch = compare_with_baseline(method_answer, baseline_answer, settings.tolerance(dtype),
                                                        exact=sampling.greedy)
            if mismatch is not None and mismatch.kind == "violation":
                log.warning("question %s differs from the baseline beyond a near-tie: %s", prompt.question_id, mismatch)
            if is_contended(other_cores, timing.threads, timing.usable_cores):
                log.warning("question %s: other processes kept %.1f of %g cores busy; its timings are flagged",
                            prompt.question_id, other_cores, timing.usable_cores)
            record = method_answer.to_record(prompt, f"{model.name}-{method}", identical, mismatch)
            record["specbench"]["contention"] = {"other_cores": other_cores, "threads": timing.threads,
                                                 "usable_cores": timing.usable_cores}
            run_dir.add(
                record,
                None if baseline_answer is None else baseline_answer.to_record(prompt, f"{model.name}-ar", None),
                method_answer.step_rows(prompt.question_id),
            )
            state = drafter.state()
            if state is not None:
                run_dir.save_drafter_state(state)
            summary = run_dir.write_summary(header, timing)
            overall = summary["tasks"]["overall"]
            bar.update(1)
            if overall["speedup"] is not None:
                flag = "" if summary["timing"]["trustworthy"] else " (timings flagged: busy machine)"
                bar.set_postfix_str(f"{overall['tokens_per_s']:.1f} tok/s, speedup {overall['speedup']:.2f}x{flag}")
    finally:
        bar.close()
    return run_dir.write_summary(header, timing)


def _skip_too_long(model: LoadedModel, pending: list[Prompt], run_dir: RunDirectory) -> list[Prompt]:
    """The pending questions whose first turn fits the model's context; the others are recorded as skipped, with
    why, so that the run goes on (and a resumed run does not stop at them again)."""
    kept = []
    for prompt in pending:
        try:
            first_turn_ids(model, prompt)
        except TurnTooLong as reason:
            log.warning("skipping %s", reason)
            run_dir.skip(prompt, str(reason))
            continue
        kept.append(prompt)
    return kept


def compare_with_baseline(method: Answer, baseline: Answer | None, tolerance: float, exact: bool):
    """(identical, mismatch) of a method's answer against its baseline's; (None, None) without a baseline."""
    if baseline is None:
        return None, None
    mismatch = diagnose(method.token_ids, baseline.token_ids, method.top, baseline.top, tolerance, exact=exact)
    return mismatch is None, mismatch  # diagnose finds a difference exactly when the answers are not identical


def first_turn_ids(model: LoadedModel, prompt: Prompt) -> list[int]:
    prompt_ids = model.encode_conversation([prompt.turns[0]], [])
    if len(prompt_ids) >= model.max_context:  # the answer needs room for at least one token
        raise TurnTooLong(too_long_for_context(prompt.question_id, 1, len(prompt_ids), model.name, model.max_context))
    return prompt_ids


def calibrate(settings: RunSettings, model: LoadedModel, decoder: Decoder, prompt_ids: list[int],
              measured: dict[int, float] | None = None) -> dict[int, float]:
    """Measure the target's verify latency per token count on ``prompt_ids`` (or take the ``measured`` ones
    of an earlier session of this run) and set up shape padding (run.verify_padding) and the draft budget
    (run.draft_budget) on ``decoder``; return the latencies."""
    if settings.verify_padding == "off" and settings.draft_budget == "off":
        return {}
    sizes = settings.calibration_grid(min(settings.max_draft_tokens + 1, model.max_context - len(prompt_ids)))
    if settings.draft_budget == "off":
        sizes = [size for size in sizes if size <= settings.verify_padding_max]
    if measured is not None:
        sizes = sorted(measured)
        latencies = dict(measured)
    else:
        latencies = decoder.measure_verify_latency(prompt_ids, sizes, repeats=settings.calibration_repeats)
    if settings.verify_padding == "auto":
        padding_sizes = {size: latencies[size] for size in sizes if size <= settings.verify_padding_max}
        decoder.verify_shapes = VerifyShapes.from_latencies(padding_sizes, min_gain=settings.verify_padding_min_gain)
    if settings.draft_budget == "auto":
        cost = VerifyCost(latencies, smoothing=settings.verify_cost_smoothing)
        shapes = decoder.verify_shapes
        decoder.verify_cost = cost
        decoder.draft_budget = DraftBudget(lambda counts: cost(shapes.padded_array(counts)),
                                           prior_rate=settings.draft_budget_prior, explore=settings.draft_budget_explore,
                                           memory=settings.draft_budget_memory,
                                           prior_weight=settings.draft_budget_prior_weight,
                                           max_depth=settings.draft_budget_max_depth,
                                           max_rank=settings.draft_budget_max_rank)
    return latencies


def saved_latencies(latency_file: Path) -> dict[int, float] | None:
    """The verify latencies an earlier session of this run measured, if any: a resumed run reuses them, so its
    padding and draft budget decide as the uninterrupted run's did (a new calibration would measure another
    question on a machine in another state)."""
    if not latency_file.is_file():
        return None
    try:
        saved = json.loads(latency_file.read_text())["latency_s"]
        latencies = {int(size): float(seconds) for size, seconds in saved.items()}
        if not all(size > 0 and np.isfinite(seconds) and seconds > 0 for size, seconds in latencies.items()):
            raise ValueError("a size or latency out of range")
        return latencies
    except Exception:  # whatever the reading raised (RecursionError, OSError, a wrong shape): measured again
        log.warning("%s is damaged; calibrating again", latency_file)
        return None


def _saved_drafter_state(drafter: Drafter, run_dir: RunDirectory, finished: set, processes: Processes):
    """(state, ids of the questions it has seen) that an interrupted session of this run saved, when resuming a
    drafter that carries state across questions; None otherwise (then a missing save is warned about)."""
    if not finished or drafter.state() is None:
        return None
    saved = processes.share(run_dir.drafter_state())
    if saved is None:
        log.warning("%s: no saved drafter state; %s starts the resumed questions from its warm-up alone, so they "
                    "may differ from an uninterrupted run's", run_dir.path, drafter.name)
    return saved


def _restore_drafter_state(drafter: Drafter, run_dir: RunDirectory, finished: set, saved) -> None:
    """On resuming, give a drafter that carries state across questions the state it had after the finished
    ones (which the interrupted run's warm-up also taught, before its first question)."""
    if saved is None:
        return
    state, seen = saved
    try:
        drafter.restore(state)
    except Exception as error:  # the drafter's own refusal, or arrays missing or misshapen in a file numpy read
        reason = str(error) if isinstance(error, SpecbenchError) else f"{type(error).__name__}: {damage_reason(error)}"
        raise SpecbenchError(f"{run_dir.drafter_state_file} is damaged ({reason}); remove it to start the drafter's "
                             "state afresh") from None
    if seen != {str(question) for question in finished}:
        log.warning("%s: the saved drafter state has seen %d of the %d finished questions (the run was stopped "
                    "while saving); the resumed questions may differ slightly from an uninterrupted run's",
                    run_dir.path, len(seen & {str(q) for q in finished}), len(finished))


def _warm_up_state(settings: RunSettings, model: LoadedModel, decoder: Decoder, drafter: Drafter,
                   prompt: Prompt) -> None:
    """The warm-up of a method that carries state across questions, which the first measured question meets:
    ``run.state_warmup_runs`` decodes of ``prompt`` (every turn or the first, ``run.state_warmup_turns``), at
    ``run.state_warmup_length()`` tokens per turn; Spec-Bench's: 3 decodes, every turn, at the measured length."""
    if settings.state_warmup_turns == "first":
        prompt = dataclasses.replace(prompt, turns=prompt.turns[:1])
    for _ in range(settings.state_warmup_runs):
        try:
            answer_question(model, decoder, drafter, prompt, settings.state_warmup_length())
        except TurnTooLong as reason:  # the measured decode will skip it too; what was learned so far stays
            log.warning("the state warm-up stopped early: %s", reason)
            return


class _WarmUpOutOfMemory(Exception):
    """The warm-up or the calibration ran out of GPU memory; ``record`` was read while the failed pass's tensors
    were alive (gpu_memory.out_of_memory_record)."""

    def __init__(self, record: dict):
        super().__init__(record["reason"])
        self.record = record


@contextlib.contextmanager
def _out_of_memory_as_skip(model: LoadedModel, prompt: Prompt, decoded_by: str, phase: str):
    try:
        yield
    except gpu_memory.OUT_OF_MEMORY_ERRORS as error:
        raise _WarmUpOutOfMemory(gpu_memory.out_of_memory_record(
            error, model.devices, prompt.question_id, decoded_by, len(first_turn_ids(model, prompt)), phase)) from None


def _warm_up_on_one_that_fits(settings: RunSettings, model: LoadedModel, decoder: Decoder, drafter, baseline,
                              pending: list[Prompt], run_dir: RunDirectory, processes: Processes,
                              teach_state: bool) -> list[Prompt]:
    """``_warm_up`` on the first pending question; one that runs out of GPU memory there (in the warm-up or the
    calibration) is recorded as a question that ran out of it, as in its measured decode, and the next one warms
    up instead. Returns the questions left to measure."""
    while pending:
        try:
            _warm_up(settings, model, decoder, drafter, baseline, pending, run_dir.path, processes, teach_state)
            return pending
        except _WarmUpOutOfMemory as failure:
            record = failure.record
        _skip_out_of_memory(model, run_dir, pending[0], record)  # outside the except: the traceback is gone
        pending = pending[1:]
    return pending


def _skip_out_of_memory(model: LoadedModel, run_dir: RunDirectory, prompt: Prompt, record: dict) -> None:
    """Record ``prompt`` as skipped for running out of GPU memory (``record``: gpu_memory.out_of_memory_record) and
    free what the failed pass held; called once its traceback, which keeps those tensors alive, is gone."""
    gpu_memory.release_cached_memory(model.devices)
    log.warning("skipping %s", record["reason"])
    run_dir.skip(prompt, record.pop("reason"), cause="out_of_memory", details=record)


def _warm_up(settings: RunSettings, model, decoder: Decoder, drafter, baseline, pending: list[Prompt],
             run_path: Path, processes: Processes, teach_state: bool = True) -> None:
    """Decode the first pending question untimed, so that lazy initialisation and caches do not land in the first
    measured question; then calibrate the decoder (verify latency per token count) and record what was measured.

    A drafter that carries state across questions gets the state warm-up instead (``_warm_up_state``), unless
    ``teach_state`` is false: a resumed run restores the state saved after the warm-up and the finished
    questions, so it warms that drafter up for timing only."""
    prompt_ids = first_turn_ids(model, pending[0])
    budget = min(settings.warmup_max_new_tokens, model.max_context - len(prompt_ids))
    state = drafter.state()
    state_warm_up = teach_state and state is not None and drafter.warm_up_teaches
    # A state the warm-up must not teach is put back afterwards (a copy: state() may hand out live arrays).
    untaught = None if state is None or drafter.warm_up_teaches else {key: np.array(value, copy=True)
                                                                      for key, value in state.items()}
    for _ in range(settings.warmup_runs):
        for which in (baseline,) if state_warm_up else (drafter, baseline):
            with _out_of_memory_as_skip(model, pending[0], which.name, "warm-up"):
                decoder.generate(prompt_ids, which, budget)
    if state_warm_up:
        with _out_of_memory_as_skip(model, pending[0], drafter.name, "warm-up"):
            _warm_up_state(settings, model, decoder, drafter, pending[0])
    if untaught is not None:
        drafter.restore(untaught)
    latency_file = run_path / "verify_latency.json"
    saved = processes.share(saved_latencies(latency_file))
    with _out_of_memory_as_skip(model, pending[0], baseline.name, "calibration"):
        latencies = calibrate(settings, model, decoder, prompt_ids, measured=saved)
    if processes.world_size > 1 and saved is None:  # every process measured; all pad as rank 0 measured
        latencies = calibrate(settings, model, decoder, prompt_ids, measured=processes.share(latencies))
    if latencies and saved is None:
        padded = {size: decoder.verify_shapes.padded(size) for size in latencies
                  if decoder.verify_shapes.padded(size) != size}
        log.info("verify latency by tokens verified: %s; padding %s",
                 ", ".join(f"{size}:{seconds * 1000:.1f}ms" for size, seconds in latencies.items()), padded or "none")
        text = json.dumps({"latency_s": latencies, "pad_to": padded, "context_len": len(prompt_ids)}, indent=2) + "\n"
        write_atomically(latency_file, lambda path: path.write_text(text))
