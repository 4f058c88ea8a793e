"""SWIFT (Xia et al., ICLR 2025; hemingkx/SWIFT): self-speculative decoding whose skip set is searched while it
decodes, and whose draft is a chain with siblings. docs/fidelity.md traces every setting to the original's file and
line.

Drafting (utils.py ``swift_draft``): skipping passes of the target (``Target.skipping_pass``) from the token the last
step ended on, up to ``max_step_draft`` tokens, each continuing the draft's most likely token; a token whose
probability is below ``stop_threshold`` is kept and ends the draft. Every depth also offers the draft's next most
likely tokens as siblings of its chain token, as many as its confidence earns (``siblings``: more when less sure),
so the target verifies a tree in one pass.

The skip set, searched on the fly (utils.py ``layer_bayes_search``): it starts as the odd layers' attentions and MLPs
(the first and last layers are never skipped); once a question's answer is longer than ``context_window`` + 1
tokens, every ``opt_interval`` steps one candidate of exactly int(2(L-2) x ``skip_ratio``) sublayers is scored, at
random, or every ``bayes_interval``-th by Bayesian optimisation (``training.layer_search``). Its score: how many of
the answer's first ``context_window`` next tokens a skipping pass over the answer's first ``context_window`` + 1
tokens, read right after the prompt, predicts. A candidate that beats the best score so far becomes the skip set.
The search stops for good at a score above ``max_score``, after ``max_tolerance_iter`` candidates without a better
one, or after ``max_opt_iter``; its state is carried from question to question (and saved with the run, so a resumed
run goes on from it).

Under sampling the tree is the same deterministic one, verified by specbench's lossless tree sampling (one-hot
siblings tried without replacement); SWIFT samples its siblings and verifies them with EAGLE's multi-candidate rule
(docs/fidelity.md).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.sampling import Sampling
from specbench.decoding.target import LayerSkip
from specbench.drafters.base import require_flag, require_non_negative, require_number, require_positive
from specbench.drafters.draft_model import plain
from specbench.drafters.layer_skipping import drafting_target, skip_set_setting, skipping_chain
from specbench.errors import SpecbenchError
from specbench.training.layer_search import (GaussianProcessUCB, point_of, random_skip_set, swift_skip_count,
                                             top_skip_set)

log = logging.getLogger(__name__)


def sibling_count(confidence: float, bounds: tuple[float, ...], counts: tuple[int, ...]) -> int:
    """How many candidates a depth of the draft offers (its chain token among them), by the confidence of its chain
    token: counts[i] for the first bound it is above, the last count below them all (utils.py)."""
    for bound, count in zip(bounds, counts):
        if confidence > bound:
            return count
    return counts[-1]


def tree_of(top_ids: list[np.ndarray], confidences: list[float], bounds, counts) -> tuple[list[int], list[int]]:
    """(tokens, parents) of SWIFT's tree: depth d hangs its ``sibling_count`` most likely tokens under the chain token
    of depth d - 1 (the root for d = 0); the first of them is depth d's chain token. Depth-major, parents first."""
    tokens, parents = [], []
    chain_parent = -1
    for ranked, confidence in zip(top_ids, confidences):
        first = len(tokens)
        for token in ranked[: sibling_count(confidence, bounds, counts)]:
            tokens.append(int(token))
            parents.append(chain_parent)
        chain_parent = first
    return tokens, parents


def initial_skip_set(num_layers: int) -> LayerSkip:
    """SWIFT's start: the attention and MLP of every odd layer from 1 to L - 3 (inference_swift.py)."""
    odd = frozenset(range(1, num_layers - 1, 2))
    return LayerSkip(odd, odd)


