"""The one decoding loop that every method runs through, the autoregressive baseline included.

Each step is draft, verify, accept, record; the loop talks to the model only through a ``Target``
(``specbench.decoding.target``). Every phase boundary is a clock read fenced as far as the work before it needs
(the devices synchronised first where that work may still be queued), so a phase's time holds exactly the work
done in it:

    draft_s     drafter.propose and drafter.accept (a model drafter's device work included)
    verify_s    the target's forward pass over the planned nodes, up to its choices being on the host
    overhead_s  planning the step (cuts, draft budget), building the inputs, the acceptance walk, the KV-cache
                compaction, the draft budget's bookkeeping

Fences per greedy step: the verify phase ends with the target's one blocking read of its choices, which waits
for the pass, so no synchronisation is added there; building the inputs is host work (their uploads are queued
without blocking and land in verify); the KV-cache compaction is device work, fenced once before the drafter
learns; a drafter that queues device work of its own (``Drafter.queues_device_work``) adds a fence after
proposing and after learning. A host-only drafter's step thus costs one synchronisation and one blocking read.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from specbench.decoding.budget import DraftBudget, VerifyCost
from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.plan import VerifyPlan, plan_verification, verification_inputs
from specbench.decoding.target import Target, TargetChoices
from specbench.decoding.sampling import Sampling, draw, sampled_accepted_path, target_distribution
from specbench.decoding.tree import greedy_accepted_path
from specbench.results.schema import StepRecord


class FencedClock:
    """``read()`` waits for the device's queued work, then reads ``time.perf_counter()``: on a GPU, kernels run
    asynchronously, and an unfenced read would bill their time to whichever later read waits first."""

    def __init__(self, synchronize: Callable[[], None], now: Callable[[], float] = time.perf_counter):
        self.synchronize = synchronize
        self.now = now

    def read(self) -> float:
        self.synchronize()
        return self.now()


@dataclass
class Generation:
    """The result of decoding one prompt.

    token_ids:  the generated tokens.
    steps:      one record per step (step 0 = the prefill).
    top_ids:    [len(token_ids), k] the target's k highest-scoring tokens at each generated position, under
                the forward pass that settled it; ``top_logits`` holds their logits. They explain a divergence
                from another decode of the same prompt (``specbench.measure.mismatch``).
    """

    token_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    wall_s: float = 0.0
    finish_reason: str = "length"
    top_ids: np.ndarray | None = None
    top_logits: np.ndarray | None = None


class VerifyShapes:
    """Maps the number of tokens a step must verify to the number it should feed the target.

    On some hardware a forward pass over a few more tokens is faster than over fewer (on a 2-core CPU with
    MKL, 2-3 tokens are slower than 4, because small matrix products take a slower kernel). Padding a step
    to the faster shape with tokens that nothing attends to, and whose outputs are dropped, is then free.
    ``pad_to[q]`` is the shape used for q tokens; shapes beyond the table are used as they are.
    """

    def __init__(self, pad_to: list[int] | None = None):
        self.pad_to = list(pad_to or [])
        self._table = np.array(self.pad_to, dtype=np.int64)

    def padded(self, size: int) -> int:
        return self.pad_to[size] if size < len(self.pad_to) else size

    def padded_array(self, sizes: np.ndarray) -> np.ndarray:
        """``padded`` for an array of sizes."""
        if self._table.size == 0:
            return sizes
        return np.where(sizes < self._table.size, self._table[np.minimum(sizes, self._table.size - 1)], sizes)

    @staticmethod
    def from_latencies(latencies: dict[int, float], min_gain: float) -> VerifyShapes:
        """Pad q to the shape q' >= q with the lowest measured latency, when it beats q's by ``min_gain``
        (a fraction) or more; small differences are noise and are left alone."""
        largest = max(latencies)
        pad_to = list(range(largest + 1))
        for size in range(1, largest + 1):
            best = min(range(size, largest + 1), key=lambda s: latencies[s])
            if latencies[best] < latencies[size] * (1.0 - min_gain):
                pad_to[size] = best
        return VerifyShapes(pad_to)


@dataclass(frozen=True)
class DecodePolicy:
    """How a decoder shapes and cuts what it verifies, as the start-up calibration decided it from the target's
    measured verify latencies (``specbench.engines.calibration``): the padded shapes, the verify cost that learns
    from step timings (None: none learns) and the draft budget (None: every draft node is verified)."""

    verify_shapes: VerifyShapes = field(default_factory=VerifyShapes)
    verify_cost: VerifyCost | None = None
    draft_budget: DraftBudget | None = None


def cut_at_eos(tokens: list[int], eos_token_ids: frozenset[int]) -> tuple[list[int], bool]:
    """``tokens`` up to and including the first EOS token, and whether there was one."""
    for index, token in enumerate(tokens):
        if token in eos_token_ids:
            return tokens[: index + 1], True
    return tokens, False


class _Sequence:
    """The growing context of one decode: prompt + generated tokens in a preallocated buffer and the target's
    top-k per generated token (the target keeps the KV cache)."""

    def __init__(self, prompt: np.ndarray, headroom: int):
        self.prompt = prompt
        self.buffer = np.empty(prompt.size + headroom, dtype=np.int64)
        self.buffer[: prompt.size] = prompt
        self.length = prompt.size
        self.top_ids: list[np.ndarray] = []
        self.top_logits: list[np.ndarray] = []
        self.ended = False

    @property
    def context(self) -> np.ndarray:
        """Prompt + generated tokens (a view: drafters must not keep or modify it)."""
        return self.buffer[: self.length]

    @property
    def generated(self) -> int:
        return self.length - self.prompt.size

    @property
    def tokens(self) -> list[int]:
        """The generated tokens."""
        return self.buffer[self.prompt.size : self.length].tolist()

    @property
    def last_token(self) -> int:
        return int(self.buffer[self.length - 1])

    def last(self, count: int) -> np.ndarray:
        return self.buffer[self.length - count : self.length]

    def append(self, tokens: list[int], ended: bool, top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        self.buffer[self.length : self.length + len(tokens)] = tokens
        self.length += len(tokens)
        self.top_ids.append(top_ids)
        self.top_logits.append(top_logits)
        self.ended = ended


def drafter_seed(decode_seed: int) -> int:
    """The seed of a drafter's own draws in a decode seeded ``decode_seed``: of that decode alone, and apart from
    the verifier's draws (the same stream in both would correlate a draft token with its acceptance test)."""
    return zlib.crc32(f"{decode_seed}:drafter".encode())


