"""Stalls inside a question: target passes far slower than the run's own passes of their size.

Why: the busy-machine check (``specbench.measure.machine``) looks at the load around a question, not at the steps
inside it. A process that reads files for a few seconds can stall three passes of one question (0.66, 1.50 and
1.22 s where that size took about 90 ms every other time: about 6 s of the question's 16 s) while the load
averaged over the question stays low, and that question's speedup then enters the tables as if measured on a
quiet machine. The steps already say it: each records its verify size and its ``verify_s``.

The rule (docs/measurement.md, "Stalls inside a question"):

* **Reference per verify size** (``VerifyTimes.reference``): the median ``verify_s`` of the run's own steps of
  that size (``verify_tokens``, shape padding included) so far, this question's included, once there are
  ``MIN_SAMPLES`` of them (a median of five is moved by no fewer than three stalls). Below that, the
  calibration's t(q) (``verify_latency.json``, measured at the run's start) at that size or interpolated
  between the sizes it measured; else interpolated between the nearest sizes that have enough of the run's
  steps. A size below every known size takes the nearest larger size's reference (an upper bound, a pass of
  more tokens costs at least as much, so it never makes a step look slow); a size above every known one has
  no reference and is not checked. Prefills (step 0) are judged but not counted into the reference: a prompt's
  pass starts from an empty cache, so it is cheaper than a decoding pass of its size, never a reference for one.
* **A stalled step** took more than ``factor`` times its reference and more than ``min_s`` seconds beyond it (so
  a 1 ms jitter on a 5 ms step is none). Its excess is its ``verify_s`` minus the reference.
* **A stalled question**: for one of its roles (the method, the AR baseline), the excess of its stalled steps is
  more than ``share`` of that role's wall time. Each role counts alone, since each one's tokens/s is one side of
  the question's speedup.

Only ``verify_s`` is judged: it is the phase every method and AR share, with a reference per size; a drafter's
own time depends on what it drafts. An engine whose steps record no phase times (vLLM) gets no verdict:
``NOT_MEASURED``, never "no stalls". Answers recorded before the check have no ``stalls`` field: ``NOT_CHECKED``
(analysis does not recompute it: steps.parquet holds the method's steps only, not AR's).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# Steps of one size the run needs before their median is that size's reference (see the module docstring).
MIN_SAMPLES = 5
# The verdicts of one question (``stall_verdict``).
STALLED, NO_STALLS = "stalled", "no stalls"
NOT_MEASURED = "not measured"  # the engine records no per-step times (vLLM)
NOT_CHECKED = "not checked"  # an answer recorded before specbench checked for stalls
ROLE_NAMES = {"method": "the method", "baseline": "AR"}


@dataclass(frozen=True)
class StallRule:
    """run.stall_factor, run.stall_min_s and run.stall_share (docs/configuration.md)."""

    factor: float
    min_s: float
    share: float

    def to_dict(self) -> dict:
        return {"factor": self.factor, "min_s": self.min_s, "share": self.share}


def _seconds(value) -> float | None:
    """A step's seconds as a float; None where the engine recorded none (None, or NaN read back from parquet)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _interpolated(points: dict[int, float], size: int) -> float | None:
    """``points`` (size -> seconds) at ``size``: the value itself, a straight line between the nearest sizes
    below and above, the nearest larger size's value when none is below (an upper bound), None when none is
    above.

    >>> _interpolated({2: 0.1, 6: 0.3}, 3), _interpolated({2: 0.1, 6: 0.3}, 1), _interpolated({2: 0.1}, 3)
    (0.15, 0.1, None)
    """
    if size in points:
        return points[size]
    below = [known for known in points if known < size]
    above = [known for known in points if known > size]
    if not above:
        return None
    high = min(above)
    if not below:
        return points[high]
    low = max(below)
    return points[low] + (points[high] - points[low]) * (size - low) / (high - low)


class VerifyTimes:
    """The run's ``verify_s`` per verify size so far, and the reference a step of each size is judged against
    (the module docstring). ``prior``: the calibration's t(q) (size -> seconds), or None when the run did not
    calibrate."""

    def __init__(self, prior: dict[int, float] | None = None):
        self.prior = {int(size): float(seconds) for size, seconds in (prior or {}).items()}
        self.samples: dict[int, list[float]] = {}

    def add(self, steps: Iterable) -> None:
        """Count ``steps`` (objects with ``step``, ``verify_tokens`` and ``verify_s``: StepRecords, or rows of
        steps.parquet) into the references; prefills and steps without times are not counted."""
        for step in steps:
            seconds = _seconds(step.verify_s)
            if int(step.step) != 0 and seconds is not None:
                self.samples.setdefault(int(step.verify_tokens), []).append(seconds)

    def reference(self, size: int) -> float | None:
        """The seconds a pass of ``size`` tokens takes on this run: its median once the run has MIN_SAMPLES
        steps of that size, else the calibration's (interpolated), else the run's nearest sizes' (interpolated);
        None when nothing known bounds it."""
        samples = self.samples.get(size, [])
        if len(samples) >= MIN_SAMPLES:
            return statistics.median(samples)
        from_prior = _interpolated(self.prior, size)
        if from_prior is not None:
            return from_prior
        return _interpolated(self.medians(), size)

    def medians(self) -> dict[int, float]:
        """The run's own median per verify size, for the sizes with at least MIN_SAMPLES steps, smallest first."""
        return {size: statistics.median(found) for size, found in sorted(self.samples.items())
                if len(found) >= MIN_SAMPLES}


