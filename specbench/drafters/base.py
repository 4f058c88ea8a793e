"""Helpers shared by the drafters in this folder. The drafter contract itself (``Draft``, ``Drafter``,
``StepOutcome``) lives next to the loop, in ``specbench.decoding.contract``."""

from __future__ import annotations

from specbench.errors import SpecbenchError


def require_positive(**settings) -> None:
    """Reject a drafter setting that is not a positive integer, naming it: ``drafter.gamma must be ...``."""
    for key, value in settings.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecbenchError(f"drafter.{key} must be a positive integer, got {value!r}")
