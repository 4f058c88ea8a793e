"""A benchmark run: every question decoded by the method and, back to back, by the AR baseline.

Read from the top: ``run_benchmark`` checks the configuration and the run directory before anything is loaded
(``specbench.run.identity``), loads the engine that decodes (the one the engine group's ``_target_`` names,
``specbench.config.choose_engine``), opens the run directory and ``measure``s: the questions left to do, the
engine's warm-up, then per question an answer per role, the lossless check against the baseline and the records,
and the summary after each; then the engine's load levels, if it has any (``specbench.load_sweep``). The runner
talks to the engine only through ``Engine`` and never asks which engine it is.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from specbench.config import check_config, choose_engine
from specbench.distributed import Processes
from specbench.engines.base import BASELINE, METHOD, Engine, SkipQuestion
from specbench.engines.calibration import LATENCY_FILE, saved_latencies
from specbench.errors import SpecbenchError
from specbench.load_sweep import LevelWarmUp, check_load_file, measure_load
from specbench.measure.machine import ContentionMeter, TimingCheck, is_contended
from specbench.measure.mismatch import diagnose
from specbench.measure.stalls import StallCheck, StallRule, describe
from specbench.models.devices import resolve_device
from specbench.questions import Prompt
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer
from specbench.run.identity import (already_finished, check_resumable, config_settings, earlier_settings,
                                    planned_settings)
from specbench.run.owned_processes import OwnedProcesses, end_leftovers
from specbench.run.selection import TaskSelection
from specbench.run.threads import choose_threads
from specbench.storage.run_lock import RunLock
from specbench.settings import RunSettings

log = logging.getLogger(__name__)


def run_benchmark(cfg: DictConfig, output_dir: str, on_open=None) -> dict:
    """Run the benchmark described by ``cfg`` into ``output_dir`` and return the summary. ``on_open(path)``
    is called once the directory has passed every check and is locked (the CLI saves Hydra's files there).

    Under torchrun (``model.tp_plan=auto``) every process runs this; rank 0 decides and writes, the others
    decode beside it in a scratch directory (``specbench.distributed``)."""
    settings = check_config(cfg)
    questions = TaskSelection.of(cfg.task).read()  # prompt-length bounds wait for the loaded target (_run)
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
    engine_class, engine_settings = choose_engine(cfg)
    wanted = {**config_settings(cfg, engine_settings.identity()), **planned_settings(processes.world_size)}
    run_dir = RunDirectory(output_dir, with_baseline=settings.baseline)
    selection = TaskSelection.of(cfg.task)

    def check_directory():
        # Everything the configuration fixes is checked before anything is loaded or written.
        earlier = earlier_settings(output_dir)
        check_resumable(output_dir, earlier, wanted)
        # Levels over other questions, or warmed otherwise, are refused before loading; questions still to be
        # selected by prompt length are known only once loaded, where measure_load checks the same.
        if engine_settings.load_levels and selection.bounds is None:
            skipped = run_dir.skipped_ids()
            check_load_file(output_dir, engine_settings.load_levels,
                            [prompt.question_id for prompt in questions if prompt.question_id not in skipped],
                            LevelWarmUp.of(settings))
        # With bounds, questions are all of the tasks' until fit: a finished run is then found finished once loaded.
        return earlier, already_finished(output_dir, questions, settings.baseline, run_dir, engine_settings.load_levels,
                                         engine_settings.paired)

    earlier, finished_summary = processes.decide(check_directory)
    if finished_summary is not None:
        log.info("%s: every selected question is already done; nothing to run", output_dir)
        return finished_summary
    threads, timing = choose_threads(settings, earlier, processes.world_size)
    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)

    if engine_class.starts_processes:
        end_leftovers(output_dir)  # what a killed earlier session's engine left running, before this one locks
    owned = OwnedProcesses(output_dir) if engine_class.starts_processes else contextlib.nullcontext()
    with RunLock(output_dir) as lock, owned:  # the engine's processes end before the directory is let go
        engine = engine_class.load(engine_settings, cfg.model, cfg.drafter, settings, processes)
        try:
            questions = selection.fit(questions, engine.prompt_tokens)
            loaded = engine.run_settings()  # in every process: the weights' fingerprint gathers shards
            finished = processes.decide(lambda: run_dir.open({**wanted, **loaded}))  # checks the loaded part too
            lock.keep()
            if on_open is not None:
                on_open(run_dir.path)
            summary = measure(engine, settings, run_dir, finished, questions, timing, processes)
            if engine.load_levels:
                skipped = {record["question_id"] for record in run_dir.skipped}
                measure_load(engine, summary["method"], run_dir.path,
                             [prompt for prompt in questions if prompt.question_id not in skipped],
                             LevelWarmUp.of(settings))
            return summary
        finally:
            engine.close()


def measure(engine: Engine, settings: RunSettings, run_dir: RunDirectory, finished: set, questions: list[Prompt],
            timing: TimingCheck, processes: Processes) -> dict:
    """Decode every pending question of the opened ``run_dir`` (``finished``: what it already holds) by the method
    and the baseline through ``engine``, recording each as it finishes; return the summary."""
    skipped = processes.share({record["question_id"] for record in run_dir.skipped})
    pending = [prompt for prompt in questions if prompt.question_id not in finished and prompt.question_id not in skipped]
    method = settings.method_name(engine.drafter_name) + engine.method_suffix
    if finished:
        log.info("resuming in %s: %d of %d questions already done", run_dir.path, len(finished), len(questions))
    pending = [prompt for prompt in pending if _fits(engine, prompt, run_dir)]
    if pending:
        pending = engine.warm_up(pending, run_dir, finished, lambda prompt, skip: _record_skip(run_dir, prompt, skip))
    header = summary_header(engine, method)  # after the warm-up, which compiles a compiled target's passes
    if not engine.paired:  # warmed up, but measured only under load (engine.paired=false)
        pending = []
    with tqdm(total=len(questions), initial=len(questions) - len(pending), unit="q", file=sys.stderr,
              desc=f"{method} vs ar" if settings.baseline else method, dynamic_ncols=True,
              disable=not processes.primary) as bar:
        live = LiveRate(bar)
        run_dir.write_summary(header, timing)
        meter = ContentionMeter()
        stalls = _stall_check(settings, run_dir)
        for index, prompt in enumerate(pending):
            meter.start()
            try:
                answers = _answer_roles(engine, prompt, _roles(settings, index), live)
            except SkipQuestion as skip:
                _record_skip(run_dir, prompt, skip)
                bar.update(1)
                continue
            _record_question(engine, settings, run_dir, prompt, answers, meter.stop(), timing, method, stalls)
            engine.save_state(run_dir)
            _show_progress(bar, run_dir.write_summary(header, timing))
    return run_dir.write_summary(header, timing)


def summary_header(engine: Engine, method: str) -> dict:
    """What the summary says about the run besides its results: model, method, environment, the sources of the
    method's databases (logged once)."""
    header = {"model": engine.model_name, "drafter": engine.drafter_name, "method": method,
              "environment": engine.environment(), "drafter_sources": engine.sources(),
              "pass_floor": engine.pass_floor(), "regime": engine.regime()}
    for database, source in header["drafter_sources"].items():
        log.info("%s %s built from %s", engine.drafter_name, database, source.get("prompt_set") or source)
    return header


def _fits(engine: Engine, prompt: Prompt, run_dir: RunDirectory) -> bool:
    """Whether ``prompt`` can be decoded at all; one that cannot is recorded as skipped, with why, so that the run
    goes on (and a resumed run does not stop at it again)."""
    try:
        engine.check_fits(prompt)
        return True
    except SkipQuestion as skip:
        _record_skip(run_dir, prompt, skip)
        return False


def _record_skip(run_dir: RunDirectory, prompt: Prompt, skip: SkipQuestion) -> None:
    log.warning("skipping %s", skip.reason)
    run_dir.skip(prompt, skip.reason, cause=skip.cause, details=skip.details)


def _roles(settings: RunSettings, index: int) -> list[str]:
    """The roles that decode the ``index``-th pending question, in order: with run.alternate_order every other
    question has its baseline first, so that neither side always runs on a machine the other just warmed."""
    roles = [METHOD] + ([BASELINE] if settings.baseline else [])
    return roles[::-1] if settings.alternate_order and index % 2 == 1 else roles


def _answer_roles(engine: Engine, prompt: Prompt, roles: list[str], live: LiveRate) -> dict[str, Answer]:
    answers = {}
    for role in roles:
        live.label = f"q{prompt.question_id} {engine.decoded_by[role]}"
        answers[role] = engine.answer(prompt, role, live)
    return answers


def _stall_check(settings: RunSettings, run_dir: RunDirectory) -> StallCheck:
    """The run's check for stalls inside a question (``specbench.measure.stalls``): the calibration's verify
    latencies, when the engine calibrated (after its warm-up, verify_latency.json), as the prior, and the steps an
    earlier session of the run recorded (the method's) counted into the references."""
    check = StallCheck(StallRule(settings.stall_factor, settings.stall_min_s, settings.stall_share),
                       prior=saved_latencies(run_dir.path / LATENCY_FILE))
    check.times.add(run_dir.steps().itertuples())
    return check


def _record_question(engine: Engine, settings: RunSettings, run_dir: RunDirectory, prompt: Prompt,
                     answers: dict[str, Answer], other_cores: float, timing: TimingCheck, method: str,
                     stall_check: StallCheck) -> None:
    """Check the method's answer against the baseline's and record both, with how busy the machine was and the
    stalls inside the question."""
    method_answer, baseline_answer = answers[METHOD], answers.get(BASELINE)
    identical, mismatch = compare_with_baseline(method_answer, baseline_answer, settings.tolerance(engine.dtype),
                                                exact=engine.greedy)
    if mismatch is not None and mismatch.kind == "violation":
        log.warning("question %s differs from the baseline beyond a near-tie: %s", prompt.question_id, mismatch)
    if is_contended(other_cores, timing.threads, timing.usable_cores):
        log.warning("question %s: other processes kept %.1f of %g cores busy; its timings are flagged",
                    prompt.question_id, other_cores, timing.usable_cores)
    stalls = stall_check.judge({role: ([step for turn in answer.steps for step in turn], sum(answer.wall_times))
                                for role, answer in answers.items()})
    if stalls["stalled"]:
        log.warning("question %s: %s; its timings are flagged", prompt.question_id, describe(stalls))
    record = method_answer.to_record(prompt, f"{engine.model_name}-{method}", identical, mismatch)
    record["specbench"]["contention"] = {"other_cores": other_cores, "threads": timing.threads,
                                         "usable_cores": timing.usable_cores}
    record["specbench"]["stalls"] = stalls
    run_dir.add(
        record,
        None if baseline_answer is None else baseline_answer.to_record(prompt, f"{engine.model_name}-ar", None),
        method_answer.step_rows(prompt.question_id),
    )


def _show_progress(bar: tqdm, summary: dict) -> None:
    overall = summary["tasks"]["overall"]
    bar.update(1)
    if overall["speedup"] is not None:
        flag = "" if summary["timing"]["trustworthy"] else " (timings flagged: busy machine)"
        bar.set_postfix_str(f"{overall['tokens_per_s']:.1f} tok/s, speedup {overall['speedup']:.2f}x{flag}")


def compare_with_baseline(method: Answer, baseline: Answer | None, tolerance: float, exact: bool):
    """(identical, mismatch) of a method's answer against its baseline's; (None, None) without a baseline."""
    if baseline is None:
        return None, None
    mismatch = diagnose(method.token_ids, baseline.token_ids, method.top, baseline.top, tolerance, exact=exact)
    return mismatch is None, mismatch  # diagnose finds a difference exactly when the answers are not identical


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
