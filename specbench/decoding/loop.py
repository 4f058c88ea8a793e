"""The one decoding loop that every method runs through, the autoregressive baseline included."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specbench.decoding.budget import DraftBudget, node_kinds
from specbench.decoding.kv_cache import TreeKVCache
from specbench.decoding.sampling import (
    Sampling,
    draw,
    sampled_accepted_path,
    target_distribution,
)
from specbench.decoding.tree import (
    ancestor_matrix,
    chain_parents,
    greedy_accepted_path,
    node_depths,
    node_parents,
    reindex_parents,
    select_nodes,
)
from specbench.drafters.base import Draft, Drafter, StepOutcome


@dataclass(frozen=True)
class StepRecord:
    """Timings and counts of one decoding step. Step 0 is the prefill, which yields the first token.

    draft_tokens:    draft tokens verified (after the cut to the remaining budget), non-candidates included.
    verify_tokens:   tokens in the target's forward pass: last committed token + draft + shape padding
                     (for the prefill: the prompt length).
    accepted_tokens: tokens appended to the output, the bonus token included.
    draft_s:         time in the drafter (propose and accept).
    verify_s:        time in the target's forward pass, up to reading its choices back on the host.
    overhead_s:      everything else the loop does in the step (building inputs, acceptance, cache upkeep).
    context_len:     prompt + generated tokens before the step.
    draft_depth:     longest path of candidate draft tokens verified (a chain's length); with accepted_tokens
                     it gives the acceptance per draft position.
    source:          label of the last accepted draft token (Draft.sources), "" when none was accepted or
                     the drafter gives no labels.
    """

    step: int
    draft_tokens: int
    verify_tokens: int
    accepted_tokens: int
    draft_s: float
    verify_s: float
    overhead_s: float
    context_len: int
    draft_depth: int = 0
    source: str = ""


@dataclass
class Generation:
    """The result of decoding one prompt."""

    token_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    wall_s: float = 0.0
    finish_reason: str = "length"


def draft_depth(parents: np.ndarray, candidates: np.ndarray | None) -> int:
    """Depth of the deepest candidate node (node numbering), 0 for an empty draft."""
    if parents.size == 1:
        return 0
    depths = node_depths(parents)
    return int(depths.max() if candidates is None else depths[candidates].max())


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


class Decoder:
    """Runs prefill + draft/verify steps on a target model.

    Greedy (temperature 0): the output is identical to plain greedy decoding, since every appended token is
    the target's own argmax given all tokens before it. Sampling: every appended token is distributed exactly
    as plain sampling from the target would draw it (see ``specbench.decoding.sampling``). A drafter only
    changes how many tokens one forward pass settles.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: frozenset[int],
        max_draft_tokens: int,
        verify_shapes: VerifyShapes | None = None,
        draft_budget: DraftBudget | None = None,
        verify_cost=None,
        sampling: Sampling | None = None,
    ):
        self.model = model
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.max_draft_tokens = int(max_draft_tokens)
        self.verify_shapes = verify_shapes or VerifyShapes()
        self.draft_budget = draft_budget
        self.verify_cost = verify_cost  # a VerifyCost that learns from the step timings, if given
        self.sampling = sampling or Sampling()
        self.device = next(model.parameters()).device
        self.num_layers = model.config.get_text_config().num_hidden_layers
        if getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "flash_attention_2"):
            # A boolean 4-D mask means "may attend" to SDPA; eager attention would add it as a bias.
            raise ValueError("the target model must use SDPA attention for tree verification")

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], drafter: Drafter, max_new_tokens: int, on_step=None,
                 seed: int | None = None) -> Generation:
        """Decode up to ``max_new_tokens`` tokens after ``prompt_ids``, stopping after an EOS token.

        on_step: optional ``callable(tokens_generated, seconds_elapsed)`` called after every step, for
        progress display; it should return quickly, since its time counts in the wall time.
        seed: seed of this decode's random draws when sampling (default: the sampling config's seed).
        """
        generator = torch.Generator(device=self.device)
        generator.manual_seed(self.sampling.seed if seed is None else seed)
        clock = time.perf_counter
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        capacity = prompt.size + max_new_tokens + self.max_draft_tokens + 1
        context = np.empty(capacity, dtype=np.int64)
        context[: prompt.size] = prompt
        length = prompt.size
        cache = TreeKVCache(self.num_layers, capacity)
        generation = Generation(token_ids=[])

        self._synchronize()
        started = clock()
        drafter.begin(prompt)
        after_begin = clock()
        first = self._prefill(cache, prompt, generator)
        after_prefill = clock()
        context[length] = first
        length += 1
        drafter.accept(context[length - 1 : length], StepOutcome(Draft.empty(), np.array([first]), ()))
        done = clock()
        generation.token_ids.append(first)
        generation.steps.append(
            StepRecord(step=0, draft_tokens=0, verify_tokens=prompt.size, accepted_tokens=1,
                       draft_s=(after_begin - started) + (done - after_prefill), verify_s=after_prefill - after_begin,
                       overhead_s=0.0, context_len=prompt.size)
        )
        if first in self.eos_token_ids:
            generation.finish_reason = "eos"

        step = 0
        while generation.finish_reason != "eos" and len(generation.token_ids) < max_new_tokens:
            step += 1
            step_started = clock()
            draft = drafter.propose(context[:length])
            drafted = clock()

            # The step may add at most `remaining` tokens, one of which is the bonus token.
            remaining = max_new_tokens - len(generation.token_ids)
            kept, draft_tokens, draft_parents, candidates, kinds = self._fit(draft, remaining - 1, drafter.name)
            parents = node_parents(draft_parents)
            node_tokens = np.concatenate(([context[length - 1]], draft_tokens))
            start = cache.length
            inputs = self._verification_inputs(node_tokens, parents, start)
            built = clock()

            logits = self._forward(cache, *inputs)[: parents.size]
            target_tokens = logits.argmax(dim=-1).cpu().numpy()
            if self.sampling.greedy:
                path = greedy_accepted_path(parents, node_tokens, target_tokens, candidates)
                final = int(target_tokens[path[-1] if path else 0])
            else:
                draft_probs = None if draft.probs is None else draft.probs[torch.from_numpy(kept).to(draft.probs.device)]
                path, final = sampled_accepted_path(parents, node_tokens, target_distribution(logits, self.sampling),
                                                    draft_probs, candidates, generator)
            verified = clock()
            if self.verify_cost is not None:
                self.verify_cost.observe(int(inputs[0].shape[1]), verified - built)
            new_tokens = [int(t) for t in node_tokens[path]] + [final]
            for cut, token in enumerate(new_tokens):
                if token in self.eos_token_ids:
                    new_tokens = new_tokens[: cut + 1]
                    generation.finish_reason = "eos"
                    break
            cache.keep_nodes(start, [0, *path])
            context[length : length + len(new_tokens)] = new_tokens
            length += len(new_tokens)
            generation.token_ids.extend(new_tokens)
            accepted_nodes = tuple(int(kept[node - 1]) for node in path)
            if kinds is not None:
                self.draft_budget.observe(drafter.name, draft_parents, kinds,
                                          None if candidates is None else candidates[1:], [node - 1 for node in path])
            source = draft.sources[accepted_nodes[-1]] if accepted_nodes and draft.sources else ""
            if kept.size == len(draft):
                all_target_tokens = target_tokens
            else:
                all_target_tokens = np.full(len(draft) + 1, -1, dtype=target_tokens.dtype)
                all_target_tokens[0] = target_tokens[0]
                all_target_tokens[kept + 1] = target_tokens[1:]
            bookkept = clock()

            drafter.accept(context[length - len(new_tokens) : length],
                           StepOutcome(draft, all_target_tokens, accepted_nodes))
            step_done = clock()

            generation.steps.append(
                StepRecord(
                    step=step,
                    draft_tokens=int(draft_tokens.size),
                    verify_tokens=int(inputs[0].shape[1]),
                    accepted_tokens=len(new_tokens),
                    draft_s=(drafted - step_started) + (step_done - bookkept),
                    verify_s=verified - built,
                    overhead_s=(built - drafted) + (bookkept - verified),
                    context_len=length - len(new_tokens),
                    draft_depth=draft_depth(parents, candidates),
                    source=source,
                )
            )
            if on_step is not None:
                on_step(len(generation.token_ids), clock() - started)
        generation.wall_s = clock() - started
        return generation

    def _fit(self, draft: Draft, max_depth: int, drafter_name: str):
        """The part of the draft to verify: (kept indices into the draft, their tokens, their parents in the
        kept numbering, candidate flags in node numbering or None, their kinds for the draft budget or None).
        Candidate paths are cut to ``max_depth`` tokens, the draft to ``max_draft_tokens`` nodes, and then,
        with a draft budget, to the nodes worth their verification time."""
        tokens = draft.token_ids.numpy()
        if self.draft_budget is None and draft.parents is None and draft.candidates is None:
            count = min(tokens.size, max_depth, self.max_draft_tokens)
            return np.arange(count), tokens[:count], chain_parents(count), None, None
        parents = draft.parents.numpy() if draft.parents is not None else chain_parents(tokens.size)
        candidates = draft.candidates.numpy() if draft.candidates is not None else None
        kept = select_nodes(parents, candidates, max_depth, self.max_draft_tokens)
        kinds = None
        if self.draft_budget is not None and kept.size:
            all_kinds = node_kinds(parents, node_depths(node_parents(parents))[1:], draft.sources)
            chosen = self.draft_budget.select(drafter_name, reindex_parents(parents, kept),
                                              [all_kinds[i] for i in kept],
                                              None if candidates is None else candidates[kept])
            kept = kept[chosen]
            kinds = [all_kinds[i] for i in kept]
        if kept.size < tokens.size:
            tokens, parents = tokens[kept], reindex_parents(parents, kept)
            candidates = None if candidates is None else candidates[kept]
        node_candidates = None if candidates is None else np.concatenate(([True], candidates))
        return kept, tokens, parents, node_candidates, kinds

    def _verification_inputs(self, node_tokens: np.ndarray, parents: np.ndarray, start: int):
        """input ids [1, q], position ids [1, q] and the boolean attention mask [1, 1, q, start + q] for the
        root + draft nodes, padded to the verify shape with copies of the root that nothing attends to."""
        n_nodes = parents.size
        size = self.verify_shapes.padded(n_nodes)
        tokens = np.empty(size, dtype=np.int64)
        tokens[:n_nodes] = node_tokens
        tokens[n_nodes:] = node_tokens[0]
        positions = np.full(size, start, dtype=np.int64)
        positions[:n_nodes] += node_depths(parents)
        visible = np.zeros((size, size), dtype=bool)
        visible[:n_nodes, :n_nodes] = ancestor_matrix(parents)
        visible[np.arange(n_nodes, size), np.arange(n_nodes, size)] = True
        mask = torch.ones((1, 1, size, start + size), dtype=torch.bool)
        mask[0, 0, :, start:] = torch.from_numpy(visible)
        return (
            torch.from_numpy(tokens).to(self.device).unsqueeze(0),
            torch.from_numpy(positions).to(self.device).unsqueeze(0),
            mask.to(self.device),
        )

    def _prefill(self, cache: TreeKVCache, prompt: np.ndarray, generator: torch.Generator | None = None) -> int:
        input_ids = torch.from_numpy(prompt).to(self.device).unsqueeze(0)
        logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1:]
        if self.sampling.greedy:
            return int(logits[0].argmax())
        return draw(target_distribution(logits, self.sampling)[0], generator)

    def _forward(self, cache: TreeKVCache, input_ids, position_ids, mask) -> torch.Tensor:
        """[verified tokens, vocab] logits of one verification forward pass."""
        return self.model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True
        ).logits[0]

    @torch.inference_mode()
    def measure_verify_latency(self, prompt_ids: list[int], sizes: list[int], repeats: int) -> dict[int, float]:
        """Median seconds of one verification forward pass over q tokens, for each q in ``sizes``, on top
        of the KV cache of ``prompt_ids``. Repeats are interleaved across sizes so drift hits all alike."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        cache = TreeKVCache(self.num_layers, prompt.size + max(sizes))
        self._prefill(cache, prompt)
        start = cache.length
        timings: dict[int, list[float]] = {size: [] for size in sizes}
        for _ in range(repeats):
            for size in sizes:
                parents = node_parents(chain_parents(size - 1))
                node_tokens = np.resize(prompt, size)
                inputs = self._verification_inputs(node_tokens, parents, start)
                self._synchronize()
                began = time.perf_counter()
                self._forward(cache, *inputs).argmax(dim=-1).cpu()
                timings[size].append(time.perf_counter() - began)
                cache.truncate(start)
        return {size: float(np.median(values)) for size, values in timings.items()}
