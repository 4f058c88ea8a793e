"""Helpers shared by the drafters in this folder. The drafter contract itself (``Draft``, ``Drafter``,
``StepOutcome``) lives next to the loop, in ``specbench.decoding.contract``."""

from __future__ import annotations

import math

import torch

from specbench.decoding.contract import Draft
from specbench.errors import SpecbenchError


def require_positive(**settings) -> None:
    """Reject a drafter setting that is not a positive integer, naming it: ``drafter.gamma must be ...``."""
    for key, value in settings.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecbenchError(f"drafter.{key} must be a positive integer, got {value!r}")


def require_non_negative(**settings) -> None:
    """Reject a drafter setting that is not a non-negative integer, naming it."""
    for key, value in settings.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecbenchError(f"drafter.{key} must be a non-negative integer, got {value!r}")


def require_number(key: str, value, low: float | None = None, high: float | None = None,
                   above_low: bool = False) -> float:
    """A real-valued drafter setting, checked and returned as a float: a finite int or float (not a bool, whose
    arithmetic would pass as 0 or 1, nor a string, nor inf or nan, which every comparison with a bound lets
    through or none does) within ``[low, high]`` (``(low, high]`` with ``above_low``)."""
    if low is not None and high is not None:
        wanted = f"a number in {'(' if above_low else '['}{low:g}, {high:g}]"
    elif low is not None:
        wanted = f"a number {'>' if above_low else '>='} {low:g}"
    else:
        wanted = "a number" + ("" if high is None else f" <= {high:g}")
    wanted += ", not inf or nan"
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or (low is not None and (value <= low if above_low else value < low))
            or (high is not None and value > high)):
        raise SpecbenchError(f"drafter.{key} must be {wanted}, got {value!r}")
    return float(value)


def require_flag(**settings) -> None:
    """Reject a drafter setting that is not true or false (a string such as "no" would be truthy), naming it."""
    for key, value in settings.items():
        if not isinstance(value, bool):
            raise SpecbenchError(f"drafter.{key} must be true or false, got {value!r}")


def require_choice(key: str, value, choices) -> None:
    """Reject a drafter setting that is not one of ``choices``, listing them."""
    if value not in choices:
        raise SpecbenchError(f"drafter.{key}={value!r} is not known; choose one of: {', '.join(choices)}")


def check_token_id(key: str, value) -> int | None:
    """A drafter setting that is a token id or null, checked: ``drafter.no_match_token must be ...``."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise SpecbenchError(f"drafter.{key} must be a token id (>= 0) or null, got {value!r}")
    return value


def require_in_vocabulary(key: str, token: int | None, target) -> None:
    """Reject a token-id setting outside the target's vocabulary, naming the key and the vocabulary size."""
    size = target.vocab_size
    if token is not None and token >= size:
        raise SpecbenchError(f"drafter.{key}={token} is not a token of {target.name} (vocabulary of {size}); "
                             "use a smaller id, or null for no draft when nothing matches")


def no_match_draft(token: int | None) -> Draft:
    """The draft of a step where the method found nothing: Spec-Bench's PLD and REST verify one dummy token
    (id 100) rather than decoding one token alone, so such a step costs a two-token pass, which is part of
    what their numbers measured; ``None``: no draft."""
    if token is None:
        return Draft.empty()
    return Draft(torch.tensor([token], dtype=torch.int64), sources=("no-match",))


def chosen_or_listed(chosen: dict, listed: dict, key: str) -> dict | None:
    """The model a drafter config names itself (``chosen`` with a ``hub_id`` or ``path``), else the entry of
    ``listed`` for ``key`` (the target's family or name); None when neither has one (the caller names the fix)."""
    if any(chosen.get(field) for field in ("hub_id", "path")):
        return chosen
    return listed.get(key) or None

