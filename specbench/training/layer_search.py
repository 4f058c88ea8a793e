"""The search for the sublayers a self-speculative draft skips, as Draft & Verify and SWIFT run it: Bayesian
optimisation over one number in [0, 1] per sublayer, with the ``bayes_opt`` package's Gaussian process and upper
confidence bound restated here in numpy (docs/fidelity.md says where it departs).

The encodings (pure functions, pinned by tests):

- Draft & Verify (searching.py): ``2L`` numbers for a target of ``L`` layers, the first ``L`` the attentions, the
  next ``L`` the MLPs; a sublayer is skipped when its number is above 0.5, with no bound on how many.
- SWIFT (utils.py): ``2(L-2)`` numbers, the first and last layers never skipped; exactly ``int(2(L-2) x ratio)``
  sublayers skipped, those of the largest numbers (a random candidate is that many chosen at random, written as
  ones among zeros).

The optimiser (bayes_opt 1.4/1.5 with the originals' settings): a Gaussian process with a Matern kernel (nu 2.5) of
one length scale, noise ``alpha`` added to its diagonal, the observed scores normalised to mean 0 and deviation 1;
the next point maximises the upper confidence bound mean + kappa x deviation over 10 000 uniform random points.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from specbench.errors import SpecbenchError

# bayes_opt's acq_max draws this many random points and keeps the best of the acquisition (n_warmup).
RANDOM_CANDIDATES = 10_000
# The length scales the kernel is fitted over (bayes_opt: L-BFGS-B within [1e-5, 1e5]; here the best of a grid).
LENGTH_SCALES = np.geomspace(1e-2, 1e2, 41)


# ---- encodings ------------------------------------------------------------------------------------------------

class Sublayers(NamedTuple):
    """A skip set as the search reads it: the layers (from 0) whose attention, and whose MLP, are skipped. The
    drafters turn it into the Target's ``LayerSkip``; the search knows nothing of targets."""

    attention: frozenset[int]
    mlp: frozenset[int]


def threshold_skip_set(point: np.ndarray, num_layers: int) -> Sublayers:
    """Draft & Verify's reading of a point of ``2 x num_layers`` numbers: attention i skipped when point[i] > 0.5,
    MLP i when point[num_layers + i] > 0.5 (searching.py)."""
    point = np.asarray(point, dtype=float)
    if point.shape != (2 * num_layers,):
        raise SpecbenchError(f"a Draft & Verify search point has {2 * num_layers} numbers for {num_layers} layers, "
                             f"not {point.size}")
    return Sublayers(frozenset(np.flatnonzero(point[:num_layers] > 0.5).tolist()),
                     frozenset(np.flatnonzero(point[num_layers:] > 0.5).tolist()))


def swift_skip_count(num_layers: int, ratio: float) -> int:
    """How many sublayers SWIFT skips: int(2(L-2) x ratio) of the inner layers' (utils.py)."""
    return int((num_layers - 2) * 2 * ratio)


def top_skip_set(point: np.ndarray, num_layers: int, count: int) -> Sublayers:
    """SWIFT's reading of a point of ``2(num_layers - 2)`` numbers: the ``count`` largest skipped, number i < L-2
    the attention of layer i + 1, number L-2+i the MLP of layer i + 1 (the first and last layers are kept whole)."""
    inner = num_layers - 2
    point = np.asarray(point, dtype=float)
    if point.shape != (2 * inner,):
        raise SpecbenchError(f"a SWIFT search point has {2 * inner} numbers for {num_layers} layers, not {point.size}")
    chosen = np.argsort(-point, kind="stable")[:count]
    return Sublayers(frozenset((chosen[chosen < inner] + 1).tolist()),
                     frozenset((chosen[chosen >= inner] - inner + 1).tolist()))


def point_of(skip, num_layers: int) -> np.ndarray:
    """The SWIFT point of ``skip`` (anything with ``attention`` and ``mlp`` sets): ones at its sublayers, zeros elsewhere (how a random candidate is registered)."""
    inner = num_layers - 2
    point = np.zeros(2 * inner)
    for layer in skip.attention:
        point[layer - 1] = 1.0
    for layer in skip.mlp:
        point[inner + layer - 1] = 1.0
    return point


