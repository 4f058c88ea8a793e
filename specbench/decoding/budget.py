"""Choosing how much of a draft to verify, from what verification costs and how often drafts are right.

"Decoding Speculative Decoding" (Yan et al.) models throughput as accepted tokens per step over step time.
With the target's measured latency per number of verified tokens, and running estimates of how often each
kind of draft node is accepted, a step's expected throughput can be computed for every prefix of the
draft's nodes ranked by acceptance probability; ``DraftBudget`` keeps the prefix that maximises it. On a GPU
the latency is nearly flat in the token count and almost everything is kept; on a CPU it grows, and weak
draft nodes (a 1-gram prompt match, a rare corpus continuation) are dropped before they cost a forward pass.
Verifying fewer draft tokens never changes the output, only how fast it comes.
"""

from __future__ import annotations

import numpy as np


def interpolate_latency(counts: np.ndarray, seconds: np.ndarray, sizes):
    """Seconds of a pass over each of ``sizes`` tokens from latencies measured at ascending ``counts``: linear
    between measured counts, the smallest count's value below it, and beyond the largest the slope of the two
    largest counts, never downward (a pass over more tokens does not get cheaper). Nothing is fitted, so a
    curve that is not a line (2-3 tokens slower than 4 on a CPU) is kept. The draft budget and the analysis's
    throughput model both read latencies this way.

    >>> interpolate_latency(np.array([1, 3, 11]), np.array([0.050, 0.060, 0.090]), [2, 11, 15]).round(4).tolist()
    [0.055, 0.09, 0.105]
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    result = np.interp(sizes, counts, seconds)
    if counts.size >= 2:
        slope = max(0.0, (seconds[-1] - seconds[-2]) / (counts[-1] - counts[-2]))
        result = np.where(sizes > counts[-1], seconds[-1] + slope * (sizes - counts[-1]), result)
    return result


class VerifyCost:
    """Seconds of a verification forward pass over q tokens: measured at start, then kept current with the
    step timings the loop observes (an exponential moving average per token count), read with
    ``interpolate_latency``."""

    def __init__(self, latencies: dict[int, float], smoothing: float = 0.1):
        self.calibrated = dict(latencies)
        self.latencies = dict(latencies)
        self.smoothing = smoothing
        self._grid = None

    def forget(self) -> None:
        """Back to the calibrated latencies (what the step timings taught is dropped)."""
        self.latencies = dict(self.calibrated)
        self._grid = None

    def observe(self, size: int, seconds: float) -> None:
        known = self.latencies.get(size)
        self.latencies[size] = seconds if known is None else known + self.smoothing * (seconds - known)
        if known is None:
            self._grid = None

    def __call__(self, sizes):
        """Seconds for one token count or an array of them."""
        if self._grid is None:
            self._grid = np.array(sorted(self.latencies), dtype=np.float64)
        values = np.array([self.latencies[int(count)] for count in self._grid])
        return interpolate_latency(self._grid, values, sizes)


def node_kinds(parents: np.ndarray, depths: np.ndarray, sources, max_depth: int = 12, max_rank: int = 3) -> list[tuple]:
    """A kind per draft node (draft numbering): (source label, depth, rank among its siblings), the features
    acceptance is estimated by. Depth and rank are capped at ``max_depth`` and ``max_rank`` so that rare deep
    nodes share estimates."""
    seen_children: dict[int, int] = {}
    kinds = []
    for node, parent in enumerate(parents.tolist()):
        rank = seen_children.get(parent, 0)
        seen_children[parent] = rank + 1
        kinds.append((sources[node] if sources else "", min(int(depths[node]), max_depth), min(rank, max_rank)))
    return kinds


class DraftBudget:
    """Per drafter, running acceptance rates per node kind; per step, the nodes worth verifying.

    A node's acceptance probability is its parent's times the conditional rate of its kind (the fraction of
    such nodes accepted when their parent was), starting from ``prior_rate`` with weight ``prior_weight``.
    A kind that is pruned is never observed again, so its estimate could never recover; an optimism bonus of
    ``explore / sqrt(trials + 1)`` (an upper confidence bound) keeps rarely tried kinds in play.
    """

    def __init__(self, cost, prior_rate: float = 0.5, explore: float = 0.3, memory: float = 50.0,
                 prior_weight: float = 2.0, max_depth: int = 12, max_rank: int = 3):
        self.cost = cost  # callable: array of token counts to verify -> seconds (shape padding included)
        self.prior_rate = prior_rate
        self.explore = explore
        self.prior_weight = prior_weight
        self.memory = memory  # past this many trials a kind's counts are halved, so estimates can move
        self.max_depth = max_depth
        self.max_rank = max_rank
        self.counts: dict[str, dict[tuple, list[float]]] = {}

    def forget(self) -> None:
        """Drop every acceptance estimate: back to the prior."""
        self.counts.clear()

    def kinds(self, parents: np.ndarray, depths: np.ndarray, sources) -> list[tuple]:
        """``node_kinds`` with this budget's caps."""
        return node_kinds(parents, depths, sources, self.max_depth, self.max_rank)

    def rates(self, drafter: str, kinds: list[tuple]) -> np.ndarray:
        table = self.counts.setdefault(drafter, {})
        rates = np.empty(len(kinds))
        for index, kind in enumerate(kinds):
            accepted, trials = table.get(kind, (0.0, 0.0))
            mean = (accepted + self.prior_rate * self.prior_weight) / (trials + self.prior_weight)
            rates[index] = min(1.0, mean + self.explore / np.sqrt(trials + 1.0))
        return rates

    def select(self, drafter: str, parents: np.ndarray, kinds: list[tuple], candidates: np.ndarray | None) -> np.ndarray:
        """Indices (draft numbering, ascending) of the nodes to verify: every non-candidate, and the
        candidates that maximise (1 + expected accepted tokens) / verify seconds."""
        rates = self.rates(drafter, kinds)
        probability = np.empty(len(kinds))
        for node, parent in enumerate(parents.tolist()):
            probability[node] = rates[node] * (probability[parent] if parent >= 0 else 1.0)
        is_candidate = np.ones(len(kinds), dtype=bool) if candidates is None else candidates
        fixed = int((~is_candidate).sum())
        # Stable sort by descending probability: a parent is never less likely than its child and comes
        # first among equals, so every prefix of this order is a valid tree.
        ranked = np.flatnonzero(is_candidate)[np.argsort(-probability[is_candidate], kind="stable")]
        expected = 1.0 + np.concatenate(([0.0], np.cumsum(probability[ranked])))
        seconds = self.cost(1 + fixed + np.arange(ranked.size + 1))
        best = int(np.argmax(expected / seconds))
        chosen = np.zeros(len(kinds), dtype=bool)
        chosen[~is_candidate] = True
        chosen[ranked[:best]] = True
        # A non-candidate under a dropped candidate goes too (Lookahead's capped guess tails hang off candidates;
        # the window hangs off the root): the kept nodes must form a tree.
        for node, parent in enumerate(parents.tolist()):
            if parent >= 0 and not chosen[parent]:
                chosen[node] = False
        return np.flatnonzero(chosen)

    def observe(self, drafter: str, parents: np.ndarray, kinds: list[tuple], candidates: np.ndarray | None,
                accepted: list[int]) -> None:
        """Count, for every verified candidate whose parent was accepted (or is the root), whether it was."""
        table = self.counts.setdefault(drafter, {})
        on_path = set(accepted)
        for node, parent in enumerate(parents.tolist()):
            if (candidates is not None and not candidates[node]) or (parent >= 0 and parent not in on_path):
                continue
            counts = table.setdefault(kinds[node], [0.0, 0.0])
            counts[0] += node in on_path
            counts[1] += 1.0
            if counts[1] > self.memory:
                counts[0] *= 0.5
                counts[1] *= 0.5