class Swift(Drafter):
    """SWIFT: layer-skipping self-drafting with an on-the-fly skip-set search and a chain-with-siblings tree."""

    queues_device_work = True  # its passes are the target's

    def __init__(self, name: str = "swift", max_step_draft: int = 25, stop_threshold: float = 0.8, top_k: int = 10,
                 confidence_bounds=(0.95, 0.8, 0.5), siblings=(3, 5, 8, 10), siblings_sampling=(1, 3, 5, 10),
                 skip_ratio: float = 0.45, context_window: int = 50, max_score: float = 0.93, opt_interval: int = 1,
                 bayes_interval: int = 25, max_opt_iter: int = 1000, max_tolerance_iter: int = 300,
                 optimization: bool = True, bayes: bool = True, kappa: float = 2.5, alpha: float = 1e-2,
                 seed: int = 2024, skip: dict | None = None, cache_hit: bool = False,
                 published_skip_sets: dict | None = None):
        require_positive(max_step_draft=max_step_draft, top_k=top_k, context_window=context_window,
                         opt_interval=opt_interval, bayes_interval=bayes_interval, max_opt_iter=max_opt_iter,
                         max_tolerance_iter=max_tolerance_iter)
        require_number("stop_threshold", stop_threshold, 0.0, 1.0)
        require_number("skip_ratio", skip_ratio, 0.0, 1.0)
        require_number("max_score", max_score, 0.0, 1.0)
        require_number("kappa", kappa, 0.0, 1e6)
        require_number("alpha", alpha, 0.0, 1e6, above_low=True)
        require_non_negative(seed=seed)
        require_flag(optimization=optimization, bayes=bayes, cache_hit=cache_hit)
        bounds, self.siblings, self.siblings_sampling = (tuple(plain(value)) for value in
                                                          (confidence_bounds, siblings, siblings_sampling))
        for key, counts in (("siblings", self.siblings), ("siblings_sampling", self.siblings_sampling)):
            if len(counts) != len(bounds) + 1:
                raise SpecbenchError(f"drafter.{key} needs one count per confidence bound and one below them "
                                     f"({len(bounds) + 1}), got {list(counts)}")
            require_positive(**{f"{key}[{i}]": count for i, count in enumerate(counts)})
            if max(counts) > top_k:
                raise SpecbenchError(f"drafter.{key} offers up to {max(counts)} tokens a depth, more than "
                                     f"drafter.top_k={top_k} read from each pass")
        self.bounds = tuple(require_number(f"confidence_bounds[{i}]", bound, 0.0, 1.0)
                            for i, bound in enumerate(bounds))
        self.name = name
        self.max_step_draft, self.stop_threshold, self.top_k = max_step_draft, float(stop_threshold), top_k
        self.skip_ratio, self.context_window, self.max_score = float(skip_ratio), context_window, float(max_score)
        self.opt_interval, self.bayes_interval = opt_interval, bayes_interval
        self.max_opt_iter, self.max_tolerance_iter = max_opt_iter, max_tolerance_iter
        self.optimization, self.bayes, self.kappa, self.alpha = optimization, bayes, float(kappa), float(alpha)
        self.seed = int(seed)
        self.given_skip = skip_set_setting("skip", plain(skip))
        self.cache_hit = cache_hit
        self.published = {model: skip_set_setting(f"published_skip_sets.{model}", value)
                          for model, value in (plain(published_skip_sets) or {}).items()}
        self.target = None
        self.skip: LayerSkip | None = None

    # ---- preparing ------------------------------------------------------------------------------------

    def prepare(self, target, sampling: Sampling | None = None) -> None:
        self.num_layers = target.num_layers
        self.sampling = sampling or Sampling()
        searching = self.optimization
        if self.cache_hit:  # the original's --cache-hit: the published set, and no search
            if self.published.get(target.name) is None:
                known = ", ".join(sorted(self.published)) or "none"
                raise SpecbenchError(f"drafter={self.name} drafter.cache_hit=true: no published skip set for "
                                     f"{target.name} (there are sets for {known}); set drafter.cache_hit=false to "
                                     "search one while decoding")
            start, self.skip_source = self.published[target.name], {"published": target.name}
            searching = False
        elif self.given_skip is not None:
            start, self.skip_source = self.given_skip, {"given": True}
        else:
            start, self.skip_source = initial_skip_set(target.num_layers), {"initial": "odd layers"}
        self.count = swift_skip_count(target.num_layers, self.skip_ratio)
        if searching and self.count == 0:
            log.warning("drafter=%s: a %d-layer target has no inner sublayers to search (SWIFT never skips the first "
                        "and last layers); it drafts with its start set throughout", self.name, target.num_layers)
            searching = False
        self.skip = start.checked(target.num_layers, "drafter.skip" if "given" in self.skip_source
                                  else f"the skip set for {target.name}")
        self.optimizer = GaussianProcessUCB(2 * (target.num_layers - 2), self.kappa, self.alpha)
        self.searching = searching
        self.best_score = 0.0  # utils.py: origin_score starts at 0; the start set is never scored
        self.opt_iter = self.tolerance_iter = 0

    def sources(self) -> dict:
        return {"skip_set": {**self.skip_source, "attention": sorted(self.skip.attention), "mlp": sorted(self.skip.mlp),
                             "searching": self.searching, "best_score": self.best_score, "candidates": self.opt_iter}}

    # ---- a decode -------------------------------------------------------------------------------------

    def decodes_with(self, target) -> None:
        self.target = drafting_target(self.name, target)

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.prompt_length = int(prompt_ids.size)
        self.answer: list[int] = []
        self.steps = 0
        self._last_draft = None

    def propose(self, context_ids: np.ndarray) -> Draft:
        top_ids, confidences = [], []

        def choose(logits: torch.Tensor) -> tuple[int, bool]:
            probs = torch.softmax(logits.float(), dim=-1)
            values, ids = probs.topk(min(self.top_k, probs.shape[-1]))
            top_ids.append(ids.cpu().numpy())
            confidence = float(values[0])
            confidences.append(confidence)
            return int(ids[0]), confidence >= self.stop_threshold

        skipping_chain(self.target, context_ids, self.skip, self.max_step_draft, choose)
        counts = self.siblings if self.sampling.greedy else self.siblings_sampling
        tokens, parents = tree_of(top_ids, confidences, self.bounds, counts)
        self._last_draft = Draft(torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long))
        return self._last_draft

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        self.answer.extend(int(token) for token in accepted_ids)
        if outcome.step == 0:
            return
        self.steps += 1
        if (self.searching and len(self.answer) > self.context_window + 1
                and self.steps % self.opt_interval == 0):
            self._search_step()

    def release(self) -> None:
        self._last_draft = None

    # ---- the search -----------------------------------------------------------------------------------

    def _search_step(self) -> None:
        """Score one candidate on the answer so far and keep it if it is the best yet (utils.py)."""
        layers = self.num_layers
        if self.bayes and (self.opt_iter + 1) % self.bayes_interval == 0 and self.optimizer.points:
            point = self.optimizer.suggest(np.random.default_rng([self.seed, self.opt_iter, 1]))
            candidate = LayerSkip(*top_skip_set(point, layers, self.count))
        else:
            candidate = LayerSkip(*random_skip_set(np.random.default_rng([self.seed, self.opt_iter]), layers,
                                                   self.count))
            point = point_of(candidate, layers)
        score = self.matchness(candidate)
        self.optimizer.register(point, score)
        if score > self.best_score:
            self.skip, self.best_score, self.tolerance_iter = candidate, score, 0
            if score > self.max_score:
                self.searching = False
        else:
            self.tolerance_iter += 1
        self.opt_iter += 1
        if self.tolerance_iter > self.max_tolerance_iter or self.opt_iter > self.max_opt_iter:
            self.searching = False

    def matchness(self, candidate: LayerSkip) -> float:
        """The share of the answer's first ``context_window`` next tokens that a skipping pass with ``candidate``
        over its first ``context_window`` + 1 tokens, right after the prompt, predicts (its argmax)."""
        window = np.asarray(self.answer[: self.context_window + 1], dtype=np.int64)
        length = self.target.length
        try:
            logits = self.target.skipping_pass(window, candidate, after=self.prompt_length)
        finally:
            self.target.truncate(length)
        predicted = logits[:-1].argmax(dim=-1).cpu().numpy()
        return float((predicted == window[1:]).sum()) / self.context_window

    # ---- carried across questions ---------------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray] | None:
        dimensions = 2 * (self.num_layers - 2)
        return {"attention": np.asarray(sorted(self.skip.attention), dtype=np.int64),
                "mlp": np.asarray(sorted(self.skip.mlp), dtype=np.int64),
                "points": (np.stack(self.optimizer.points) if self.optimizer.points
                           else np.zeros((0, dimensions))),
                "scores": np.asarray(self.optimizer.scores, dtype=float),
                "counters": np.asarray([self.opt_iter, self.tolerance_iter, int(self.searching)], dtype=np.int64),
                "best_score": np.asarray([self.best_score])}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.skip = LayerSkip(frozenset(state["attention"].tolist()), frozenset(state["mlp"].tolist()))
        self.optimizer = GaussianProcessUCB(2 * (self.num_layers - 2), self.kappa, self.alpha)
        for point, score in zip(state["points"], state["scores"]):
            self.optimizer.register(point, float(score))
        self.opt_iter, self.tolerance_iter, searching = (int(value) for value in state["counters"])
        self.searching = bool(searching)
        self.best_score = float(state["best_score"][0])
