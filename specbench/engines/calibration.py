"""The start-up calibration of the specbench loop: the target's verify latency per number of tokens verified,
measured once per run (or taken from the verify_latency.json of an earlier session), and the ``DecodePolicy``
the decoder follows from it: padded shapes (``run.verify_padding``) and the draft budget (``run.draft_budget``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specbench.decoding.budget import DraftBudget, VerifyCost
from specbench.decoding.loop import DecodePolicy, Decoder, VerifyShapes
from specbench.distributed import Processes
from specbench.storage.atomic import write_atomically
from specbench.settings import RunSettings

if TYPE_CHECKING:
    from specbench.models import LoadedModel

log = logging.getLogger(__name__)

LATENCY_FILE = "verify_latency.json"


def calibrate(settings: RunSettings, model: LoadedModel, decoder: Decoder, prompt_ids: list[int],
              measured: dict[int, float] | None = None) -> tuple[dict[int, float], DecodePolicy]:
    """Measure the target's verify latency per token count on ``prompt_ids`` (or take the ``measured`` ones
    of an earlier session of this run) and decide the shape padding (run.verify_padding) and the draft budget
    (run.draft_budget) from them; return the latencies and that policy. Both off: nothing is measured, and the
    policy is the decoder's default (no padding, no budget)."""
    if settings.verify_padding == "off" and settings.draft_budget == "off":
        return {}, DecodePolicy()
    sizes = settings.calibration_grid(min(settings.max_draft_tokens + 1, model.max_context - len(prompt_ids)))
    if settings.draft_budget == "off":
        sizes = [size for size in sizes if size <= settings.verify_padding_max]
    if measured is not None:
        sizes = sorted(measured)
        latencies = dict(measured)
    else:
        latencies = decoder.measure_verify_latency(prompt_ids, sizes, repeats=settings.calibration_repeats)
    return latencies, decode_policy(settings, latencies, sizes)


def decode_policy(settings: RunSettings, latencies: dict[int, float], sizes: list[int]) -> DecodePolicy:
    """The padding and draft budget ``settings`` ask for, decided from verify ``latencies`` measured at
    ``sizes``."""
    shapes = VerifyShapes()
    if settings.verify_padding == "auto":
        padding_sizes = {size: latencies[size] for size in sizes if size <= settings.verify_padding_max}
        shapes = VerifyShapes.from_latencies(padding_sizes, min_gain=settings.verify_padding_min_gain)
    if settings.draft_budget != "auto":
        return DecodePolicy(verify_shapes=shapes)
    cost = VerifyCost(latencies, smoothing=settings.verify_cost_smoothing)
    # The budget prices a draft at the shape it will be verified in.
    budget = DraftBudget(lambda counts: cost(shapes.padded_array(counts)),
                         prior_rate=settings.draft_budget_prior, explore=settings.draft_budget_explore,
                         memory=settings.draft_budget_memory, prior_weight=settings.draft_budget_prior_weight,
                         max_depth=settings.draft_budget_max_depth, max_rank=settings.draft_budget_max_rank)
    return DecodePolicy(verify_shapes=shapes, verify_cost=cost, draft_budget=budget)


def calibrate_run(settings: RunSettings, model: LoadedModel, decoder: Decoder, prompt_ids: list[int],
                  run_path: Path, processes: Processes) -> None:
    """``calibrate`` for a run in ``run_path`` and have ``decoder`` follow the result: a resumed session reuses
    the latencies its first session measured, every process of a tensor-parallel run pads as rank 0 measured,
    and what was measured is logged and recorded in verify_latency.json."""
    latency_file = run_path / LATENCY_FILE
    saved = processes.share(saved_latencies(latency_file))
    latencies, policy = calibrate(settings, model, decoder, prompt_ids, measured=saved)
    if processes.world_size > 1 and saved is None:  # every process measured; all pad as rank 0 measured
        latencies, policy = calibrate(settings, model, decoder, prompt_ids, measured=processes.share(latencies))
    if not latencies:
        return
    decoder.use_policy(policy)
    if saved is None:
        record_latencies(latency_file, latencies, policy.verify_shapes, len(prompt_ids))


def record_latencies(latency_file: Path, latencies: dict[int, float], shapes: VerifyShapes, context_len: int) -> None:
    """Log the measured latencies and the padding chosen from them, and write them to ``latency_file``."""
    padded = {size: shapes.padded(size) for size in latencies if shapes.padded(size) != size}
    log.info("verify latency by tokens verified: %s; padding %s",
             ", ".join(f"{size}:{seconds * 1000:.1f}ms" for size, seconds in latencies.items()), padded or "none")
    text = json.dumps({"latency_s": latencies, "pad_to": padded, "context_len": context_len}, indent=2) + "\n"
    write_atomically(latency_file, lambda path: path.write_text(text))


def saved_latencies(latency_file: Path) -> dict[int, float] | None:
    """The verify latencies an earlier session of this run measured, if any: a resumed run reuses them, so its
    padding and draft budget decide as the uninterrupted run's did (a new calibration would measure another
    question on a machine in another state)."""
    if not latency_file.is_file():
        return None
    try:
        saved = json.loads(latency_file.read_text())["latency_s"]
        latencies = {int(size): float(seconds) for size, seconds in saved.items()}
        if not all(size > 0 and np.isfinite(seconds) and seconds > 0 for size, seconds in latencies.items()):
            raise ValueError("a size or latency out of range")
        return latencies
    except Exception:  # whatever the reading raised (RecursionError, OSError, a wrong shape): measured again
        log.warning("%s is damaged; calibrating again", latency_file)
        return None
