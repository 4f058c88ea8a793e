"""What a device does inside the loop's steps, measured apart from the loop: how long each forward pass of a
Target takes (``PassTimes``: the host's queuing of it and, on CUDA, the device's span), every synchronisation torch
makes (``TorchSyncs``), and the verdicts the GPU check (scripts/gpu_check.py, ``specbench.device_check``) draws
from them: the loop's verify time against the pass inside it, the round trips per step, where a step's time goes.

Everything here takes steps and counts as they are (a ``StepRecord``'s ``verify_s``, ``verify_tokens``,
``context_len``, ``draft_s``, ``overhead_s``; per-step counts as dicts) and needs only torch: the verdicts are
pure functions, checked on hand-built numbers (tests/test_gpu_check.py)."""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

# The loop's verify_s may exceed the pass inside it by this factor (the fence, the read of the choices, uploads).
LOOP_VERIFY_LIMIT = 1.5
# A pass whose device span is at most this factor over the host's queuing of it waited for the host's launches.
HOST_BOUND_FACTOR = 1.05


class PassTimes:
    """Inside ``target``'s forward passes while active: how long the host spends queuing each (``launch_s``, its
    return on the host) and the device's span of it (``device_s``, CUDA events recorded before and after the call:
    from the first kernel's queuing to the last one's end; empty on a CPU, where the pass runs as it is launched).
    A device span far over the host's queuing says the kernels are slow; a span close to it says the host is (the
    device then waits for each launch), and torch's profile tells which kernels. The target's own ``_forward`` is
    wrapped on the instance and given back on exit."""

    def __init__(self, target, cuda: bool):
        self.target, self.cuda = target, cuda
        self.launch_s: list[float] = []
        self.device_s: list[float] = []
        self._events: list = []

    def __enter__(self):
        original = self.target._forward

        def timed(**inputs):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            began = time.perf_counter()
            output = original(**inputs)
            self.launch_s.append(time.perf_counter() - began)
            if self.cuda:
                end.record()
                self._events.append((start, end))
            return output

        self.target._forward = timed
        return self

    def __exit__(self, *exc):
        del self.target._forward  # the class's method again
        if self.cuda:
            torch.cuda.synchronize()
            self.device_s = [start.elapsed_time(end) / 1e3 for start, end in self._events]
        return False


