"""The contract between the decoding loop and a drafter: every speculative method differs only in its drafter.

A drafter is prepared once for a target model, then lives through one question at a time:

    prepare(target, sampling)       load what it needs for this target and sampling configuration
    decodes_with(target)            a new decode: the Target the loop verifies with (for self-drafting)
    seed_draws(decode_seed)         a new decode: the seed every random draw of this decode comes from
    begin(prompt_ids)               a new question: reset per-question state
    propose(context_ids) -> Draft   candidate tokens for the next step (may be empty)
    accept(accepted_ids, outcome)   what the target kept, so stateful drafters can learn from it
    release()                       the decode is over (or failed): free its device memory

A drafter that runs weights of its own (a draft head, a draft model) also says, once prepared, where another
engine can load the same weights (``shared_weights``) and gives its copy up when that engine runs them instead
(``release_weights``); ``draft_weights_fingerprint`` names a draft model's weights in run.json.

Per question the loop calls ``begin`` once, then ``accept`` for the prefill (step 0, whose outcome carries
``Draft.empty()``), then ``propose`` and ``accept`` once each per decoding step 1, 2, ..., always in that
order. ``outcome.draft`` is the very object the preceding ``propose`` returned (a drafter may compare with
``is``), and ``outcome.step`` numbers the steps as the step records do.

Counting convention, used everywhere in specbench: a step's *accepted tokens* are the draft tokens the
target agreed with plus the one token the target produces itself at the end of the accepted path (the
bonus token). Plain autoregressive decoding therefore accepts exactly 1 token per step, as Spec-Bench's
"mean accepted tokens" counts it.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch


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
    scores:     [n] the drafter's own ranking of its nodes, higher is better (REST: how many retrieved
                continuations start with the node's path), read only where a tree must be cut to one chain (a
                serving engine that verifies chains: ``decoding.tree.best_chain``). None: the drafter lists each
                node's best child first.
    """

    token_ids: torch.LongTensor
    parents: torch.LongTensor | None = None
    probs: torch.FloatTensor | None = None
    candidates: torch.BoolTensor | None = None
    sources: tuple[str, ...] | None = None
    scores: torch.Tensor | None = None

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
        if self.scores is not None:
            assert self.scores.shape == self.token_ids.shape, "Draft.scores must match token_ids"

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
class SharedWeights:
    """Weights a prepared drafter runs that another engine may load itself (vLLM's speculative ``model``).

    kind:     "head" (a draft head read with the target's features: EAGLE's, Medusa's, Hydra's) or "draft_model"
              (a model of its own that shares the target's tokenizer)
    location: a local directory, or a hub id (a published head's snapshot when cached)
    """

    kind: str
    location: str


@dataclass(frozen=True)
class StepOutcome:
    """What the target decided in one step, handed to ``Drafter.accept``.

    step:           the step number (0 = the prefill, which has no draft).
    draft:          the draft as proposed (the same object ``propose`` returned; ``Draft.empty()`` at step 0).
    target_tokens:  [1 + len(draft)] the target's choice after the last committed token (index 0) and after
                    each draft token (index i+1 for draft token i); -1 for draft tokens that were not
                    verified (cut to the remaining token budget, to run.max_draft_tokens or by the draft
                    budget). Greedy runs: the argmax; sampling runs: the argmax too (the emitted token may differ).
    accepted_nodes: indices into the draft of the accepted path, in order.
    target_top_ids: [1 + len(draft), k] the target's k highest-scoring tokens at the same positions, best
                    first, -1 rows where not verified; None when neither run.target_top_k nor the drafter's
                    ``target_top_k`` asks for them (the default, which costs nothing). At step 0 (the prefill)
                    one row, after the last prompt token, or one per prompt token (row i: after prompt token i)
                    for a drafter with ``reads_prompt_choices``. For drafters that learn from the target's
                    alternatives (Token Recycling).
    hidden_states:  [len(layers), n, hidden] on the target's device, the hidden states of the drafter's
                    ``hidden_state_layers`` at the positions that settled this step's tokens: the root and each
                    accepted node, in order (n = 1 + len(accepted_nodes)); at step 0 every prompt position. None
                    when the drafter asks for no layers. For drafters that read the target's features (EAGLE).
    """

    step: int
    draft: Draft
    target_tokens: np.ndarray
    accepted_nodes: tuple[int, ...]
    target_top_ids: np.ndarray | None = None
    hidden_states: torch.Tensor | None = None


