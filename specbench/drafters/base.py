"""The drafter interface: every speculative method differs from the others only here.

A drafter is prepared once for a target model, then lives through one question at a time:

    prepare(target, sampling)       load what it needs for this target and sampling configuration
    begin(prompt_ids)               a new question: reset per-question state
    propose(context_ids) -> Draft   candidate tokens for the next step (may be empty)
    accept(accepted_ids, outcome)   what the target kept, so stateful drafters can learn from it

Counting convention, used everywhere in specbench: a step's *accepted tokens* are the draft tokens the
target agreed with plus the one token the target produces itself at the end of the accepted path (the
bonus token). Plain autoregressive decoding therefore accepts exactly 1 token per step, as Spec-Bench's
"mean accepted tokens" counts it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class Draft:
    """Candidate tokens for one step: a chain, or a tree flattened so that parents precede children.

    token_ids:  [n] candidate token ids.
    parents:    [n] index (into token_ids) of each token's parent, -1 for a child of the last committed
                token; None means a chain (token i follows token i-1).
    probs:      [n, vocab] the distribution each token was drawn from; None for a deterministic drafter.
    candidates: [n] bool, False for tokens the target scores only so that the drafter can read its choices
                (Lookahead's Jacobi window): they are never accepted. None means all are candidates.
    sources:    [n] a label per token naming where it came from (HD's databases); the label of the last
                accepted token is recorded with the step. None when the drafter has one source.
    """

    token_ids: torch.LongTensor
    parents: torch.LongTensor | None = None
    probs: torch.FloatTensor | None = None
    candidates: torch.BoolTensor | None = None
    sources: tuple[str, ...] | None = None

    def __post_init__(self):
        assert self.token_ids.ndim == 1, "Draft.token_ids must be 1-D"
        if self.parents is not None:
            assert self.parents.shape == self.token_ids.shape, "Draft.parents must match token_ids"
        if self.probs is not None:
            assert self.probs.ndim == 2 and self.probs.shape[0] == self.token_ids.shape[0]
        if self.candidates is not None:
            assert self.candidates.shape == self.token_ids.shape and self.candidates.dtype == torch.bool
        if self.sources is not None:
            assert len(self.sources) == self.token_ids.shape[0]

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @staticmethod
    def empty() -> Draft:
        return Draft(token_ids=torch.empty(0, dtype=torch.long))

    @staticmethod
    def chain(token_ids) -> Draft:
        """A chain draft from any 1-D integer sequence (numpy array, list or tensor)."""
        if isinstance(token_ids, np.ndarray):
            return Draft(token_ids=torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64)))
        return Draft(token_ids=torch.as_tensor(token_ids, dtype=torch.long))


@dataclass(frozen=True)
class StepOutcome:
    """What the target decided in one step, handed to ``Drafter.accept``.

    draft:          the draft as proposed.
    target_tokens:  [1 + len(draft)] the target's choice after the last committed token (index 0) and after
                    each draft token (index i+1 for draft token i); -1 for draft tokens that were not
                    verified (cut to the remaining token budget or to run.max_draft_tokens).
    accepted_nodes: indices into the draft of the accepted path, in order.
    """

    draft: Draft
    target_tokens: np.ndarray
    accepted_nodes: tuple[int, ...]


class Drafter(ABC):
    """Base class of all drafters. Subclasses are built from ``conf/drafter/<name>.yaml``."""

    #: name used in records and result tables; set from the config.
    name: str = "drafter"

    def prepare(self, target, sampling=None) -> None:
        """Called once before the first question with the target (a ``specbench.models.LoadedModel``) and
        the run's ``specbench.decoding.sampling.Sampling`` (None = greedy): load databases or models, check
        that they fit the target's tokenizer, move to its device."""

    def begin(self, prompt_ids: np.ndarray) -> None:
        """Start a new question whose prompt is ``prompt_ids`` ([prompt_len] int64)."""

    @abstractmethod
    def propose(self, context_ids: np.ndarray) -> Draft:
        """Candidate continuation of ``context_ids`` ([len] int64: prompt + tokens generated so far; a
        read-only view owned by the loop). Return ``Draft.empty()`` when there is nothing worth verifying."""

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        """The tokens appended to the context this step (accepted draft tokens + bonus token)."""


def require_positive(**settings) -> None:
    """Reject a drafter setting that is not a positive integer, naming it: ``drafter.gamma must be ...``."""
    for key, value in settings.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecbenchError(f"drafter.{key} must be a positive integer, got {value!r}")
