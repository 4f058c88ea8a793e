"""specbench's combination of the training-free drafters (not a published method): one tree from every source
that has something to say, meant to run under the draft budget (``run.draft_budget=auto``), which keeps only
the nodes worth their verification time on the machine at hand.

Sources, in the order they are merged into one token trie (an earlier source's node wins a shared path):

    context     the longest suffix of the context that occurred before in it (SAM-Decoding's automaton of the
                running text), continued as at its earliest occurrence: ``context_tokens`` tokens at most,
                when the match is at least ``context_min_match`` tokens long
    corpus      the same in a corpus automaton (the statistics corpus), when its match is at least
                ``corpus_min_match`` long
    recycling   Token Recycling's matrix of the target's own top-k successors, expanded along a template

Each node is labelled with its source and, for the two automata, the match length that produced it
(``context3`` = a context match of 3 tokens, capped at ``label_max_match``): the draft budget estimates
acceptance per (label, depth, sibling rank), so a long match's chain is trusted more than a short one's.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.datastores.suffix_automaton import DynamicSuffixAutomaton, StaticSuffixAutomaton
from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.drafters.base import require_choice, require_flag, require_non_negative, require_positive
from specbench.drafters.recycling import TokenRecycling
from specbench.drafters.samd import FollowsContext, corpus_automata
from specbench.errors import SpecbenchError

RECYCLING_WHEN = ("always", "no_match")


class TokenTrie:
    """Draft paths merged into one tree, parents before children; a path already present adds nothing."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.sources: list[str] = []
        self._children: dict[tuple[int, int], int] = {}

    def add_chain(self, tokens, source: str, parent: int = -1) -> None:
        for token in tokens:
            parent = self.add(parent, int(token), source)

    def add(self, parent: int, token: int, source: str) -> int:
        """The node for ``token`` under ``parent`` (-1: the root), created if new; its index."""
        key = (parent, token)
        node = self._children.get(key)
        if node is None:
            node = len(self.tokens)
            self._children[key] = node
            self.tokens.append(token)
            self.parents.append(parent)
            self.sources.append(source)
        return node

    def draft(self) -> Draft:
        if not self.tokens:
            return Draft.empty()
        return Draft(torch.tensor(self.tokens, dtype=torch.long), parents=torch.tensor(self.parents, dtype=torch.long),
                     sources=tuple(self.sources))


