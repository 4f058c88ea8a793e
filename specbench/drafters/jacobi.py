"""Lookahead's Jacobi window, shared by the drafters that carry it (``lookahead``; ``hd`` with
``lookahead_branch=true``).

A helper module, not a drafter: it holds no ``Drafter`` subclass and has no config of its own. A drafter owns
one ``JacobiWindow``, resets it in ``begin``, hangs it on its candidate tokens in ``propose`` (``attach``) and
feeds it each step's outcome in ``accept`` (``update``), which returns the n-grams the window generated.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.contract import Draft, StepOutcome


class JacobiWindow:
    """The lookahead branch: ``levels`` rows of ``width`` guesses, hung off the last committed token.

    Level 0 is a chain of guesses for the next ``width`` positions; the guess at level j, column i continues
    the one at level j-1, column i, so it sits at depth 1 + i + j and sees the root, level 0 up to column i
    and its own column below it (a tree, which the verifier's mask expresses exactly). One forward pass is one
    Jacobi iteration: the target's choice after the top guess of each column becomes the new top guess, the
    other levels move down one, and each column (its level-0..top guesses plus that choice) is a fresh
    n-gram of ``levels + 1`` tokens. The window starts from tokens of the prompt, one level, and grows a level
    per step until it is full (the fill phase, which yields no n-grams).

    The window rides on a draft as non-candidate nodes after the drafter's candidates (``attach``); it
    remembers which draft carried it and where, so that ``update`` reads the target's choices at its nodes
    from that draft's outcome and from no other.
    """

    def __init__(self, width: int, levels: int, seed: int):
        self.width = width
        self.total_levels = levels
        self.seed = seed
        self.levels: list[np.ndarray] = []
        self._draft: Draft | None = None  # the draft that carried the window (compared with ``is``)
        self._offset = 0  # index in that draft of the first window node
        self._size = 0  # number of window nodes in that draft

    def reset(self, prompt: np.ndarray) -> None:
        """Start a new question: one level of guesses drawn from ``prompt``, no draft carrying the window."""
        rng = np.random.default_rng(self.seed)
        self.levels = [rng.choice(prompt, size=self.width + self.total_levels - 1)]
        self._draft = None

    def nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, parents) of the window, parents indexing the window's own nodes (-1 = the root)."""
        width = self.levels[0].size
        tokens = np.concatenate(self.levels)
        parents = np.arange(tokens.size) - width  # level j>0, column i: the node one level down
        parents[:width] = np.arange(-1, width - 1)  # level 0 is a chain from the root
        return tokens, parents

    def attach(self, tokens: np.ndarray, parents: np.ndarray, sources=None) -> Draft:
        """The draft of candidate ``tokens`` ([n], tree ``parents`` [n], optional ``sources`` labels) followed
        by the window's nodes, which are never accepted (``candidates`` False, labelled "window") and are
        scored only for the target's choices after them. Remembers this draft for ``update``.

        Example: candidates [5 6] (a chain) and a one-level window [10 11 12] give tokens [5 6 10 11 12],
        parents [-1 0 -1 2 3], candidates [T T F F F]; the window's nodes sit at offset 2.
        """
        window_tokens, window_parents = self.nodes()
        offset = tokens.size
        all_tokens = np.concatenate((tokens, window_tokens)).astype(np.int64)
        all_parents = np.concatenate((parents, np.where(window_parents >= 0, window_parents + offset, -1)))
        candidates = np.zeros(all_tokens.size, dtype=bool)
        candidates[:offset] = True
        labels = None if sources is None else tuple(sources) + ("window",) * window_tokens.size
        draft = Draft(torch.from_numpy(all_tokens), torch.from_numpy(all_parents),
                      candidates=torch.from_numpy(candidates), sources=labels)
        self._draft, self._offset, self._size = draft, offset, window_tokens.size
        return draft

    def update(self, outcome: StepOutcome) -> list[tuple[int, ...]]:
        """Advance by one Jacobi iteration from the target's choices at the window's nodes in ``outcome``;
        return the harvested n-grams (none during the fill phase).

        Only an outcome of the draft the window was last attached to is read: the contract guarantees that
        ``outcome.draft`` is the very object ``propose`` returned, so a step whose draft did not carry the
        window fails the ``is`` test, and the prefill (``outcome.step == 0``, whose draft is
        ``Draft.empty()``) never carries one. Such outcomes leave the window unchanged and return [].
        """
        if outcome.step == 0 or self._draft is None or outcome.draft is not self._draft:
            return []
        start = 1 + self._offset  # target_tokens[0] is the choice after the last committed token
        return self.iterate(outcome.target_tokens[start : start + self._size])

    def iterate(self, outputs: np.ndarray) -> list[tuple[int, ...]]:
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
