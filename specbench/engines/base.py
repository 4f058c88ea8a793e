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

Call order, once per session: ``run_settings`` and ``environment``/``sources`` (recorded in run.json and the
summary header), ``check_fits`` for every pending question, ``warm_up`` on the first that fits, then for every
question ``answer`` for each role and ``save_state`` once it is recorded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from specbench.questions import Prompt
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


class Engine(ABC):
    """Decodes the questions of one run for the method and its baseline (see the module docstring).

    model_name:  the target's name (records are named ``<model_name>-<method>``)
    drafter_name: the method's drafter, as ``RunSettings.method_name`` names the method after it
    dtype:       the dtype the target computes in (``float16``), which sets the mismatch tolerance
    decoded_by:  per role, the name of what decodes it (``{"method": "pld", "baseline": "ar"}``), shown by the
                 progress bar
    greedy:      whether the answers are greedy (then method and baseline must agree token for token)
    """

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

    def serve(self, prompts: list[Prompt], role: str, concurrency: int):
        """Under load (only engines with ``load_levels``): every prompt's first turn for ``role`` with
        ``concurrency`` requests in flight; returns the completions (``specbench.engines.vllm_requests.Completion``,
        in order) and the seconds from the first submission to the last completion."""
        raise NotImplementedError(f"{type(self).__name__} decodes one request at a time")

    def close(self) -> None:
        """Stop whatever the engine started (processes, servers); called once the run ends, however it ends."""

    @abstractmethod
    def save_state(self, run_dir: RunDirectory) -> None:
        """After a question is recorded: keep in ``run_dir`` what the method carries across questions, so that
        a resumed session continues from it (nothing for a method that carries nothing)."""
