"""What decodes the questions of a run: the seam between the runner and whatever runs the model.

The runner (``specbench.runner``) keeps everything that makes a benchmark a benchmark: which questions are
pending, the records, the lossless check against the baseline, the skip bookkeeping, resuming, the progress bar
and the summary. An ``Engine`` decodes. The runner talks to it only through this interface and never asks which
engine it is, so an engine that runs its own loop (vLLM) fits beside the specbench loop
(``specbench.engines.specbench_loop``) without a branch in the runner, in the records or in analysis.

What an engine is given: the loaded run (its ``RunSettings`` and the config groups it loads from), then one
prompt and one role at a time. What it gives back, per role, is an ``Answer`` (``specbench.results.schema``): the text,
token ids, steps (``StepRecord``: tokens drafted, verified and accepted per step, and the step's phase times
where the engine measures them; an engine that measures none leaves them None), wall time per turn, the top
logits per generated token that the mismatch diagnosis compares, and the peak GPU memory. Roles:

    method    the method under test (its drafter, its speculative settings)
    baseline  the plain autoregressive decode it is compared with, token for token and in time

How an engine is chosen: the ``engine`` config group's ``_target_`` names its class (``conf/engine/<name>.yaml``,
as every config group names what it builds). Before anything loads, ``specbench.config`` asks that class to
``check_config`` its settings against the drafter and run groups; the ``EngineSettings`` it returns say what the
runner and the run's identity need to know of them, and are handed back to ``load``. An engine imports nothing
heavy of its own (vLLM) at module level, so the check runs in any environment.

Call order, once per session: ``run_settings`` and ``environment``/``sources`` (recorded in run.json and the
summary header), ``check_fits`` for every pending question, ``warm_up`` on the first that fits, then for every
question ``answer`` for each role and ``save_state`` once it is recorded; with load levels, ``serve`` per level and
role once the paired questions are done, each after an untimed ``serve`` of fewer tokens, the level's warm-up
(``specbench.load_sweep``); ``close`` however the run ends.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar

from specbench.questions import Prompt
from specbench.results.load import ServedRequest
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer

METHOD, BASELINE = "method", "baseline"
ROLES = (METHOD, BASELINE)

# What an engine calls while it decodes: tokens generated so far and seconds elapsed, for the progress bar.
OnStep = Callable[[int, float], None]


class SkipQuestion(Exception):
    """A question the engine cannot answer here: the runner records it as skipped with ``reason`` (a line for
    the user), ``cause`` (skipped.jsonl's ``cause``: ``too_long``, ``out_of_memory``) and ``details`` (fields
    added to its skipped.jsonl line), and goes on with the next question."""

    def __init__(self, reason: str, cause: str = "too_long", details: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.cause = cause
        self.details = details


# The runner's record of a skipped question, which an engine's warm-up calls for a question it gives up on.
Skip = Callable[[Prompt, SkipQuestion], None]


@dataclass
class EngineSettings:
    """An engine's config group (``conf/engine/<name>.yaml``, ``_target_`` aside) as its ``Engine.check_config``
    checked it: what the runner reads before anything loads. An engine with settings of its own extends it with
    them (``specbench.engines.vllm_methods.VllmSettings``).

    name: the engine's name (``engine.name``), which the run directory's and the method's names carry
    """

    name: str = "specbench"
    #: the settings that change neither outputs nor timings, and why: left out of run.json's identity, so that a
    #: run directory continues with them changed (tests/test_run_safety.py checks every key is recorded or here)
    NOT_RESULT_SETTINGS: ClassVar[dict[str, str]] = {}

    @property
    def load_levels(self) -> list[int]:
        """Requests in flight at which the run is also measured under load (none: one request at a time)."""
        return []

    @property
    def paired(self) -> bool:
        """Whether the run decodes its questions by the method and its baseline, back to back (batch 1, paired);
        false for a run measured only under load (engine=vllm's ``engine.paired=false``)."""
        return True

    def identity(self) -> dict | None:
        """run.json's "engine": every setting but NOT_RESULT_SETTINGS, which a resumed run must match (None for an
        engine whose runs record none)."""
        return {key: value for key, value in asdict(self).items() if key not in self.NOT_RESULT_SETTINGS}


class Engine(ABC):
    """Decodes the questions of one run for the method and its baseline (see the module docstring).

    model_name:  the target's name (records are named ``<model_name>-<method>``)
    drafter_name: the method's drafter, as ``RunSettings.method_name`` names the method after it
    dtype:       the dtype the target computes in (``float16``), which sets the mismatch tolerance
    decoded_by:  per role, the name of what decodes it (``{"method": "pld", "baseline": "ar"}``), shown by the
                 progress bar
    greedy:      whether the answers are greedy (then method and baseline must agree token for token)
    """

    #: the engine's ``engine.name``: a config group whose ``_target_`` names this class must carry it
    name: ClassVar[str]
    model_name: str
    drafter_name: str
    dtype: str
    decoded_by: dict[str, str]
    greedy: bool
    # Appended to the method's name in records and tables ("pld@vllm"), so that one drafter config run by two
    # engines is never shown under one name.
    method_suffix: str = ""
    # Whether the run decodes each question by the method and its baseline, back to back (batch 1, paired).
    paired: bool = True
    # Requests in flight at which the engine is also measured under load (``serve``); none for an engine that
    # decodes one request at a time.
    load_levels: list[int] = []
    # Whether ``load`` starts processes of its own (vLLM's engine cores and workers): the runner then makes them
    # the run's own, ended when it ends however it ends (``specbench.run.owned_processes``).
    starts_processes: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def check_config(cls, engine: dict, drafter: dict, run: dict) -> EngineSettings:
        """Every check of the run's configuration that is this engine's, before anything loads, in one line naming
        the bad value and the valid choices: its own settings (``engine``: the resolved group, ``_target_`` left
        out), whether it runs the drafter config (``drafter``), the run settings it cannot honour (``run``).
        Imports nothing the default environment lacks. Returns the settings, checked."""

    @classmethod
    @abstractmethod
    def load(cls, engine: EngineSettings, model_node, drafter_node, settings, processes) -> Engine:
        """The engine, loaded for the run's model and drafter config groups: ``engine`` what ``check_config``
        returned, ``settings`` the run's ``RunSettings``, ``processes`` the job's ``Processes``."""

    @abstractmethod
    def run_settings(self) -> dict:
        """The part of run.json known once the engine is loaded (the model's source and weights, how it runs,
        the software, how it was placed): a resumed session must match it."""

    @abstractmethod
    def environment(self) -> dict:
        """The software and machine the run runs on, for the summary header (``specbench.run.environment``)."""

    @abstractmethod
    def sources(self) -> dict[str, dict]:
        """What each database or model the method reads was built from, for the summary header."""

    def pass_floor(self) -> dict | None:
        """The least one target pass can take here, for the summary's cost curve (``specbench.measure.floor``):
        ``{"bytes_per_pass", "bandwidth"}``, or None where this process does not hold the whole target on one
        device (an engine that serves it elsewhere, a target spread over devices or processes)."""
        return None

    def regime(self) -> dict:
        """How the target's passes ran (``run.regime``), for the summary header: ``{"name": "eager"}``, or the
        compiled regime's shapes, compile times and the parts that stayed eager. An engine whose target runs
        elsewhere says what it knows."""
        return {"name": "eager"}

    @abstractmethod
    def prompt_tokens(self, prompt: Prompt) -> int:
        """How many tokens ``prompt``'s first turn is as the target reads it (in the model's prompt format, the chat
        template's own tokens counted): what a task's prompt-length bounds select by (``TaskSelection.fit``)."""

    @abstractmethod
    def check_fits(self, prompt: Prompt) -> None:
        """Raise ``SkipQuestion`` when ``prompt`` cannot be decoded here at all (its first turn leaves no room in
        the model's context)."""

    @abstractmethod
    def warm_up(self, pending: list[Prompt], run_dir: RunDirectory, finished: set, skip: Skip) -> list[Prompt]:
        """Before the first measured question: whatever must run untimed so that it does not land in a measured
        one (lazy initialisation, calibration, a stateful method's warm-up, restoring what an earlier session of
        ``run_dir`` saved after the ``finished`` questions). A pending question the engine cannot warm up on is
        handed to ``skip`` and the next one is tried. Returns the questions left to measure."""

    @abstractmethod
    def answer(self, prompt: Prompt, role: str, on_step: OnStep | None = None) -> Answer:
        """Every turn of ``prompt`` decoded for ``role`` (``METHOD`` or ``BASELINE``); raises ``SkipQuestion``
        when the question cannot be answered whole."""

    def serve(self, prompts: list[Prompt], role: str, concurrency: int,
              max_new_tokens: int | None = None) -> tuple[list[ServedRequest], float]:
        """Under load (only engines with ``load_levels``): every prompt's first turn for ``role`` with
        ``concurrency`` requests in flight, each prefilled afresh (no prefix an earlier call left cached), of up to
        ``max_new_tokens`` tokens (None: the run's ``max_new_tokens``; a level's warm-up asks for fewer); returns
        each request as the client saw it (``ServedRequest``, in ``prompts``' order) and the seconds from the first
        submission to the last completion."""
        raise NotImplementedError(f"{type(self).__name__} decodes one request at a time")

    def proposer_counters(self) -> dict | None:
        """Cumulative counters of a proposer that drafts inside the engine's own steps (engine=vllm-custom:
        ``vllm_proposer.ProposerCounters``), read before and after a load level to record what drafting cost there;
        None for an engine whose drafting specbench does not time there."""
        return None

    def close(self) -> None:
        """Stop whatever the engine started (processes, servers); called once the run ends, however it ends."""

    @abstractmethod
    def save_state(self, run_dir: RunDirectory) -> None:
        """After a question is recorded: keep in ``run_dir`` what the method carries across questions, so that
        a resumed session continues from it (nothing for a method that carries nothing)."""