def random_skip_set(rng: np.random.Generator, num_layers: int, count: int) -> Sublayers:
    """``count`` of the inner layers' sublayers chosen at random without replacement (SWIFT's random step)."""
    inner = num_layers - 2
    chosen = rng.choice(2 * inner, size=count, replace=False)
    return Sublayers(frozenset((chosen[chosen < inner] + 1).tolist()),
                     frozenset((chosen[chosen >= inner] - inner + 1).tolist()))


# ---- the optimiser --------------------------------------------------------------------------------------------

def matern52(distances: np.ndarray, length_scale: float) -> np.ndarray:
    scaled = math.sqrt(5.0) * distances / length_scale
    return (1.0 + scaled + scaled**2 / 3.0) * np.exp(-scaled)


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    squared = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.sqrt(np.maximum(squared, 0.0))


class GaussianProcessUCB:
    """Bayesian optimisation of a function of ``dimensions`` numbers in [0, 1]: ``register`` what was observed,
    ``suggest`` where to look next (the upper confidence bound's maximum among random points)."""

    def __init__(self, dimensions: int, kappa: float, alpha: float):
        self.dimensions, self.kappa, self.alpha = int(dimensions), float(kappa), float(alpha)
        self.points: list[np.ndarray] = []
        self.scores: list[float] = []

    def register(self, point: np.ndarray, score: float) -> None:
        point = np.asarray(point, dtype=float)
        if point.shape != (self.dimensions,):
            raise SpecbenchError(f"a point of {point.size} numbers registered with a search over {self.dimensions}")
        self.points.append(point)
        self.scores.append(float(score))

    def _fit(self):
        """(length scale, Cholesky factor, weights, mean, deviation) of the process on what was registered, the
        length scale the one of the highest log marginal likelihood."""
        x = np.stack(self.points)
        y = np.asarray(self.scores)
        mean, deviation = y.mean(), y.std()
        deviation = deviation if deviation > 0 else 1.0
        normal = (y - mean) / deviation
        distances = _distances(x, x)
        best = None
        for length_scale in LENGTH_SCALES:
            kernel = matern52(distances, length_scale) + self.alpha * np.eye(len(y))
            try:
                factor = np.linalg.cholesky(kernel)
            except np.linalg.LinAlgError:
                continue
            weights = np.linalg.solve(factor.T, np.linalg.solve(factor, normal))
            likelihood = -0.5 * normal @ weights - np.log(np.diag(factor)).sum()
            if best is None or likelihood > best[0]:
                best = (likelihood, length_scale, factor, weights)
        _, length_scale, factor, weights = best
        return length_scale, factor, weights, mean, deviation, x

    def upper_bound(self, candidates: np.ndarray) -> np.ndarray:
        """mean + kappa x deviation of the fitted process at ``candidates`` ([n, dimensions])."""
        length_scale, factor, weights, mean, deviation, x = self._fit()
        cross = matern52(_distances(candidates, x), length_scale)
        predicted = cross @ weights
        solved = np.linalg.solve(factor, cross.T)
        variance = np.maximum(1.0 - (solved * solved).sum(0), 0.0)
        return mean + deviation * (predicted + self.kappa * np.sqrt(variance))

    def suggest(self, rng: np.random.Generator) -> np.ndarray:
        """The next point: a uniform random one while nothing is registered, else the best of RANDOM_CANDIDATES
        random points by the upper confidence bound."""
        candidates = rng.uniform(size=(RANDOM_CANDIDATES, self.dimensions))
        if not self.points:
            return candidates[0]
        return candidates[int(np.argmax(self.upper_bound(candidates)))]

    def best(self) -> tuple[np.ndarray, float]:
        """The registered point of the highest score, and the score."""
        index = int(np.argmax(self.scores))
        return self.points[index], self.scores[index]