def role_stalls(steps: Iterable, wall_s: float, reference: Callable[[int], float | None],
                rule: StallRule) -> dict | None:
    """One role's stalls in one question: ``steps`` (with ``verify_tokens`` and ``verify_s``) judged against
    ``reference`` (size -> seconds or None) by ``rule``; ``wall_s`` is the role's wall time (all turns).
    Returns {steps: stalled steps, excess_s: their seconds beyond their references, wall_s, share: excess_s /
    wall_s, unchecked: steps that had no reference}, or None when no step has a ``verify_s`` (not measured)."""
    stalled, excess, unchecked, timed = 0, 0.0, 0, 0
    for step in steps:
        seconds = _seconds(step.verify_s)
        if seconds is None:
            continue
        timed += 1
        typical = reference(int(step.verify_tokens))
        if typical is None:
            unchecked += 1
        elif seconds > rule.factor * typical and seconds - typical > rule.min_s:
            stalled += 1
            excess += seconds - typical
    if not timed:
        return None
    return {"steps": stalled, "excess_s": round(excess, 4), "wall_s": round(wall_s, 4),
            "share": round(excess / wall_s, 4) if wall_s > 0 else 0.0, "unchecked": unchecked}


def question_stalls(roles: dict[str, tuple[list, float]], reference: Callable[[int], float | None],
                    rule: StallRule) -> dict:
    """One question's ``specbench.stalls`` record: ``roles`` maps each role ("method", "baseline") to its steps
    and wall seconds (``role_stalls``). {stalled: whether some role's share exceeds ``rule.share``, steps and
    excess_s summed over the roles, share: the largest role's, roles: each role's ``role_stalls``, rule}; when a
    role has no step times (an engine that records none): {stalled: None, why}."""
    found = {role: role_stalls(steps, wall_s, reference, rule) for role, (steps, wall_s) in roles.items()}
    if any(stalls is None for stalls in found.values()):
        return {"stalled": None, "why": "no per-step times"}
    share = max((stalls["share"] for stalls in found.values()), default=0.0)
    return {"stalled": share > rule.share, "steps": sum(stalls["steps"] for stalls in found.values()),
            "excess_s": round(sum(stalls["excess_s"] for stalls in found.values()), 4), "share": share,
            "roles": found, "rule": rule.to_dict()}


class StallCheck:
    """The run's stall check: the references so far (``VerifyTimes``) and the rule. ``judge`` counts a
    question's steps in, then judges them, so a question's own steps of a size count toward its reference."""

    def __init__(self, rule: StallRule, prior: dict[int, float] | None = None):
        self.rule = rule
        self.times = VerifyTimes(prior)

    def judge(self, roles: dict[str, tuple[list, float]]) -> dict:
        """``question_stalls`` of ``roles`` (role -> (steps, wall seconds)) after counting their steps in."""
        for steps, _ in roles.values():
            self.times.add(steps)
        # one reference per size and question: a median sorts every step of its size so far (a long run's AR has
        # hundreds of thousands), once per size rather than once per step
        return question_stalls(roles, functools.cache(self.times.reference), self.rule)


def stall_verdict(ours: dict | None) -> str:
    """The verdict an answer's ``specbench`` object records: STALLED, NO_STALLS, NOT_MEASURED (no per-step
    times) or NOT_CHECKED (no ``stalls``: recorded before the check, or Spec-Bench's own files)."""
    stalls = (ours or {}).get("stalls") if isinstance(ours, dict) else None
    if not isinstance(stalls, dict):
        return NOT_CHECKED
    if stalls.get("stalled") is None:
        return NOT_MEASURED
    return STALLED if stalls["stalled"] else NO_STALLS


def describe(stalls: dict) -> str:
    """A stalls record as words, per role that has stalled steps: "3 stalled steps lost 5.7 s of the method's
    16.0 s (36%)", roles joined by "and" (never by ";", which joins warnings)."""
    parts = []
    for role, found in (stalls.get("roles") or {}).items():
        if found and found["steps"]:
            name = ROLE_NAMES.get(role, role)
            parts.append(f"{found['steps']} stalled step{'s' if found['steps'] != 1 else ''} lost "
                         f"{_shown_s(found['excess_s'])} of {name}'s {_shown_s(found['wall_s'])} "
                         f"({found['share']:.0%})")
    return " and ".join(parts) if parts else "no stalled steps"


def _shown_s(seconds: float) -> str:
    """Seconds as the console shows them: one decimal, two below a second (a tiny model's 0.03 s is not 0.0 s)."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds:.2f} s"
