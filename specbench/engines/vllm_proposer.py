"""specbench's drafters inside vLLM's step (``engine=vllm-custom``): the class vLLM's ``custom_class`` proposer
instantiates in its worker process (``SpecbenchProposer``, named in ``speculative_config.model``), and what it runs.

vLLM 0.32 calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`` after every step
(vllm/v1/worker/gpu_model_runner.py, the ``custom_class`` branch of ``propose_draft_token_ids``), with one entry per
row of its batch: the tokens that step appended to the row's request (none: the row did not decode this step, a
prefill chunk), the request's length and its tokens (prompt and output), and wants one list of draft token ids per
row, which it verifies as a chain with its own rejection sampler.

**Per-request state.** The call names rows, not requests, and rows move as requests finish (vLLM condenses its
batch). A drafter with per-question state (HD's context database, SAM-Decoding's context automaton) is kept per
request in a fork of the prepared drafter (``Drafter.fork``: the databases shared, the question's state its own),
keyed by the request's tokens: the fork that proposed for a request last step saw exactly the tokens that now
precede what this step appended, so each row finds its fork by those tokens (a dictionary keyed by their bytes: one
hash of the row's context per step, about a microsecond per thousand tokens) wherever the row has moved. A row no fork
saw is a new request: a fork begins on its tokens before this step's (its prompt, when vLLM asks right after the
prefill, as it does) and accepts what this step appended, as specbench's loop begins a question and accepts its
prefill. A fork that no row continued in a call is dropped: its request finished (or was preempted: on resuming, its
fork is rebuilt from its tokens, counted as ``rebuilt``). Nothing is rebuilt per step; the databases, datastores and
automata are loaded once per worker from the cache specbench's loop uses (``prepare`` with the target's identity,
never its weights), and never built there: one that is missing stops the worker in one line.

**Costs, measured.** Every call's drafting time (``time.perf_counter`` around the whole call, the forks' upkeep
included) is added to counters in a small file the run's process reads before and after each load level
(``ProposerCounters``), so a level records the seconds drafting added to vLLM's steps.

**Faults.** An exception in the drafter is written, in one line, to the run's fault file before it propagates and
stops vLLM's engine; the run's process reports that line, and nothing of the question in flight is written. A chain
longer than the ``num_speculative_tokens`` vLLM was started with is refused the same way (vLLM would verify part of
it, or fail inside its buffers).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.tree import best_chain
from specbench.errors import SpecbenchError
from specbench.results.proposer import ProposerCounters

log = logging.getLogger(__name__)

# The key of vLLM's ``additional_config`` that carries ``ProposerSpec.to_config()`` into its worker.
CONFIG_KEY = "specbench_proposer"
# The class vLLM's custom_class proposer imports (speculative_config.model).
PROPOSER_CLASS = "specbench.engines.vllm_proposer.SpecbenchProposer"


@dataclass(frozen=True)
class TargetIdentity:
    """What a drafter's ``prepare`` reads of the target to find its cached artefacts (name, source, tokenizer
    fingerprint, vocabulary, EOS ids), without the target's weights, which only vLLM holds in its worker. A drafter that
    would read the weights (to build an artefact) is refused in one line."""

    name: str
    source: str
    vocab_size: int
    eos_token_ids: frozenset
    tokenizer_fingerprint: str
    tokenizer_name: str
    tokenizer_eos: int | None

    @property
    def tokenizer(self):
        # What the artefacts' keys read of it (statistics_datastore.tokenizer_manifest, corpus_automaton's EOS).
        return SimpleNamespace(name_or_path=self.tokenizer_name, eos_token_id=self.tokenizer_eos)

    @property
    def weights(self):
        raise SpecbenchError(f"inside vLLM's worker the drafter has no access to {self.name}'s weights: what it builds "
                             "from them must be in the cache before vLLM starts")

    @staticmethod
    def of(model) -> TargetIdentity:
        """The identity of a loaded model (``specbench.models.LoadedModel``)."""
        from specbench.artefacts.statistics_datastore import tokenizer_name

        eos = getattr(model.tokenizer, "eos_token_id", None)
        return TargetIdentity(model.name, model.source, int(model.vocab_size), frozenset(map(int, model.eos_token_ids)),
                              model.tokenizer_fingerprint, tokenizer_name(model.tokenizer), None if eos is None else int(eos))

    def to_config(self) -> dict:
        return {"name": self.name, "source": self.source, "vocab_size": self.vocab_size,
                "eos_token_ids": sorted(self.eos_token_ids), "tokenizer_fingerprint": self.tokenizer_fingerprint,
                "tokenizer_name": self.tokenizer_name, "tokenizer_eos": self.tokenizer_eos}

    @staticmethod
    def from_config(values: dict) -> TargetIdentity:
        return TargetIdentity(**{**values, "eos_token_ids": frozenset(values["eos_token_ids"])})


@dataclass(frozen=True)
class ProposerSpec:
    """What the run's process hands vLLM's worker (through ``additional_config``, JSON): the resolved drafter group,
    its label and longest chain (``vllm_custom_drafters.CustomDrafter``), the target's identity, the counters and
    fault files and the cache the artefacts are read from."""

    drafter: dict
    label: str
    max_chain: int
    cut_to_chain: bool
    target: TargetIdentity
    counters: str
    fault: str
    cache: str | None = None

    def to_config(self) -> dict:
        return {"drafter": self.drafter, "label": self.label, "max_chain": self.max_chain,
                "cut_to_chain": self.cut_to_chain, "target": self.target.to_config(), "counters": self.counters,
                "fault": self.fault, "cache": self.cache}

    @staticmethod
    def from_config(values: dict) -> ProposerSpec:
        return ProposerSpec(**{**values, "target": TargetIdentity.from_config(values["target"])})


def build_drafter(node: dict) -> Drafter:
    """The drafter a resolved drafter group names, built without Hydra (vLLM's GPU images have none): its
    ``_target_`` class called with the group's other keys, as ``hydra.utils.instantiate`` would."""
    from specbench.targets.choice import locate

    return locate(str(node["_target_"]))(**{key: value for key, value in node.items() if key != "_target_"})


@dataclass
class RequestFork:
    """One request's fork of the drafter (``RequestDrafters.forks`` keys it by the request's tokens when it last
    proposed): its last draft (as proposed, and the draft indices of the chain vLLM was given), and its step count."""

    drafter: Drafter
    draft: Draft = field(default_factory=Draft.empty)
    chain_nodes: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    steps: int = 0


def chain_of(draft: Draft, cut_to_chain: bool) -> np.ndarray:
    """The draft indices vLLM is given of ``draft``: all of a chain; a tree's best chain (``best_chain``) when the
    drafter's trees are cut; a tree from a drafter that should draft chains is refused."""
    if draft.parents is None:
        count = len(draft)
        if draft.candidates is not None and not bool(draft.candidates.all()):
            count = int(np.argmin(draft.candidates.numpy()))  # the chain up to its first token that is no candidate
        return np.arange(count, dtype=np.int64)
    if not cut_to_chain:
        raise SpecbenchError("the drafter proposed a tree, and vLLM verifies a chain")
    return best_chain(draft.parents.numpy(), None if draft.scores is None else draft.scores.numpy(),
                      None if draft.candidates is None else draft.candidates.numpy())


def step_outcome(fork: RequestFork, appended: np.ndarray) -> StepOutcome:
    """What the target decided in the step that appended ``appended`` to the fork's request, as specbench's loop
    tells a drafter: the chain's accepted tokens (all but the last appended one) as accepted nodes of the draft,
    and the target's choices where they are known (after the root and each accepted token), -1 elsewhere."""
    accepted = min(max(len(appended) - 1, 0), len(fork.chain_nodes))
    target_tokens = np.full(1 + len(fork.draft), -1, dtype=np.int64)
    nodes = fork.chain_nodes[:accepted]
    target_tokens[0] = appended[0]
    target_tokens[1 + nodes] = appended[1 : 1 + accepted]
    return StepOutcome(step=fork.steps, draft=fork.draft, target_tokens=target_tokens,
                       accepted_nodes=tuple(int(node) for node in nodes))


class RequestDrafters:
    """The per-request forks of a prepared drafter across vLLM's calls (see the module docstring): ``propose``
    takes the call's arguments and returns one chain per row. Pure Python and numpy: tested without vLLM."""

    def __init__(self, prototype: Drafter, label: str, max_chain: int, cut_to_chain: bool,
                 counters: ProposerCounters | None = None):
        self.prototype = prototype
        self.label = label
        self.max_chain = max_chain
        self.cut_to_chain = cut_to_chain
        self.counters = counters
        self.forks: dict[bytes, RequestFork] = {}  # keyed by the tokens each fork saw last
        self._longest_call_s = 0.0

    def propose(self, sampled_token_ids: list, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                max_model_len: int | None = None) -> list[list[int]]:
        started = time.perf_counter()
        # First each decoding row finds the fork that saw its tokens before this step (None: a request not seen).
        rows: list[tuple[int, np.ndarray, np.ndarray, RequestFork | None]] = []
        kept: dict[bytes, RequestFork] = {}
        for row, appended in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            if not len(appended) or length <= len(appended):
                # The row did not decode this step (a prefill chunk): nothing to verify; a fork that saw its tokens
                # stays its fork.
                unchanged = np.asarray(token_ids_cpu[row, :length], dtype=np.int64).tobytes()
                if unchanged in self.forks:
                    kept[unchanged] = self.forks.pop(unchanged)
                continue
            context = np.asarray(token_ids_cpu[row, :length], dtype=np.int64)
            before = context[: length - len(appended)]
            rows.append((row, context, context[length - len(appended):], self.forks.pop(before.tobytes(), None)))
        # Then the forks no row continued end (their requests have finished), before new ones begin: what an ended
        # fork hands over (SuffixDecoding's response) is there for a request that begins in the same step.
        dropped = len(self.forks)
        for fork in self.forks.values():
            fork.drafter.fork_ended()
        chains: list[list[int]] = [[] for _ in sampled_token_ids]
        started_forks = rebuilt = requests = proposed = 0
        for row, context, appended, fork in rows:
            if fork is None:  # a request this proposer has not seen: its tokens before this step are its prompt
                fork = RequestFork(self.prototype.fork())
                fork.drafter.begin(context[: len(context) - len(appended)])
                started_forks += 1
                rebuilt += int(len(appended) > 1)  # vLLM asks right after the prefill (one token) unless it resumed
            fork.drafter.accept(appended, step_outcome(fork, appended))
            fork.steps += 1
            room = self.max_chain if max_model_len is None else min(self.max_chain, max_model_len - len(context))
            if room <= 0:  # no room left in the request's context (vLLM's ngram skips such rows too)
                fork.draft, fork.chain_nodes = Draft.empty(), np.empty(0, dtype=np.int64)
            else:
                chains[row] = self._draft(fork, context, room)
                requests += 1
                proposed += len(chains[row])
            kept[context.tobytes()] = fork
        self.forks = kept
        seconds = time.perf_counter() - started
        if self.counters is not None:
            self._longest_call_s = max(self._longest_call_s, seconds)
            self.counters.add(calls=1, requests=requests, proposed_tokens=proposed, draft_s=seconds,
                              forks_started=started_forks, rebuilt=rebuilt, dropped=dropped)
            self.counters.set(max_call_s=self._longest_call_s, live_forks=len(kept))
        return chains

    def _draft(self, fork: RequestFork, context: np.ndarray, room: int) -> list[int]:
        """The fork's chain for ``context``, cut to the ``room`` left in the request's context."""
        draft = fork.drafter.propose(context)
        nodes = chain_of(draft, self.cut_to_chain)
        if len(nodes) > self.max_chain:
            raise SpecbenchError(f"{self.label} proposed a chain of {len(nodes)} tokens, more than the "
                                 f"{self.max_chain} vLLM was started to verify (num_speculative_tokens)")
        nodes = nodes[:room]
        fork.draft, fork.chain_nodes = draft, nodes
        return draft.token_ids[nodes].tolist() if len(nodes) else []


def refuse_builds(reason: str) -> None:
    """From here on a cached artefact that is missing or damaged stops this process in one line instead of being
    built (``artefacts.base.load_or_rebuild``)."""
    from specbench.artefacts import base

    base.BUILDS_REFUSED = reason


class SpecbenchProposer:
    """The proposer vLLM's ``custom_class`` method instantiates in its worker (``speculative_config.model`` =
    ``PROPOSER_CLASS``) with its ``VllmConfig``; the run's ``ProposerSpec`` is in its ``additional_config``."""

    def __init__(self, vllm_config):
        values = (vllm_config.additional_config or {}).get(CONFIG_KEY)
        if values is None:
            raise SpecbenchError(f"{PROPOSER_CLASS} needs the run's proposer settings in vLLM's additional_config "
                                 f"[{CONFIG_KEY!r}]: start it through specbench's engine=vllm-custom")
        self.spec = ProposerSpec.from_config(values)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        speculative = int(vllm_config.speculative_config.num_speculative_tokens)
        try:
            if self.spec.cache is not None:
                os.environ["SPECBENCH_CACHE"] = self.spec.cache
            refuse_builds("vLLM's worker only loads what the run's process built before vLLM started")
            drafter = build_drafter(self.spec.drafter)
            drafter.prepare(self.spec.target, None)
            if speculative < self.spec.max_chain:
                raise SpecbenchError(f"vLLM verifies {speculative} tokens per step (num_speculative_tokens), fewer "
                                     f"than {self.spec.label}'s longest chain of {self.spec.max_chain}")
            self.drafters = RequestDrafters(drafter, self.spec.label, speculative, self.spec.cut_to_chain,
                                            ProposerCounters(self.spec.counters))
        except BaseException as error:
            self._note_fault(error, "could not start")
            raise

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: vLLM's runner calls this on every proposer (the drafter loaded its databases above)."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        try:
            return self.drafters.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, self.max_model_len)
        except BaseException as error:
            self._note_fault(error, "failed while drafting")
            raise

    def _note_fault(self, error: BaseException, when: str) -> None:
        """Write why, in one line, where the run's process reads it (``fault_line``), unless something already did."""
        text = " ".join(str(error).split()) or type(error).__name__
        if not isinstance(error, SpecbenchError):
            text = f"{type(error).__name__}: {text}"
        line = f"drafter={self.spec.label} {when} inside vLLM's worker: {text[:500]}"
        path = Path(self.spec.fault)
        try:
            if not path.exists():
                path.write_text(json.dumps({"fault": line}) + "\n")
        except OSError:
            log.error(line)


def fault_line(path: str | Path) -> str | None:
    """The one line a proposer wrote in its fault file, if it wrote one."""
    try:
        return json.loads(Path(path).read_text())["fault"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