class HybridDrafter(FollowsContext, Drafter):
    """See the module docstring.

    context_tokens:     longest chain taken after a context match (0: no context source)
    context_min_match:  shortest context match used
    corpus:             corpus of the static automaton (python-docs, sharegpt, files, hf:ids), or null for none
    corpus_tokens:      longest chain taken after a corpus match
    corpus_min_match:   shortest corpus match used
    recycling_template: Token Recycling's template for the matrix's tree ("2.2.2", "samd"), or null for none
    recycling_from_prompt: also teach the matrix every prompt position (SAM-Decoding does; on a CPU the prefill's
                        full-width output layer over a long prompt costs more than it brings)
    recycling_when:     always (the matrix's tree beside any matched chain) or no_match (only when neither
                        automaton matched: SAM-Decoding's order of fall-back, without its threshold)
    recycling_context:  tokens that key the target's recorded top-k: 1 (Token Recycling's matrix: the token
                        alone) or 2 (the token and the one before it, falling back to the token alone when
                        that pair was never verified)
    label_max_match:    match lengths above this share one label (and one acceptance estimate)
    cache_dir:          where built automata are cached; null = $SPECBENCH_CACHE or ~/.cache/specbench
    """

    def __init__(self, name: str = "hybrid", context_tokens: int = 16, context_min_match: int = 1,
                 corpus: str | None = None, corpus_tokens: int = 8, corpus_min_match: int = 8,
                 recycling_template: str | None = "samd", recycling_from_prompt: bool = False,
                 recycling_context: int = 1, recycling_when: str = "always", label_max_match: int = 8,
                 cache_dir: str | None = None):
        require_positive(context_min_match=context_min_match, corpus_tokens=corpus_tokens,
                         corpus_min_match=corpus_min_match, label_max_match=label_max_match)
        require_non_negative(context_tokens=context_tokens)
        require_flag(recycling_from_prompt=recycling_from_prompt)
        self.name = name
        self.context_tokens = context_tokens
        self.context_min_match = context_min_match
        self.corpus = corpus
        self.corpus_tokens = corpus_tokens
        self.corpus_min_match = corpus_min_match
        self.label_max_match = label_max_match
        self.cache_dir = cache_dir
        self.context = DynamicSuffixAutomaton()
        self.static: StaticSuffixAutomaton | None = None
        self.recycling = None if recycling_template is None else TokenRecycling(
            name=f"{name}-recycling", template=recycling_template, learn_from_prompt=recycling_from_prompt,
            update_on_eos=True, first_draft_from_prompt=False)
        if self.recycling is not None:
            self.target_top_k = self.recycling.target_top_k
            self.reads_prompt_choices = self.recycling.reads_prompt_choices
        # 1.0 and true compare equal to 1: the type is checked first
        if not isinstance(recycling_context, int) or isinstance(recycling_context, bool) or recycling_context not in (1, 2):
            raise SpecbenchError(f"drafter.recycling_context must be 1 or 2 (tokens keying the top-k), "
                                 f"got {recycling_context!r}")
        self.recycling_context = recycling_context
        require_choice("recycling_when", recycling_when, RECYCLING_WHEN)
        self.recycling_when = recycling_when
        self.pairs: dict[tuple[int, int], np.ndarray] = {}  # (token before, token) -> the target's top-k after them
        if context_tokens == 0 and corpus is None and self.recycling is None:
            raise SpecbenchError("drafter=hybrid needs a source: context_tokens > 0, a corpus or a recycling_template")
        self._fed = 0
        self._root = -1

    def prepare(self, target, sampling=None) -> None:
        from specbench.artefacts.base import fetch

        self.static = fetch(corpus_automata(self, target)).get("static")
        if self.recycling is not None:
            self.recycling.prepare(target)

    def artefacts(self, target) -> list:
        return list(corpus_automata(self, target).values())

    def _label(self, source: str, match: int) -> str:
        return f"{source}{min(match, self.label_max_match)}"

    def propose(self, context_ids: np.ndarray) -> Draft:
        self._root = root = self.follow(context_ids)
        self._before_root = int(context_ids[-2]) if len(context_ids) > 1 else -1

        trie = TokenTrie()
        if self.context_tokens:
            state, match = self.context.lookup(root)
            if match >= self.context_min_match:
                chain = self.context.alpha_draft(state, match, root, self.context_tokens + 1,
                                                  alpha=self.context_tokens + 1)  # n_predicts caps the chain
                trie.add_chain(chain[1:], self._label("context", match))
        if self.static is not None:
            state, match = self.static.lookup(root)
            if match >= self.corpus_min_match:
                chain = self.static.draft(state, root, self.corpus_tokens + 1)
                trie.add_chain(chain[1:], self._label("corpus", match))
        if self.recycling is not None and (self.recycling_when == "always" or not trie.tokens):
            template = self.recycling.template
            if self.recycling_context == 2:
                tokens = self._expand_by_pairs(root)
            else:
                tokens = template.expand(root, self.recycling.successors)
            nodes: list[int] = []
            for token, parent in zip(tokens.tolist(), template.parents.tolist()):
                nodes.append(trie.add(-1 if parent < 0 else nodes[parent], token, "recycling"))
        return trie.draft()

    def _expand_by_pairs(self, root: int) -> np.ndarray:
        """The template's tokens under ``root``, each node read from the top-k recorded after its parent and
        grandparent tokens when that pair was verified before, else from its parent token's matrix row."""
        template, successors, pairs = self.recycling.template, self.recycling.successors, self.pairs
        tokens: list[int] = []
        for parent, rank in zip(template.parents.tolist(), template.ranks.tolist()):
            if parent < 0:
                before, token = self._before_root, root
            else:
                grandparent = int(template.parents[parent])
                before, token = (root if grandparent < 0 else tokens[grandparent]), tokens[parent]
            row = pairs.get((before, token))
            tokens.append(int(row[rank]) if row is not None else int(successors[token, rank]))
        return np.array(tokens, dtype=np.int64)

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        super().accept(accepted_ids, outcome)  # Token Recycling's matrix learns from the pass
        if self.recycling is not None and self.recycling_context == 2 and outcome.step > 0:
            draft_tokens = outcome.draft.token_ids.numpy()
            top = outcome.target_top_ids
            tokens = [self._root, *draft_tokens.tolist()]
            parents = outcome.draft.parents.tolist() if outcome.draft.parents is not None else \
                list(range(-1, len(draft_tokens) - 1))
            befores = [self._before_root] + [self._root if parent < 0 else tokens[parent + 1] for parent in parents]
            width = self.recycling.top_k
            for before, token, row in zip(befores, tokens, top):
                if row[0] >= 0:  # verified
                    self.pairs[(before, token)] = row[:width].copy()

    def state(self) -> dict[str, np.ndarray] | None:
        if self.recycling is None:
            return None
        state = dict(self.recycling.state())
        if self.recycling_context == 2:
            keys = np.array(list(self.pairs), dtype=np.int64).reshape(-1, 2)
            # no pairs yet (before the first verified step): an empty table, not a reshape of nothing to (0, -1)
            rows = np.array(list(self.pairs.values()), dtype=np.int64).reshape(len(keys), self.recycling.top_k)
            state.update(pair_keys=keys, pair_rows=rows)
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.recycling.restore({"successors": state["successors"]})
        if self.recycling_context == 2:
            self.pairs = {(int(a), int(b)): row.copy() for (a, b), row in zip(state["pair_keys"], state["pair_rows"])}
