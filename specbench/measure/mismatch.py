"""Why a method's output differs from its baseline's: a numerics effect at a near-tie, or a real violation.

In float32 on a CPU a multi-token verification pass gives exactly the argmax of one-token decoding, so a
greedy speculative decoder reproduces the baseline token for token. In float16 (Spec-Bench's GPU setting) and
bfloat16, a pass over several tokens rounds differently from a pass over one, and where the target's two best
tokens are nearly tied the two decodes may pick different ones: a correct method, a different output. A bug
that accepts a token the target did not choose looks the same from the outside.

The loop keeps, for every generated token, the target's top-k tokens and logits under the forward pass that
settled it. At the first position where the two outputs differ (method token m, baseline token b), the margin
of each pass is how much it preferred its own token over the other's:

    method_margin   = logit(m) - logit(b) under the method's pass
    baseline_margin = logit(b) - logit(m) under the baseline's pass

Both are >= 0 for a correct greedy decoder; when both are at most the tolerance, the two passes disagreed at a
near-tie (``near_tie``). Anything else (a negative margin: a pass emitted a token that was not its best; a
margin above the tolerance; the other token outside a pass's top-k; one output a strict prefix of the other)
is a ``violation``. With sampling the outputs are expected to differ (losslessness is then a property of the
distribution, tested statistically), so a difference is ``not_checked``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("near_tie", "violation", "not_checked")

# Default tolerance in logits per dtype: a few units in the last place of a logit of magnitude ~30 in that
# dtype (bfloat16 keeps 8 significant bits, float16 11, float32 24).
DEFAULT_TOLERANCE = {"float32": 1e-3, "float16": 0.1, "bfloat16": 0.5}


@dataclass(frozen=True)
class Mismatch:
    """The first difference between two decodes of one question (turn and index count from 0)."""

    turn: int
    index: int
    method_token: int
    baseline_token: int
    method_margin: float | None
    baseline_margin: float | None
    kind: str

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(method_tokens: list[int], baseline_tokens: list[int]) -> int | None:
    """Index of the first position where two token lists differ (a missing token counts as different), or
    None when they are equal."""
    for index, (ours, theirs) in enumerate(zip(method_tokens, baseline_tokens)):
        if ours != theirs:
            return index
    return None if len(method_tokens) == len(baseline_tokens) else min(len(method_tokens), len(baseline_tokens))


def margin(top_ids: np.ndarray, top_logits: np.ndarray, preferred: int, other: int) -> float | None:
    """logit(preferred) - logit(other) under one pass, from its top-k ids and logits at that position
    ([k] each); None when either token is not among them."""
    ids = top_ids.tolist()
    if preferred not in ids or other not in ids:
        return None
    return float(top_logits[ids.index(preferred)] - top_logits[ids.index(other)])


def classify(method_margin: float | None, baseline_margin: float | None, tolerance: float) -> str:
    """``near_tie`` when both passes preferred their own token by at most ``tolerance``, else ``violation``."""
    if method_margin is None or baseline_margin is None:
        return "violation"
    if 0.0 <= method_margin <= tolerance and 0.0 <= baseline_margin <= tolerance:
        return "near_tie"
    return "violation"


def diagnose(method_turns: list[list[int]], baseline_turns: list[list[int]], method_top: list[tuple],
             baseline_top: list[tuple], tolerance: float, exact: bool = True) -> Mismatch | None:
    """The first difference between a method's and its baseline's answers (token ids per turn), classified;
    None when they are identical.

    method_top, baseline_top: per turn (top_ids [n_tokens, k], top_logits [n_tokens, k]) from the loop.
    exact: False for sampling runs, where a difference is expected (kind ``not_checked``).
    """
    for turn, (ours, theirs) in enumerate(zip(method_turns, baseline_turns)):
        index = first_difference(ours, theirs)
        if index is None:
            continue
        method_token = ours[index] if index < len(ours) else -1
        baseline_token = theirs[index] if index < len(theirs) else -1
        if not exact:
            return Mismatch(turn, index, method_token, baseline_token, None, None, "not_checked")
        if method_token < 0 or baseline_token < 0:
            return Mismatch(turn, index, method_token, baseline_token, None, None, "violation")
        method_margin = margin(*(rows[index] for rows in method_top[turn]), method_token, baseline_token)
        baseline_margin = margin(*(rows[index] for rows in baseline_top[turn]), baseline_token, method_token)
        return Mismatch(turn, index, method_token, baseline_token, method_margin, baseline_margin,
                        classify(method_margin, baseline_margin, tolerance))
    if len(method_turns) != len(baseline_turns):
        return Mismatch(min(len(method_turns), len(baseline_turns)), 0, -1, -1, None, None, "violation")
    return None
