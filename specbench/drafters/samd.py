"""SAM-Decoding (Hu et al., 2024, "Speculative Decoding via Suffix Automaton", arXiv 2411.10666).

Two suffix automata find the longest suffix of the text that occurred before: a dynamic one over the
question's own context (prompt and output, extended as tokens are accepted) and a static one over a corpus
(built once per tokenizer and corpus, cached). The draft is what followed the earliest occurrence of that
suffix. When neither match is long enough, an auxiliary drafter proposes instead: Token Recycling's matrix
here (the authors' training-free auxiliary), or none.

As the authors' code runs it on Spec-Bench (model/samd @fd2c1cd; docs/fidelity.md traces each line):
- with an auxiliary (draft.py:55-66): the corpus match counts ``len_bias`` (5) tokens less; if the longer of
  the two matches reaches ``len_threshold`` (5), the draft is the ``n_predicts - 1`` (39) tokens after the
  earliest occurrence of the longer match (the context's on a tie), padded with token 0; the context automaton
  first moves to a shorter suffix while fewer than ``n_predicts`` tokens follow the occurrence (dyn_sam.py:101-107);
  otherwise the auxiliary's tree (Token Recycling's 60-node template, its matrix fed from every pass and the
  prompt's positions, kept across questions);
- without one (draft.py:67-75): the longer match wins (the context's on a tie); a context match drafts
  ``min(n_predicts, 1 + int(4 * match length)) - 1`` tokens, a corpus match a tree of its most frequent
  continuations of that size (static_sam.py:194-227);
- the automata see the prompt and every accepted token; the token the target has just produced is the one
  looked up (samd_model.py:103-130, utils.py:83-87).
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import torch

from specbench.datastores.suffix_automaton import DynamicSuffixAutomaton, StaticSuffixAutomaton
from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.drafters.base import require_choice, require_non_negative, require_number, require_positive
from specbench.drafters.recycling import TokenRecycling
from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)

AUXILIARIES = ("recycling", "none")


def corpus_automata(drafter, target) -> dict:
    """The cached corpus automaton a drafter with a ``corpus`` (and no automaton given by path) loads into its
    ``static``; {} for one without a corpus."""
    from specbench.artefacts.base import prepare_command
    from specbench.artefacts.corpus_automaton import CorpusAutomaton

    if drafter.corpus is None:
        return {}
    return {"static": CorpusAutomaton(target, drafter.corpus, drafter.cache_dir,
                                      prepare_command(target.name, drafter.name))}


class FollowsContext:
    """Keeps a context automaton (``self.context``) and an optional corpus automaton (``self.static``) in step
    with a decode: they hold every context token but the newest, which is the one looked up
    (samd_model.py:196-210, utils.py:83-87); an optional Token Recycling (``self.recycling``) learns from
    every pass. Mixed into the drafters that read them."""

    context: DynamicSuffixAutomaton
    static: StaticSuffixAutomaton | None
    recycling: TokenRecycling | None

    def begin(self, prompt_ids: np.ndarray) -> None:
        """A new question: an empty context automaton, the corpus automaton's cursor at its root, and Token
        Recycling's turn begun (its matrix is kept: hot start)."""
        self.context.reset()
        self._fed = 0
        if self.static is not None:
            self.static.reset()
        if self.recycling is not None:
            self.recycling.begin(prompt_ids)

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        if self.recycling is not None:
            # Every pass feeds the matrix, whichever source drafted (samd_model.py:205-210).
            self.recycling.learn_step(self._root, accepted_ids, outcome)

    def follow(self, context_ids: np.ndarray) -> int:
        """Feed the automata the tokens they have not seen but the newest, and return the newest."""
        fresh = context_ids[self._fed : len(context_ids) - 1].tolist()
        self.context.add_tokens(fresh)
        if self.static is not None:
            self.static.transfer_tokens(fresh)
        self._fed = len(context_ids) - 1
        return int(context_ids[-1])