class Drafter(ABC):
    """Base class of all drafters. Subclasses are built from ``conf/drafter/<name>.yaml``."""

    #: name used in records and result tables; set from the config.
    name: str = "drafter"
    #: how many of the target's best tokens per verified node this drafter reads (StepOutcome.target_top_ids)
    target_top_k: int = 0
    #: whether the prefill should score every prompt position for it (a full-width output layer over the prompt)
    reads_prompt_choices: bool = False
    #: whether propose/accept queue work on a device (a draft model): the loop then fences after them, so that
    #: work is billed to drafting; a host-only drafter spares the step those synchronisations
    queues_device_work: bool = False
    #: the target's layers whose hidden states this drafter reads (0 = the embeddings' output, i = after decoder
    #: layer i), in StepOutcome.hidden_states; () = none, and the target computes none
    hidden_state_layers: tuple[int, ...] = ()
    #: whether a turn's first draft is proposed from the prompt itself, as Token Recycling, PLD and SpS start: the
    #: prefill then reads the prompt but its last token and settles nothing (no ``accept`` follows it), and the
    #: first step drafts after the last prompt token. False: the prefill settles the first token and the first
    #: draft continues it
    first_draft_from_prompt: bool = False
    #: for a drafter that carries state across questions: whether the warm-up, which decodes the first measured
    #: question, teaches that state (Spec-Bench's Token Recycling: yes); False: the state is put back as it was
    #: before the warm-up, so that no measured question meets its own answer in it (SuffixDecoding's cache)
    warm_up_teaches: bool = True

    def prepare(self, target, sampling=None) -> None:
        """Called once before the first question with the target (a ``specbench.models.LoadedModel``) and
        the run's ``specbench.decoding.sampling.Sampling`` (None = greedy): load databases or models, check
        that they fit the target's tokenizer, move to its device."""

    def artefacts(self, target) -> list:
        """The cached artefacts ``prepare(target)`` loads, building them when missing (``artefacts.base.Artefact``
        objects: what, where, a rough build time, how to build and load), which ``python -m specbench.prepare``
        plans and builds ahead of time; builds nothing. ``prepare`` loads exactly these (``artefacts.base.fetch``),
        so the plan and the run cannot disagree. [] for a drafter that needs none."""
        return []

    def decodes_with(self, target) -> None:
        """Called before every decode with the ``Target`` the loop verifies with: a drafter that drafts with the
        target's own layers (``Target.skipping_pass``: Draft & Verify, SWIFT) runs its passes there, on the
        sequence's own cache; every other drafter ignores it."""

    def seed_draws(self, decode_seed: int) -> None:
        """Called before ``begin`` of every decode with a seed of that decode's own: a drafter that draws random
        numbers (a draft model sampling its tokens) draws them all from it, so that an answer does not depend on
        what was decoded before it, and a resumed run samples what an uninterrupted one did."""

    def begin(self, prompt_ids: np.ndarray) -> None:
        """Start a new question whose prompt is ``prompt_ids`` ([prompt_len] int64)."""

    def release(self) -> None:
        """Called after every decode, also one an error cut short: drop what belongs to that decode alone on the
        device (a draft model's KV cache), so that the next answer's peak memory does not count it. What is
        carried across questions (``state``) stays."""

    @abstractmethod
    def propose(self, context_ids: np.ndarray) -> Draft:
        """Candidate continuation of ``context_ids`` ([len] int64: prompt + tokens generated so far; a
        read-only view owned by the loop). Return ``Draft.empty()`` when there is nothing worth verifying."""

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        """The tokens appended to the context this step (accepted draft tokens + bonus token)."""

    def sources(self) -> dict:
        """What this drafter's databases or models were built from (after ``prepare``), for the run's record
        (summary.json ``drafter_sources``): e.g. HD's model database's prompt set. {} when nothing was built."""
        return {}

    def shared_weights(self) -> SharedWeights | None:
        """After ``prepare``: the weights this drafter runs, where another engine can load the same ones; None
        for a drafter that runs no weights, or whose weights exist only in memory (a draft converted from GGUF
        without a directory)."""
        return None

    def release_weights(self) -> None:
        """Free the weights ``prepare`` loaded, once another engine runs them from ``shared_weights`` instead:
        the drafter proposes nothing afterwards. Nothing for a drafter without weights."""

    def draft_weights_fingerprint(self) -> str | None:
        """After ``prepare``: the fingerprint of the draft model's weights this drafter runs (run.json's
        ``draft_weights_fingerprint``, which a resumed run must match); None for a drafter without a draft model."""
        return None

    def fork(self) -> Drafter:
        """After ``prepare``: a drafter for another question decoded at the same time (a serving engine's batch,
        ``specbench.engines.vllm_proposer``), sharing what ``prepare`` loaded (databases, automata) and holding
        per-question state of its own, which its ``begin`` starts. The default, a shallow copy, serves a drafter
        whose per-question state ``begin`` replaces rather than mutates (PLD and REST keep none); a drafter that
        mutates per-question objects in place overrides it."""
        return copy.copy(self)

    def fork_ended(self) -> None:
        """Called on a fork (``fork``) once its question has ended (a serving engine's request finished): a drafter
        whose forks share what they learn across questions hands its share over here (SuffixDecoding's response
        joins the global tree the other forks begin from). Nothing by default."""

    def state(self) -> dict[str, np.ndarray] | None:
        """What this drafter carries from one question to the next (Token Recycling's matrix), as named
        arrays; the runner saves it in the run directory after every question so that a resumed run continues
        from it. None: nothing is carried (every question starts afresh)."""
        return None

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Take back what ``state`` returned (on resuming a run, after the warm-up)."""
        raise NotImplementedError(f"{type(self).__name__} carries no state across questions")
