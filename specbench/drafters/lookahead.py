"""Lookahead decoding (Fu et al., 2024) as Spec-Bench ran it (its copy of lade, model/lade/decoding.py): Jacobi
iterations on a 2-D window of guesses generate n-grams; the pool's n-grams that start with the last token are
verified in the same forward pass, each as its own chain. docs/fidelity.md traces every setting.
"""

from __future__ import annotations

import numpy as np

from specbench.datastores.ngram_pool import NGramPool
from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.tree import guess_layout
from specbench.drafters.base import MAX_COUNT, require_flag, require_non_negative, require_positive
from specbench.drafters.jacobi import JacobiWindow
from specbench.errors import SpecbenchError


class Lookahead(Drafter):
    """Lookahead decoding with Spec-Bench's settings: n-grams of N=5, window W=7, G=7 guesses."""

    def __init__(self, name: str = "lookahead", ngram_size: int = 5, window_size: int = 7, guess_set_size: int = 7,
                 pool_from_prompt: bool = False, pool_from_output: bool = False, merge_guesses: bool = False,
                 accept_full_guess: bool = False, seed: int = 10):
        require_positive(window_size=window_size, guess_set_size=guess_set_size)
        require_non_negative(seed=seed)
        require_flag(pool_from_prompt=pool_from_prompt, pool_from_output=pool_from_output, merge_guesses=merge_guesses,
                     accept_full_guess=accept_full_guess)
        if not isinstance(ngram_size, int) or isinstance(ngram_size, bool) or not 3 <= ngram_size <= MAX_COUNT:
            raise SpecbenchError(f"drafter.ngram_size must be an integer in [3, {MAX_COUNT}] (a window of at least 2 "
                                 f"levels), got {ngram_size!r}")
        self.name = name
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        self.pool_from_prompt = pool_from_prompt
        self.pool_from_output = pool_from_output
        self.merge_guesses = merge_guesses
        self.accept_full_guess = accept_full_guess
        self.pool = NGramPool(key_tokens=1, continuation_length=ngram_size - 1, capacity=guess_set_size)
        self.window = JacobiWindow(window_size, ngram_size - 1, seed)
        self._tail = np.empty(0, dtype=np.int64)

    def begin(self, prompt_ids: np.ndarray) -> None:
        # lade builds its pool and window anew on every generate call, i.e. every turn.
        self.pool.clear()
        if self.pool_from_prompt:
            self.pool.add_sequence(prompt_ids)
        self.window.reset(prompt_ids)
        self._tail = prompt_ids[-self.ngram_size :].copy()

    def propose(self, context_ids: np.ndarray) -> Draft:
        root = int(context_ids[-1])
        guesses = []
        if self.window.full:  # lade verifies guesses only once the window is full
            guesses = self.pool.lookup(context_ids[-1:], self.guess_set_size, oldest_first=True)
        tokens, parents, candidates, _ = guess_layout(guesses, None, self.merge_guesses, self.accept_full_guess)
        return self.window.attach(tokens, parents, candidates=candidates, root=root)

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        if self.pool_from_output:
            self._tail = self.pool.add_new_tokens(self._tail, accepted_ids, self.ngram_size)
        for ngram in self.window.update(outcome):
            self.pool.add(ngram[:1], ngram[1:])