class SuffixAutomatonDrafter(FollowsContext, Drafter):
    """SAM-Decoding's drafter (see the module docstring).

    n_predicts:     tokens per sequence draft, the looked-up token included (the authors': 40)
    len_threshold:  shortest match drafted from instead of the auxiliary (5)
    len_bias:       how much shorter a corpus match counts than a context match (5)
    alpha:          without an auxiliary, tokens drafted per matched token (4.0)
    auxiliary:      recycling (Token Recycling's matrix and the samd template) or none
    corpus:         corpus of the static automaton (python-docs, sharegpt, files, hf:ids), or null for none
    automaton:      a saved static automaton's directory instead of building one from ``corpus``
    cache_dir:      where built automata are cached; null = $SPECBENCH_CACHE or ~/.cache/specbench
    """

    def __init__(self, name: str = "samd", n_predicts: int = 40, len_threshold: int = 5, len_bias: int = 5,
                 alpha: float = 4.0, auxiliary: str = "recycling", corpus: str | None = "python-docs",
                 automaton: str | None = None, cache_dir: str | None = None):
        require_positive(n_predicts=n_predicts, len_threshold=len_threshold)
        require_non_negative(len_bias=len_bias)
        # A draft is min(n_predicts, 1 + int(match x alpha)) tokens for a match >= 1: at n_predicts alpha already drafts
        # n_predicts from every match, and a larger finite one changes nothing but could overflow int() (1e308 x 2)
        require_number("alpha", alpha, low=0, above_low=True, high=n_predicts,
                       why=f"at n_predicts={n_predicts} every match already drafts n_predicts tokens")
        require_choice("auxiliary", auxiliary, AUXILIARIES)
        self.name = name
        self.n_predicts = n_predicts
        self.len_threshold = len_threshold
        self.len_bias = len_bias
        self.alpha = float(alpha)
        self.corpus = corpus
        self.automaton_path = automaton
        self.cache_dir = cache_dir
        self.context = DynamicSuffixAutomaton()
        self.static: StaticSuffixAutomaton | None = None
        self.recycling = TokenRecycling(name=f"{name}-recycling", template="samd", learn_from_prompt=True,
                                        update_on_eos=True, first_draft_from_prompt=False) if auxiliary == "recycling" else None
        if self.recycling is not None:
            self.target_top_k = self.recycling.target_top_k
            self.reads_prompt_choices = True
        self._fed = 0
        self._root = -1

    def prepare(self, target, sampling=None) -> None:
        from specbench.artefacts.base import fetch

        if self.automaton_path is not None:
            from specbench.artefacts.statistics_datastore import vocab_size

            fix = ("point drafter.automaton at a whole automaton, or set drafter.automaton=null "
                   f"drafter.corpus={self.corpus or 'python-docs'} to build the corpus's automaton in the cache")
            self.static = StaticSuffixAutomaton.load(self.automaton_path, vocab_size=vocab_size(target), fix=fix)
        else:
            self.static = fetch(corpus_automata(self, target)).get("static")
        if self.recycling is not None:
            self.recycling.prepare(target)

    def artefacts(self, target) -> list:
        return list(corpus_automata(self, target).values()) if self.automaton_path is None else []

    def propose(self, context_ids: np.ndarray) -> Draft:
        self._root = root = self.follow(context_ids)

        context_state, context_match = self.context.lookup(root)
        corpus_state, corpus_match = self.static.lookup(root) if self.static is not None else (0, 0)
        if self.recycling is not None:
            corpus_match -= self.len_bias
            if max(context_match, corpus_match) < self.len_threshold:
                draft = self.recycling.propose(context_ids)
                return Draft(draft.token_ids, parents=draft.parents, sources=("recycling",) * len(draft))
            if context_match >= corpus_match:
                return _chain(self.context.draft(context_state, root, self.n_predicts), "context")
            return _chain(self.static.draft(corpus_state, root, self.n_predicts), "corpus")
        if context_match >= corpus_match:
            return _chain(self.context.alpha_draft(context_state, context_match, root, self.n_predicts, self.alpha),
                          "context")
        tokens, parents = self.static.probable_tree(corpus_state, corpus_match, root, self.n_predicts, self.alpha)
        # The tree's first node is the looked-up token itself (the step's root): drop it, renumber the rest.
        draft_tokens = torch.tensor(tokens[1:], dtype=torch.long)
        draft_parents = torch.tensor([parent - 1 for parent in parents[1:]], dtype=torch.long)
        return Draft(draft_tokens, parents=draft_parents, sources=("corpus",) * len(draft_tokens))

    def fork(self) -> SuffixAutomatonDrafter:
        # The corpus automaton's arrays are shared; its cursor and the context automaton are one question's. Token
        # Recycling's matrix, learnt across questions, is not shared between concurrent questions.
        if self.recycling is not None:
            raise SpecbenchError(f"drafter={self.name} with auxiliary=recycling learns one matrix from every question "
                                 "in turn and cannot be forked for questions decoded at the same time; use "
                                 "drafter.auxiliary=none")
        forked = copy.copy(self)
        forked.context = DynamicSuffixAutomaton()
        forked.static = copy.copy(self.static)
        return forked

    def state(self) -> dict[str, np.ndarray] | None:
        return None if self.recycling is None else self.recycling.state()

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.recycling.restore(state)


def _chain(sequence: list[int], source: str) -> Draft:
    """A sequence draft ([looked-up token, continuation...]) as a chain after the step's root."""
    tokens = torch.tensor(sequence[1:], dtype=torch.long)
    return Draft(tokens, sources=(source,) * len(tokens))
