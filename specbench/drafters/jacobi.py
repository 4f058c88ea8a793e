"""Lookahead's Jacobi window, as lade (the Lookahead authors' code, which Spec-Bench and HD run) lays it out;
shared by the drafters that carry it (``lookahead``; ``hd``).

A helper module, not a drafter: it holds no ``Drafter`` subclass and has no config of its own. A drafter owns
one ``JacobiWindow``, resets it in ``begin``, hangs it on its candidate tokens in ``propose`` (``attach``) and
feeds it each step's outcome in ``accept`` (``update``), which returns the n-grams the window generated.
docs/fidelity.md traces every detail to lade's decoding.py and models/llama.py.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from specbench.decoding.contract import Draft, StepOutcome


class JacobiWindow:
    """The lookahead branch of lade with ``width`` W and ``levels`` N-1 (N: the n-gram size).

    Column c of the window is a chain of guesses for the positions after the root: level 0 holds columns
    1..w (column 0 of level 0 is the root, the last committed token, which the step feeds anyway), and every
    level l >= 1 holds columns 0..w; the guess at level l, column c continues level l-1, column c, so it sits
    at depth l + c. One forward pass is one Jacobi iteration: the target's choices after the top level's
    guesses are the new top level and every level moves down one (level 0 drops its first column); each
    column, from its level-0 token (the root for column 0) up to the new choice, is a fresh n-gram.

    lade starts level 0 with W + N - 3 tokens drawn from the prompt (``random.seed(10)`` then
    ``random.choice``, reproduced here with ``random.Random(seed)``) and fills one level per forward pass,
    each level one column shorter than the one before, until N-1 levels stand: W=7, N=5 gives level sizes
    [9], [8 9], [7 8 8], then [6 7 7 7] from the fourth pass on (27 nodes; with the root lade's 28).

    The window rides on a draft as non-candidate nodes after the drafter's candidates (``attach``); it
    remembers which draft carried it and where, so that ``update`` reads the target's choices at its nodes
    from that draft's outcome and from no other.
    """

    def __init__(self, width: int, levels: int, seed: int, fill_step_ngrams: bool = False):
        self.width = width
        self.total_levels = levels
        self.seed = seed
        # HD's code harvests n-grams on the pass that completes the window too, while its top level is being
        # filled (a misaligned batch: see ``iterate``); lade does not.
        self.fill_step_ngrams = fill_step_ngrams
        self.levels: list[np.ndarray] = []
        self._draft: Draft | None = None  # the draft that carried the window (compared with ``is``)
        self._offset = 0  # index in that draft of the first window node
        self._size = 0  # number of window nodes in that draft
        self._root = 0  # the root token of that draft (column 0's first token)

    def reset(self, prompt: np.ndarray) -> None:
        """Start a new turn: level 0 of W + N - 3 tokens drawn from ``prompt``, as lade does on every call."""
        draw = random.Random(self.seed)
        values = prompt.tolist()
        self.levels = [np.array([draw.choice(values) for _ in range(self.width + self.total_levels - 2)],
                                dtype=np.int64)]
        self._draft = None

    @property
    def full(self) -> bool:
        return len(self.levels) == self.total_levels

    def nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, parents) of the window, parents indexing the window's own nodes (-1 = the root).

        Level 0 is a chain from the root; level l, column c hangs off level l-1, column c (the root for
        level 1, column 0)."""
        tokens = np.concatenate(self.levels)
        parents = np.empty(tokens.size, dtype=np.int64)
        first = self.levels[0].size
        parents[:first] = np.arange(-1, first - 1)
        below = np.concatenate(([-1], np.arange(first)))  # level 0's columns 0..w (column 0: the root)
        offset = first
        for level in self.levels[1:]:
            parents[offset : offset + level.size] = below[: level.size]
            below = np.arange(offset, offset + level.size)
            offset += level.size
        return tokens, parents

    def attach(self, tokens: np.ndarray, parents: np.ndarray, sources=None, candidates: np.ndarray | None = None,
               root: int = 0) -> Draft:
        """The draft of candidate ``tokens`` ([n], tree ``parents`` [n], optional ``sources`` labels and
        ``candidates`` mask, default all True) followed by the window's nodes, which are never accepted
        (``candidates`` False, labelled "window") and are scored only for the target's choices after them.
        ``root`` is the last committed token, the first token of column 0's n-gram. Remembers this draft for
        ``update``.

        Example: candidates [5 6] (a chain) and a window of level 0 [10 11] and level 1 [20 21 22] give tokens
        [5 6 10 11 20 21 22], parents [-1 0 -1 2 -1 2 3], candidates [T T F F F F F].
        """
        window_tokens, window_parents = self.nodes()
        offset = tokens.size
        all_tokens = np.concatenate((tokens, window_tokens)).astype(np.int64)
        all_parents = np.concatenate((parents, np.where(window_parents >= 0, window_parents + offset, -1)))
        mask = np.zeros(all_tokens.size, dtype=bool)
        mask[:offset] = True if candidates is None else candidates
        labels = None if sources is None else tuple(sources) + ("window",) * window_tokens.size
        draft = Draft(torch.from_numpy(all_tokens), torch.from_numpy(all_parents),
                      candidates=torch.from_numpy(mask), sources=labels)
        self._draft, self._offset, self._size, self._root = draft, offset, window_tokens.size, int(root)
        return draft

    def update(self, outcome: StepOutcome) -> list[tuple[int, ...]]:
        """Advance by one Jacobi iteration from the target's choices at the window's nodes in ``outcome``;
        return the harvested n-grams (none while the window fills).

        Only an outcome of the draft the window was last attached to is read: the contract guarantees that
        ``outcome.draft`` is the very object ``propose`` returned, so a step whose draft did not carry the
        window fails the ``is`` test, and the prefill (``outcome.step == 0``, whose draft is
        ``Draft.empty()``) never carries one. Such outcomes leave the window unchanged and return [].
        """
        if outcome.step == 0 or self._draft is None or outcome.draft is not self._draft:
            return []
        start = 1 + self._offset  # target_tokens[0] is the choice after the last committed token
        return self.iterate(outcome.target_tokens[start : start + self._size], self._root)

    def iterate(self, outputs: np.ndarray, root: int) -> list[tuple[int, ...]]:
        """Advance by one Jacobi iteration given the target's choices after every window node (``outputs``
        aligned with ``nodes()``, -1 where the node was not verified) and the root token of that pass;
        return the harvested n-grams, column by column (column 0, keyed by the root, first)."""
        top = self.levels[-1]
        choices = outputs[outputs.size - top.size :]
        verified = choices >= 0
        choices = np.where(verified, choices, top)  # an unverified column keeps its guess
        if not self.full:
            # Fill: every level drops its first column and the choices become a new level (lade's first pass
            # keeps all of them; later passes drop the first, which continues the root's column).
            grown = choices if len(self.levels) == 1 else choices[1:]
            self.levels = [level[1:] for level in self.levels] + [grown]
            if self.full and self.fill_step_ngrams:
                # HD's code harvests here too, with the new top level standing in for the one below the
                # choices: column c yields (level 1..N-2 of column c, choices[c + 1], choices[c]).
                return self._columns(root, self.levels[1:] + [choices], verified)
            return []
        ngrams = self._columns(root, self.levels[1:] + [choices], verified)
        self.levels = [self.levels[1][1:]] + self.levels[2:] + [choices]
        return ngrams

    def _columns(self, root: int, upper: list[np.ndarray], verified: np.ndarray) -> list[tuple[int, ...]]:
        """The n-gram of every verified column c: its level-0 token (the root for c = 0), then ``upper``'s
        tokens of column c."""
        starts = [root, *self.levels[0].tolist()]
        width = min(level.size for level in upper)
        return [(starts[column], *(int(level[column]) for level in upper))
                for column in range(min(width, len(starts))) if verified[column]]
