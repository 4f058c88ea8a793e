"""Lookahead decoding (Fu et al., 2024): Jacobi iterations on a 2-D window of guesses generate n-grams, and
n-grams from a pool that start with the last token are verified, all in one forward pass.
"""

from __future__ import annotations

import numpy as np

from specbench.datastores.ngram_pool import NGramPool
from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.tree import trie_from_sequences
from specbench.drafters.base import require_positive
from specbench.drafters.jacobi import JacobiWindow
from specbench.errors import SpecbenchError


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

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.pool.clear()
        if self.pool_from_prompt:
            self.pool.add_sequence(prompt_ids)
        self.window.reset(prompt_ids)
        self._tail = prompt_ids[-self.ngram_size :].copy()

    def propose(self, context_ids: np.ndarray) -> Draft:
        guesses = self.pool.lookup(context_ids, self.guess_set_size)
        tokens, parents, _ = trie_from_sequences(guesses)
        return self.window.attach(tokens, parents)

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        self._tail = self.pool.add_new_tokens(self._tail, accepted_ids, self.ngram_size)
        for ngram in self.window.update(outcome):
            self.pool.add(ngram[:1], ngram[1:])

