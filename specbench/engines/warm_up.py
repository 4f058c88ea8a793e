"""The specbench loop's warm-up before the first measured question: the first pending question decoded untimed by
the method and the baseline (so that lazy initialisation and caches do not land in a measured question), a
stateful method's Spec-Bench warm-up, then the calibration. A question that runs out of GPU memory there is
skipped as it would be in its measured decode, and the next one warms up instead."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specbench.decoding.contract import Drafter
from specbench.decoding.loop import Decoder
from specbench.distributed import Processes
from specbench.engines.base import Skip, SkipQuestion
from specbench.engines.calibration import calibrate_run
from specbench.engines.conversation import TurnTooLong, answer_question, first_turn_ids
from specbench.measure import gpu_memory
from specbench.questions import Prompt
from specbench.settings import RunSettings

if TYPE_CHECKING:
    from specbench.models import LoadedModel

log = logging.getLogger(__name__)


def warm_up_on_one_that_fits(settings: RunSettings, model: LoadedModel, decoder: Decoder, drafter: Drafter,
                             baseline: Drafter, pending: list[Prompt], run_path: Path, processes: Processes,
                             teach_state: bool, skip: Skip) -> list[Prompt]:
    """``warm_up`` on the first pending question; one that runs out of GPU memory there (in the warm-up or the
    calibration) is handed to ``skip`` as a question that ran out of it, as in its measured decode, and the next
    one warms up instead. Returns the questions left to measure."""
    while pending:
        try:
            warm_up(settings, model, decoder, drafter, baseline, pending, run_path, processes, teach_state)
            return pending
        except WarmUpOutOfMemory as failure:
            record = failure.record
        skip(pending[0], out_of_memory_skip(model, record))  # outside the except: the traceback is gone
        pending = pending[1:]
    return pending


def out_of_memory_skip(model: LoadedModel, record: dict) -> SkipQuestion:
    """The skip of a question that ran out of GPU memory (``record``: gpu_memory.out_of_memory_record), once what
    the failed pass held is freed; called once its traceback, which keeps those tensors alive, is gone."""
    gpu_memory.release_cached_memory(model.devices)
    return SkipQuestion(record.pop("reason"), cause="out_of_memory", details=record)


def warm_up(settings: RunSettings, model: LoadedModel, decoder: Decoder, drafter: Drafter, baseline: Drafter,
            pending: list[Prompt], run_path: Path, processes: Processes, teach_state: bool = True) -> None:
    """Decode the first pending question untimed, so that lazy initialisation and caches do not land in the first
    measured question; then calibrate the decoder (verify latency per token count) and record what was measured.

    A drafter that carries state across questions gets the state warm-up instead (``warm_up_state``), unless
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
            with out_of_memory_as_skip(model, pending[0], which.name, "warm-up"):
                decoder.generate(prompt_ids, which, budget)
    if state_warm_up:
        with out_of_memory_as_skip(model, pending[0], drafter.name, "warm-up"):
            warm_up_state(settings, model, decoder, drafter, pending[0])
    if untaught is not None:
        drafter.restore(untaught)
    with out_of_memory_as_skip(model, pending[0], baseline.name, "calibration"):
        calibrate_run(settings, model, decoder, prompt_ids, run_path, processes)


def warm_up_state(settings: RunSettings, model: LoadedModel, decoder: Decoder, drafter: Drafter,
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


class WarmUpOutOfMemory(Exception):
    """The warm-up or the calibration ran out of GPU memory; ``record`` was read while the failed pass's tensors
    were alive (gpu_memory.out_of_memory_record)."""

    def __init__(self, record: dict):
        super().__init__(record["reason"])
        self.record = record


@contextlib.contextmanager
def out_of_memory_as_skip(model: LoadedModel, prompt: Prompt, decoded_by: str, phase: str):
    """Running out of GPU memory inside becomes ``WarmUpOutOfMemory``, with the figures read while the failed
    pass's tensors are alive."""
    try:
        yield
    except gpu_memory.OUT_OF_MEMORY_ERRORS as error:
        raise WarmUpOutOfMemory(gpu_memory.out_of_memory_record(
            error, model.devices, prompt.question_id, decoded_by, len(first_turn_ids(model, prompt)), phase)) from None
