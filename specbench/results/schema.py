"""What one decode returns and how a run's files are versioned: ``Answer`` (a decoder's answer to one question),
``StepRecord`` (one decoding step, one row of steps.parquet), the schema version and the columns and keys it
fixes. Neither pandas nor pyarrow is imported here: the decoding loop builds StepRecords, and importing the
algorithmic core must not load the result-file libraries (tests/test_results_schema.py checks it)."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np

from specbench.measure import metrics
from specbench.measure.mismatch import Mismatch
from specbench.questions import Prompt


@dataclass(frozen=True)
class StepRecord:
    """Timings and counts of one decoding step (one row of steps.parquet). Step 0 is the prefill, which
    yields the first token; its draft_s holds ``Drafter.begin`` and the first ``accept``.

    draft_tokens:     draft tokens verified (after the cuts), non-candidates (Lookahead's window) included.
    verify_tokens:    tokens in the target's forward pass: last committed token + draft + shape padding
                      (for the prefill: the prompt length).
    accepted_tokens:  tokens appended to the output, the bonus token included.
    draft_s:          time in the drafter (propose and accept), its device work included.
    verify_s:         the target's forward pass, up to its choices (argmax, top-k) being on the host.
    overhead_s:       the rest of the step: planning (cuts, draft budget), building the inputs, the acceptance
                      walk, the KV-cache compaction, bookkeeping.
                      The three seconds (TIMING_FIELDS) are None for an engine that runs its own loop and
                      reports what each step accepted but not how long its phases took: stored as null in
                      steps.parquet, never as 0, so no per-phase time is ever made up.
    context_len:      prompt + generated tokens before the step.
    draft_depth:      longest path of candidate draft tokens verified (a chain's length); with
                      accepted_tokens it gives the acceptance per draft position.
    source:           label of the last accepted draft token (Draft.sources), "" when none was accepted or
                      the drafter gives no labels.
    candidate_tokens: draft tokens verified that could be accepted (draft_tokens minus non-candidates); the
                      denominator of the acceptance rate.

    Every phase boundary the loop times is a fenced clock read (see ``specbench.decoding.loop``). Changing these
    fields changes steps.parquet: bump SCHEMA_VERSION (tests/test_records.py pins the columns of each version).
    """

    step: int
    draft_tokens: int
    verify_tokens: int
    accepted_tokens: int
    draft_s: float | None
    verify_s: float | None
    overhead_s: float | None
    context_len: int
    draft_depth: int = 0
    source: str = ""
    candidate_tokens: int = 0


SCHEMA_VERSION = 3
# Schemas the readers (analysis, resuming) understand: 3 adds run.json's full settings, the weights fingerprint,
# summary.json's "timing" and "skipped"; steps.parquet is unchanged from 2.
SUPPORTED_SCHEMAS = (2, 3)
STEP_COLUMNS = ["question_id", "turn", *StepRecord.__dataclass_fields__]
TIMING_FIELDS = ("draft_s", "verify_s", "overhead_s")  # the per-step seconds: each may be None (no timings)
SUMMARY_KEYS = ("questions", "identical_to_baseline", "near_ties", "violations", "speedup", "speedup_mean_of_ratios",
                "mean_accepted_tokens", "acceptance_rate", "mean_acceptance_length", "acceptance_by_position",
                "per_position_acceptance_rate", "acceptance_histogram", "tokens_per_s", "baseline_tokens_per_s", "tpot_ms",
                *(f"tpot_p{percentile}_ms" for percentile in metrics.TPOT_PERCENTILES))


@dataclass
class Answer:
    """One decoder's answer to one question: per turn the text, the token ids, the steps, the wall time and
    the target's top-k tokens and logits per generated token (kept in memory for mismatch diagnosis only), and
    on a GPU the peak memory allocated while it was decoded (``specbench.measure.gpu_memory.peak_bytes``)."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    steps: list[list[StepRecord]] = field(default_factory=list)
    wall_times: list[float] = field(default_factory=list)
    top: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    peak_gpu_memory_bytes: int | None = None

    def to_record(self, prompt: Prompt, model_id: str, identical_to_baseline: bool | None,
                  mismatch: Mismatch | None = None) -> dict:
        """Spec-Bench's model_answer line, plus a ``specbench`` key that Spec-Bench's scripts ignore.

        accept_lengths has one entry per forward pass of the original method's run (``original_passes``),
        counting the bonus token, so plain decoding gives [1, 1, ...] exactly as Spec-Bench's baseline records
        it, and Spec-Bench's ``evaluation/speed.py`` (the mean of every entry) gives the summary's MAT. The
        ``specbench`` key holds the draft depths parallel to it and vLLM's acceptance histogram of this
        request (``specbench.measure.metrics.acceptance_histogram``); on a GPU also ``peak_gpu_memory_bytes`` (a CPU
        answer has no such key).
        """
        passes = [original_passes(steps) for steps in self.steps]
        lengths = [step.accepted_tokens for turn in passes for step in turn]
        depths = [step.draft_depth for turn in passes for step in turn]
        choice = {
            "index": 0,
            "turns": self.texts,
            "decoding_steps": [len(turn) for turn in passes],
            "new_tokens": [len(ids) for ids in self.token_ids],
            "wall_time": self.wall_times,
            "accept_lengths": lengths,
        }
        ours = {
            "task": prompt.task,
            "identical_to_baseline": identical_to_baseline,
            "drafted_tokens": sum(step.candidate_tokens for steps in self.steps for step in steps),
            # Per step, parallel to accept_lengths: the per-position and vLLM acceptance figures need them.
            "draft_depths": depths,
            "acceptance_histogram": metrics.acceptance_histogram(lengths, depths),
            "mismatch": None if mismatch is None else mismatch.to_dict(),
        }
        if all(steps for steps in self.steps):
            # Per turn, the prefill's seconds (the first step: the prompt's pass): a long prompt's prefill is
            # most of a short answer's wall time, which the busy-machine check must not read as a slow machine.
            ours["prefill_s"] = [prefill_seconds(steps[0]) for steps in self.steps]
        if self.peak_gpu_memory_bytes is not None:
            ours["peak_gpu_memory_bytes"] = self.peak_gpu_memory_bytes
        return {
            "question_id": prompt.question_id,
            "category": prompt.category,
            "answer_id": uuid.uuid4().hex,
            "model_id": model_id,
            "choices": [choice],
            "tstamp": time.time(),
            "specbench": ours,
        }

    def step_rows(self, question_id) -> list[dict]:
        return [
            {"question_id": question_id, "turn": turn, **asdict(step)}
            for turn, steps in enumerate(self.steps)
            for step in steps
        ]


def prefill_seconds(step: StepRecord) -> float | None:
    """The seconds of a turn's first step (the prefill: drafting, the prompt's pass and its bookkeeping); None when
    the step has no timings."""
    parts = [getattr(step, name) for name in TIMING_FIELDS]
    return None if any(part is None for part in parts) else float(sum(parts))


def original_passes(steps: list[StepRecord]) -> list[StepRecord]:
    """One turn's steps as its original method's run counts its forward passes, for the answer file: a
    prefill that settled nothing (``Drafter.first_draft_from_prompt``: PLD, SpS, Token Recycling) is left
    out, since the originals verify the first draft in the pass that reads the prompt (PLD, SpS: Spec-Bench
    ``model/pld/pld.py:86-135`` and ``model/sps/decoding.py:253-362`` append one accept length per pass of
    their loop, the first one reading the prompt) or leave the prompt pass out of their counts (Token
    Recycling); Spec-Bench's ``evaluation/eval.py:223-230`` writes those entries and their count
    (decoding_steps). Written as a 0, the prefill would be averaged in by ``evaluation/speed.py:29, 65`` (the
    mean of every entry), which ``metrics.mean_accepted_tokens`` leaves out. steps.parquet keeps every step."""
    if steps and steps[0].step == 0 and steps[0].accepted_tokens == 0:
        return steps[1:]
    return steps


# Why a question is in skipped.jsonl, as the summary counts them. Records written before causes were kept have
# none: those were all prompts too long for the context.
SKIP_CAUSES = {"too_long": "too long for the context", "out_of_memory": "out of GPU memory",
               "timeout": "unfinished after engine.request_timeout_s"}