class TorchSyncs:
    """Every synchronisation between host and device that torch makes while it is active, counted on CUDA by
    ``torch.cuda.set_sync_debug_mode("warn")`` (a warning for each: a ``.item()``, a blocking copy to the host, a
    fence); on a CPU there is none to count (``count`` stays None)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.count = None if not cuda else 0
        self._seen = None

    def __enter__(self):
        if self.cuda:
            self._catcher = warnings.catch_warnings(record=True)
            self._seen = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def update(self) -> None:
        """Add the synchronisations warned about since the last update to ``count``."""
        if self._seen is not None:
            self.count += sum("synchroniz" in str(warning.message) for warning in self._seen)
            self._seen.clear()

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self.update()
            self._catcher.__exit__(*exc)
            self._seen = None
        return False


def own_pass_seconds(launch_s: list[float], device_s: list[float]) -> list[float]:
    """Each pass's own time: the host's queuing of it or the device's span of it, whichever is longer (no device
    spans: the queuing alone, as on a CPU)."""
    return [max(queued, spanned) for queued, spanned in zip(launch_s, device_s or [0.0] * len(launch_s))]


def loop_verify_ratio(verify_s: list[float], launch_s: list[float], device_s: list[float]) -> float:
    """The median, over a decode's steps, of the loop's ``verify_s`` of a step over the pass inside that step
    (``own_pass_seconds``): what the loop adds to the pass it times. Each step is set beside its own pass, so the
    host's speed drifting between two measurements cannot move the ratio. One pass a step, or ValueError.

    >>> loop_verify_ratio([0.75, 4.0], [0.5, 0.5], [0.25, 2.0])  # own passes 0.5 and 2.0 s
    1.75"""
    if len(launch_s) != len(verify_s):
        raise ValueError(f"{len(launch_s)} verify passes for {len(verify_s)} steps: one pass a step expected")
    own = own_pass_seconds(launch_s, device_s)
    return float(np.median([verify / seconds for verify, seconds in zip(verify_s, own)]))


def pass_bound(launch_s: list[float], device_s: list[float]) -> str:
    """``host-bound`` when the passes' median device span is no longer than their median queuing on the host (the
    device waited for each launch; within HOST_BOUND_FACTOR), else ``device-bound``.

    >>> pass_bound([0.0628], [0.0629]), pass_bound([0.010], [0.030])
    ('host-bound', 'device-bound')"""
    return "host-bound" if np.median(device_s) <= HOST_BOUND_FACTOR * np.median(launch_s) else "device-bound"


def ratio_verdict(medians: dict[str, float], judged: bool, limit: float = LOOP_VERIFY_LIMIT) -> str:
    """FAIL when a drafter's median ratio of the loop's verify to its own pass is over ``limit`` and the row is
    ``judged`` (on a GPU; a CPU shared with other jobs times single passes too loosely to judge).

    >>> ratio_verdict({"ar": 1.1, "pld": 3.1}, judged=True), ratio_verdict({"ar": 1.1, "pld": 3.1}, judged=False)
    ('FAIL', 'PASS')"""
    return "FAIL" if judged and any(ratio > limit for ratio in medians.values()) else "PASS"


def round_trip_verdict(trips: list[tuple[str, list[dict]]]) -> tuple[str, str]:
    """The round trips of each decoder's full steps (``name``, one dict a step: ``syncs``, ``reads``, ``uploads``,
    ``torch_syncs`` (None where not counted) and ``torch_expected``): PASS when every step made 1 fence and 1
    blocking read and, where torch's own synchronisations were counted, no more of those than the wrapped
    fences, reads and uploads account for (``torch_expected``): a sync inside torch that the wrappers do not see,
    an ``.item()`` in the loop, costs a round trip they miss. No step at all is a FAIL."""
    bad = [(name, step) for name, full in trips for step in full if (step["syncs"], step["reads"]) != (1, 1)]
    hidden = [(name, step) for name, full in trips for step in full
              if step.get("torch_syncs") is not None and step["torch_syncs"] > step["torch_expected"]]
    parts = []
    for name, full in trips:
        text = (f"{name}: syncs {sorted({s['syncs'] for s in full})} reads {sorted({s['reads'] for s in full})} "
                f"uploads {sorted({s['uploads'] for s in full})}")
        counted = sorted({s["torch_syncs"] for s in full if s.get("torch_syncs") is not None})
        text += f" torch syncs {counted}" if counted else " torch syncs n/a (CPU)"
        parts.append(f"{text} over {len(full)} steps")
    empty = any(not full for _, full in trips)
    summary = ", ".join(parts)
    if hidden:
        name, step = hidden[0]
        summary += f"; {len(hidden)} step(s) with syncs inside torch, e.g. {name} {step}"
    return ("FAIL" if bad or hidden or empty else "PASS"), summary


def step_shares(steps) -> dict:
    """Where the steps' time went: the shares of drafting, verifying and the loop's overhead in their sum, the
    steps counted, the mean verify in seconds and the most tokens one step verified.

    >>> from types import SimpleNamespace as Step
    >>> shares = step_shares([Step(draft_s=0.25, verify_s=0.5, overhead_s=0.25, verify_tokens=5),
    ...                       Step(draft_s=0.0, verify_s=1.0, overhead_s=0.0, verify_tokens=81)])
    >>> shares["draft"], shares["verify"], shares["verify_s"], shares["steps"], shares["max_tokens"]
    (0.125, 0.75, 0.75, 2, 81)"""
    draft, verify, overhead = (sum(getattr(step, field) for step in steps)
                               for field in ("draft_s", "verify_s", "overhead_s"))
    total = draft + verify + overhead or 1.0
    return {"draft": draft / total, "verify": verify / total, "overhead": overhead / total, "steps": len(steps),
            "verify_s": verify / max(len(steps), 1),
            "max_tokens": max((step.verify_tokens for step in steps), default=0)}


def device_memory_gib(device: torch.device) -> tuple[str, str]:
    """(allocated, peak) GiB on a CUDA ``device`` after synchronising it, as text; ("n/a", "n/a") elsewhere."""
    if device.type != "cuda":
        return "n/a", "n/a"
    torch.cuda.synchronize(device)
    allocated, peak = torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    return f"{allocated / 2**30:.2f}", f"{peak / 2**30:.2f}"
