"""Lookahead decoding (Fu et al., 2024): Jacobi iterations on a 2-D window of guesses generate n-grams, and
n-grams from a pool that start with the last token are verified, all in one forward pass.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.datastores.ngram_pool import NGramPool
from specbench.decoding.tree import trie_from_sequences
from specbench.drafters.base import Draft, Drafter, StepOutcome, require_positive
from specbench.errors import SpecbenchError


class JacobiWindow:
    """The lookahead branch: ``levels`` rows of ``width`` guesses, hung off the last committed token.

    Level 0 is a chain of guesses for the next ``width`` positions; the guess at level j, column i continues
    the one at level j-1, column i, so it sits at depth 1 + i + j and sees the root, level 0 up to column i
    and its own column below it (a tree, which the verifier's mask expresses exactly). One forward pass is one
    Jacobi iteration: the target's choice after the top guess of each column becomes the new top guess, the
    other levels move down one, and each column (its level-0..top guesses plus that choice) is a fresh
    n-gram of ``levels + 1`` tokens. The window starts from tokens of the prompt, one level, and grows a level
    per step until it is full (the fill phase, which yields no n-grams).
    """

    def __init__(self, width: int, levels: int, seed: int):
        self.width = width
        self.total_levels = levels
        self.seed = seed
        self.levels: list[np.ndarray] = []

    def reset(self, prompt: np.ndarray) -> None:
        rng = np.random.default_rng(self.seed)
        self.levels = [rng.choice(prompt, size=self.width + self.total_levels - 1)]

    def nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, parents) of the window, parents indexing the window's own nodes (-1 = the root)."""
        width = self.levels[0].size
        tokens = np.concatenate(self.levels)
        parents = np.arange(tokens.size) - width  # level j>0, column i: the node one level down
        parents[:width] = np.arange(-1, width - 1)  # level 0 is a chain from the root
        return tokens, parents

    def update(self, outputs: np.ndarray) -> list[tuple[int, ...]]:
        """Advance by one Jacobi iteration given the target's choices after every window node (``outputs``
        aligned with ``nodes()``, -1 where the node was not verified); return the harvested n-grams."""
        width = self.levels[0].size
        top = self.levels[-1]
        choices = outputs[(len(self.levels) - 1) * width :]
        choices = np.where(choices >= 0, choices, top)  # an unverified column keeps its guess
        if len(self.levels) < self.total_levels:
            # Fill: every level moves one position forward (drops its first column) and a level is added.
            self.levels = [level[1:] for level in self.levels] + [choices[1:]]
            return []
        columns = np.stack(self.levels + [choices], axis=1)
        ngrams = [tuple(row) for row in columns[outputs[(len(self.levels) - 1) * width:] >= 0].tolist()]
        self.levels = self.levels[1:] + [choices]
        return ngrams


class Lookahead(Drafter):
    """Lookahead decoding with Spec-Bench's defaults: n-grams of N=5, window W=7, G=7 guesses."""

    def __init__(self, name: str = "lookahead", ngram_size: int = 5, window_size: int = 7, guess_set_size: int = 7,
                 pool_from_prompt: bool = False, seed: int = 0):
        require_positive(window_size=window_size, guess_set_size=guess_set_size)
        if not isinstance(ngram_size, int) or ngram_size < 2:
            raise SpecbenchError(f"drafter.ngram_size must be an integer >= 2, got {ngram_size!r}")
        self.name = name
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        self.pool_from_prompt = pool_from_prompt
        self.pool = NGramPool(key_tokens=1, continuation_length=ngram_size - 1, capacity=guess_set_size)
        self.window = JacobiWindow(window_size, ngram_size - 1, seed)
        self._tail = np.empty(0, dtype=np.int64)
        self._window_offset = 0
        self._window_size = 0
        self._window_draft = None  # the draft that carried the window, so its outputs are read only from it

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.pool.clear()
        if self.pool_from_prompt:
            self.pool.add_sequence(prompt_ids)
        self.window.reset(prompt_ids)
        self._tail = prompt_ids[-self.ngram_size :].copy()

    def propose(self, context_ids: np.ndarray) -> Draft:
        guesses = self.pool.lookup(context_ids, self.guess_set_size)
        tokens, parents, _ = trie_from_sequences(guesses)
        draft, self._window_offset, self._window_size = with_window(tokens, parents, self.window)
        self._window_draft = draft
        return draft

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        self._tail = remember_ngrams(self.pool, self._tail, accepted_ids, self.ngram_size)
        if outcome.draft is self._window_draft:
            start = 1 + self._window_offset
            for ngram in self.window.update(outcome.target_tokens[start : start + self._window_size]):
                self.pool.add(ngram[:1], ngram[1:])


def with_window(tokens: np.ndarray, parents: np.ndarray, window: JacobiWindow, sources=None):
    """A draft of candidate tokens followed by the window's nodes (never accepted, scored for their outputs):
    (draft, index of the first window node, number of window nodes)."""
    window_tokens, window_parents = window.nodes()
    offset = tokens.size
    all_tokens = np.concatenate((tokens, window_tokens)).astype(np.int64)
    all_parents = np.concatenate((parents, np.where(window_parents >= 0, window_parents + offset, -1)))
    candidates = np.zeros(all_tokens.size, dtype=bool)
    candidates[:offset] = True
    labels = None if sources is None else tuple(sources) + ("window",) * window_tokens.size
    draft = Draft(torch.from_numpy(all_tokens), torch.from_numpy(all_parents), candidates=torch.from_numpy(candidates),
                  sources=labels)
    return draft, offset, window_tokens.size


def remember_ngrams(pool: NGramPool, tail: np.ndarray, accepted_ids: np.ndarray, keep: int) -> np.ndarray:
    """Add the n-grams that end in the newly accepted tokens to ``pool``; return the new tail of the
    context (its last ``keep`` tokens), which is all later additions need."""
    tokens = np.concatenate((tail, accepted_ids))
    pool.add_sequence(tokens, first_end=tail.size)
    return tokens[-keep:]