class Decoder:
    """Runs prefill + draft/verify steps on a target.

    Greedy (temperature 0): the output is identical to plain greedy decoding, since every appended token is
    the target's own argmax given all tokens before it. Sampling: every appended token is distributed exactly
    as plain sampling from the target would draw it (see ``specbench.decoding.sampling``). A drafter only
    changes how many tokens one forward pass settles.

    target_top_k: how many of the target's best tokens per verified node ``StepOutcome.target_top_ids`` carries
                  (0: none), at least the drafter's own ``target_top_k``. The generation keeps
                  max(target_top_k, diagnostic_top_k) per generated token.
    clock:        the fenced clock of the phase boundaries (default: fenced by the target's synchronize).
    """

    def __init__(
        self,
        target: Target,
        eos_token_ids: frozenset[int],
        max_draft_tokens: int,
        verify_shapes: VerifyShapes | None = None,
        draft_budget: DraftBudget | None = None,
        verify_cost: VerifyCost | None = None,
        sampling: Sampling | None = None,
        target_top_k: int = 0,
        diagnostic_top_k: int = 8,
        clock: FencedClock | None = None,
    ):
        if not isinstance(target, Target):
            raise TypeError(f"Decoder takes a specbench Target (LoadedModel.target), not {type(target).__name__}")
        self.target = target
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.max_draft_tokens = int(max_draft_tokens)
        self.verify_shapes = verify_shapes or VerifyShapes()
        self.draft_budget = draft_budget
        self.verify_cost = verify_cost  # learns from the step timings, if given
        self.sampling = sampling or Sampling()
        self.target_top_k = int(target_top_k)
        self.top_k = max(self.target_top_k, int(diagnostic_top_k), 2)
        self._read_k = self.top_k  # of the decode in progress: at least the drafter's top-k (set by generate)
        self._drafter_top_k = self.target_top_k
        self.clock = clock or FencedClock(target.synchronize)
        self._fence_drafter = self.clock.now

    def use_policy(self, policy: DecodePolicy) -> None:
        """Decode from now on as ``policy`` says (the calibration's result, decided after the warm-up decodes)."""
        self.verify_shapes = policy.verify_shapes
        self.verify_cost = policy.verify_cost
        self.draft_budget = policy.draft_budget

    def forget_learning(self) -> None:
        """Reset what the draft budget and the verify cost learned from earlier steps to their calibrated
        start, so that the next question is decoded as if it were the first."""
        if self.draft_budget is not None:
            self.draft_budget.forget()
        if self.verify_cost is not None:
            self.verify_cost.forget()

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], drafter: Drafter, max_new_tokens: int, on_step=None,
                 seed: int | None = None) -> Generation:
        """Decode up to ``max_new_tokens`` tokens after ``prompt_ids``, stopping after an EOS token.

        on_step: optional ``callable(tokens_generated, seconds_elapsed)`` called after every step, for
        progress display; it should return quickly, since its time counts in the wall time (not in a phase).
        seed: seed of this decode's random draws when sampling (default: the sampling config's seed).
        """
        decode_seed = self.sampling.seed if seed is None else seed
        generator = torch.Generator(device=self.target.device)
        generator.manual_seed(decode_seed)
        drafter.decodes_with(self.target)
        drafter.seed_draws(drafter_seed(decode_seed))
        self._drafter_top_k = max(self.target_top_k, int(drafter.target_top_k))
        self._read_k = max(self.top_k, self._drafter_top_k)
        # The clock read that ends a drafter's work: fenced only when it may have queued device work.
        self._fence_drafter = self.clock.read if drafter.queues_device_work else self.clock.now
        sequence = _Sequence(np.asarray(prompt_ids, dtype=np.int64), max_new_tokens + self.max_draft_tokens + 1)
        try:
            self.target.start(sequence.buffer.size)
            self.target.request_hidden_states(tuple(drafter.hidden_state_layers))
            started = self.clock.read()
            steps = [self._prefill_step(sequence, drafter, generator)]
            while not sequence.ended and sequence.generated < max_new_tokens:
                steps.append(self._step(len(steps), sequence, drafter, max_new_tokens - sequence.generated,
                                        generator))
                if on_step is not None:
                    on_step(sequence.generated, self.clock.now() - started)
            wall_s = self.clock.read() - started
        finally:
            # Done or failed, the decode's caches go: the next answer's peak memory is its own, and a caller that
            # goes on after an error (out of memory) meets a target as fresh as a new one.
            self.target.release()
            drafter.release()
        return Generation(token_ids=sequence.tokens, steps=steps, wall_s=wall_s,
                          finish_reason="eos" if sequence.ended else "length",
                          top_ids=np.concatenate(sequence.top_ids), top_logits=np.concatenate(sequence.top_logits))

    def _prefill_step(self, sequence: _Sequence, drafter: Drafter, generator) -> StepRecord:
        """Step 0: the drafter meets the prompt, the target reads it and picks the first token."""
        read, fence_drafter = self.clock.read, self._fence_drafter
        started = read()
        drafter.begin(sequence.prompt)
        began = fence_drafter()
        if drafter.first_draft_from_prompt:
            return self._prefill_short_of_last_token(sequence, started, began)
        choices = self.target.prefill(sequence.prompt, drafter.reads_prompt_choices, self._read_k)
        prefilled = self.clock.now()  # the choices' read waited for the pass
        first = int(choices.argmax[-1]) if self.sampling.greedy else draw(
            target_distribution(choices.logits[-1:], self.sampling)[0], generator)
        self._append(sequence, [first], choices, [len(choices.argmax) - 1])
        picked = read()
        drafter.accept(sequence.last(1), StepOutcome(step=0, draft=Draft.empty(), target_tokens=choices.argmax[-1:],
                                                     accepted_nodes=(), target_top_ids=self._top_for_drafter(choices),
                                                     hidden_states=self.target.hidden_states()))
        done = fence_drafter()
        return StepRecord(step=0, draft_tokens=0, verify_tokens=sequence.prompt.size, accepted_tokens=1,
                          draft_s=(began - started) + (done - picked), verify_s=prefilled - began,
                          overhead_s=picked - prefilled, context_len=sequence.prompt.size)

    def _prefill_short_of_last_token(self, sequence: _Sequence, started: float, began: float) -> StepRecord:
        """The prefill of a drafter whose first draft comes from the prompt (``first_draft_from_prompt``): the
        target reads every prompt token but the last, whose output the first step's pass gives (its root), and
        settles nothing; a one-token prompt leaves nothing to read here."""
        prompt = sequence.prompt
        if prompt.size > 1:
            self.target.prefill(prompt[:-1], False, self._read_k)  # its choices are dropped: nothing is settled
        prefilled = self.clock.read()  # the choices were not read: fenced, so the pass is billed here
        return StepRecord(step=0, draft_tokens=0, verify_tokens=prompt.size - 1, accepted_tokens=0,
                          draft_s=began - started, verify_s=prefilled - began, overhead_s=0.0,
                          context_len=prompt.size - 1)

    def _step(self, step: int, sequence: _Sequence, drafter: Drafter, remaining: int, generator) -> StepRecord:
        """One decoding step: draft, verify, accept, record. It adds at most ``remaining`` tokens, the last of
        which is the target's own (the bonus token)."""
        now, fence_drafter = self.clock.now, self._fence_drafter
        step_started = now()  # the previous step ended fenced
        draft = drafter.propose(sequence.context)
        drafted = fence_drafter()

        plan = plan_verification(draft, sequence.last_token, remaining - 1, self.max_draft_tokens,
                                 self.draft_budget, drafter.name)
        start = self.target.length
        verify_tokens = self.verify_shapes.padded(plan.n_nodes)
        inputs = verification_inputs(plan, start, verify_tokens)
        built = now()  # host work only

        choices = self.target.verify(inputs, plan.n_nodes, self._read_k)
        verified = now()  # the choices' read waited for the pass

        path, final = self._accept(plan, choices, draft, generator)
        kept_nodes = [0, *path]  # the root and the accepted nodes: what settled this step's tokens
        context_len = sequence.length
        new_tokens = self._append(sequence, [int(t) for t in plan.node_tokens[path]] + [final], choices, kept_nodes)
        self.target.keep(start, kept_nodes)
        self._learn_costs(drafter.name, plan, path, verify_tokens, verified - built)
        outcome = self._outcome(step, draft, plan, choices, path, kept_nodes)
        candidate_tokens, draft_depth = plan.candidate_tokens(), plan.candidate_depth()
        bookkept = self.clock.read()  # the compaction is device work

        drafter.accept(sequence.last(len(new_tokens)), outcome)
        step_done = fence_drafter()

        return StepRecord(
            step=step, draft_tokens=plan.n_nodes - 1, candidate_tokens=candidate_tokens,
            verify_tokens=verify_tokens, accepted_tokens=len(new_tokens),
            draft_s=(drafted - step_started) + (step_done - bookkept), verify_s=verified - built,
            overhead_s=(built - drafted) + (bookkept - verified), context_len=context_len,
            draft_depth=draft_depth,
            source=draft.sources[outcome.accepted_nodes[-1]] if outcome.accepted_nodes and draft.sources else "",
        )

    def _append(self, sequence: _Sequence, tokens: list[int], choices: TargetChoices, deciding_nodes: list[int]):
        """Append ``tokens`` (cut after an EOS) with the top-k of the node whose output settled each one."""
        tokens, ended = cut_at_eos(tokens, self.eos_token_ids)
        rows = deciding_nodes[: len(tokens)]
        sequence.append(tokens, ended, choices.top_ids[rows, : self.top_k], choices.top_logits[rows, : self.top_k])
        return tokens

    def _learn_costs(self, drafter_name: str, plan: VerifyPlan, path: list[int], verify_tokens: int,
                     verify_s: float) -> None:
        """Feed the step's verify time and acceptance to the draft budget's models, when there is a budget."""
        if self.verify_cost is not None:
            self.verify_cost.observe(verify_tokens, verify_s)
        if plan.kinds is not None:
            self.draft_budget.observe(drafter_name, plan.draft_parents, plan.kinds,
                                      None if plan.candidates is None else plan.candidates[1:],
                                      [node - 1 for node in path])

    def _accept(self, plan: VerifyPlan, choices: TargetChoices, draft: Draft, generator) -> tuple[list[int], int]:
        """The accepted path (node indices, root excluded) and the token the target adds after it."""
        if self.sampling.greedy:
            path = greedy_accepted_path(plan.parents, plan.node_tokens, choices.argmax, plan.candidates)
            return path, int(choices.argmax[path[-1] if path else 0])
        draft_probs = None
        if draft.probs is not None:
            draft_probs = draft.probs[self.target.upload(plan.draft_indices, "draft_indices").to(draft.probs.device)]
        return sampled_accepted_path(plan.parents, plan.node_tokens, target_distribution(choices.logits, self.sampling),
                                     draft_probs, plan.candidates, generator)

    def _outcome(self, step: int, draft: Draft, plan: VerifyPlan, choices: TargetChoices, path: list[int],
                 kept_nodes: list[int]) -> StepOutcome:
        """The step as the drafter sees it, in its own (draft) numbering."""
        top = self._top_for_drafter(choices)
        return StepOutcome(step=step, draft=draft, target_tokens=plan.scatter(choices.argmax),
                           accepted_nodes=tuple(plan.to_draft(node) for node in path),
                           target_top_ids=None if top is None else plan.scatter(top),
                           hidden_states=self.target.hidden_states(kept_nodes))

    def _top_for_drafter(self, choices: TargetChoices) -> np.ndarray | None:
        k = self._drafter_top_k
        return choices.top_ids[:, :k] if k else None

    @torch.inference_mode()
    def measure_verify_latency(self, prompt_ids: list[int], sizes: list[int], repeats: int) -> dict[int, float]:
        """Median seconds of one verification pass over q tokens (forward + reading the choices back, as a
        step's verify_s counts it), for each q in ``sizes``, on top of the KV cache of ``prompt_ids``. Repeats
        are interleaved across sizes so drift hits all alike."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        timings: dict[int, list[float]] = {size: [] for size in sizes}
        try:
            self.target.start(prompt.size + max(sizes))
            self.target.request_hidden_states(())
            self.target.prefill(prompt, False, self.top_k)
            start = self.target.length
            for _ in range(repeats):
                for size in sizes:
                    tokens = np.resize(prompt, size)
                    plan = plan_verification(Draft.chain(tokens[1:]), int(tokens[0]), size, size)
                    inputs = verification_inputs(plan, start, size)
                    began = self.clock.read()
                    self.target.verify(inputs, plan.n_nodes, self.top_k)
                    timings[size].append(self.clock.read() - began)
                    self.target.truncate(start)
        finally:
            self.target.release()
        return {size: float(np.median(values)) for size, values in timings.items()}
