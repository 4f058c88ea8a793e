"""The machine's floor for one target pass, and the run's own cost curve beside it.

Why: every speedup is accepted tokens over what a verify pass of q tokens costs against AR's one-token pass.
A decoding pass of q tokens reads every weight once whatever q is (q of a few tokens adds little arithmetic), so
the least a pass can take on a machine is the bytes of weights it reads over the memory bandwidth the machine shows:
its *floor*. How far AR's pass sits above that floor, and how fast t(q) rises with q, say whether a run's numbers
describe the method or the kernels and the interpreter it ran on (the embedded SmolLM2 run eagerly on a 2-core Xeon:
AR's pass 45 ms, 2.5x its floor of 18 ms; a verify of 2 tokens 1.18x AR's pass, of 11 tokens 1.44x).

* **Bandwidth** (``probe_bandwidth``): the best of a few full reads (a reduction, one addition per element:
  memory-bound) of a buffer as large as the weights a pass reads, capped at ``PROBE_CAP_BYTES``, on the run's device
  with the run's threads. The size is the pass's own because a machine's caches serve a read of 100 MB faster than
  one of 1 GB (on this project's 2-core EPYC host: 54 GB/s at 113 MB, 29 GB/s at 540 MB and beyond), and the floor
  is what reading *these* weights once can take. Probed once per machine and size and kept in specbench's cache
  (``machine/bandwidth.json``, one entry per ``machine_key``: CPU model, its flags, threads, torch, or the GPU's
  name; and the size), since a probe moves gigabytes; a damaged cache is probed again.
* **Bytes a pass reads** (``bytes_read_per_pass``): every parameter's bytes, less the input embedding's when it is
  not the output layer's own weight (a pass reads only the rows of the tokens it embeds).
* **The cost curve** (``cost_curve``): the median ``verify_s`` of the method's steps of each verify size with at
  least ``stalls.MIN_SAMPLES`` of them (prefills excluded: a prompt's pass starts from an empty cache), each over AR's
  pass: the median over questions of the baseline's seconds per token after the prefill
  (``metrics.answer_decoding_rate``; a whole AR step, its argmax included), which is what a method's step replaces;
  and AR's pass over the floor.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from specbench.measure.machine import cpu_model_and_flags
from specbench.measure.stalls import VerifyTimes
from specbench.storage.atomic import write_atomically

log = logging.getLogger(__name__)

BANDWIDTH_FILE = "bandwidth.json"
# The most the probe reads: beyond a GPU's L2 and most CPUs' last-level caches, so a larger model's weights stream
# from memory at the rate it shows, and small enough to sit beside a model on a GPU. Halved until it fits where
# memory is short.
PROBE_CAP_BYTES = 1 << 30
PROBE_MIN_BYTES = 1 << 20
PROBE_REPEATS = 5


def probe_size(bytes_per_pass: int) -> int:
    """The bytes the probe reads for a pass that reads ``bytes_per_pass``: the same, within [1 MiB, 1 GiB]."""
    return min(max(int(bytes_per_pass), PROBE_MIN_BYTES), PROBE_CAP_BYTES)


def machine_key(device: torch.device, threads: int, read_bytes: int) -> str:
    """What a bandwidth measured here holds for: the device (a GPU's name; a CPU's model and its flags), the threads
    that read, torch (whose reduction kernel reads) and the bytes read."""
    if device.type == "cuda":
        what = f"cuda:{torch.cuda.get_device_name(device)}"
    else:
        model, flags = cpu_model_and_flags()
        model = model or platform.processor() or "unknown"
        what = f"cpu:{model}:{hashlib.sha256(flags.encode()).hexdigest()[:12]}:threads={threads}"
    return f"{what}:torch={torch.__version__}:{platform.machine()}:bytes={read_bytes}"


def probe_bandwidth(device: torch.device, probe_bytes: int, repeats: int = PROBE_REPEATS) -> float:
    """Bytes per second the best of ``repeats`` full reads of a ``probe_bytes`` float32 buffer on ``device`` took
    (the first read, which faults the pages in, is not counted)."""
    while True:
        try:
            buffer = torch.ones(probe_bytes // 4, dtype=torch.float32, device=device)
            break
        except (RuntimeError, MemoryError):  # torch.OutOfMemoryError is a RuntimeError
            if probe_bytes <= PROBE_MIN_BYTES:
                raise
            probe_bytes //= 2
    best = math.inf
    for _ in range(repeats + 1):
        _synchronize(device)
        start = time.perf_counter()
        total = buffer.sum()
        _synchronize(device)
        elapsed = time.perf_counter() - start
        best = min(best, elapsed) if math.isfinite(float(total)) else best
    del buffer
    if not math.isfinite(best) or best <= 0:
        raise RuntimeError(f"the bandwidth probe on {device} read nothing measurable")
    return probe_bytes / best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_bandwidth(cache_directory: Path, device: torch.device, threads: int, bytes_per_pass: int,
                      probe: Callable[[torch.device, int], float] | None = None) -> dict:
    """This machine's bandwidth for reading ``bytes_per_pass`` as ``{"bytes_per_s", "key", "cached"}``: from
    ``cache_directory/bandwidth.json`` when it holds this machine's key, else probed (a log line says so) and kept
    there. A damaged file, or a value in it that is no positive number, is probed over, never trusted."""
    read_bytes = probe_size(bytes_per_pass)
    key = machine_key(device, threads, read_bytes)
    path = cache_directory / BANDWIDTH_FILE
    known = _read_cache(path)
    value = known.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return {"bytes_per_s": float(value), "key": key, "cached": True}
    log.info("probing this machine's memory bandwidth on %s, reading %d MB (once per machine and model size)",
             device, read_bytes // 1_000_000)
    measured = float((probe or probe_bandwidth)(device, read_bytes))
    known[key] = measured
    text = json.dumps(known, indent=2, sort_keys=True) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda target: target.write_text(text))
    except OSError as error:  # a read-only cache costs a probe per run, not the run
        log.warning("could not keep the bandwidth in %s (%s); it is probed again by the next run (set "
                    "SPECBENCH_CACHE to a writable directory)", path, error.strerror or error)
    return {"bytes_per_s": measured, "key": key, "cached": False}


def _read_cache(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        known = json.loads(path.read_text())
        if not isinstance(known, dict):
            raise ValueError("not an object")
        return known
    except (OSError, ValueError) as error:
        log.warning("%s is damaged (%s); probing the bandwidth again", path, error)
        return {}


def bytes_read_per_pass(parameter_count: int, element_size: int, input_embeddings: torch.Tensor | None,
                        output_weight: torch.Tensor | None) -> int:
    """The bytes of weights one pass reads: ``parameter_count`` parameters of ``element_size`` bytes (each tied
    tensor once), less the input embedding table unless it is the output layer's own weight (a pass reads only the
    rows of the tokens it embeds, and the whole output layer)."""
    total = parameter_count * element_size
    if input_embeddings is None:
        return total
    tied = output_weight is not None and output_weight.data_ptr() == input_embeddings.data_ptr()
    return total if tied else total - input_embeddings.numel() * element_size


def verify_medians(steps: Iterable) -> dict[int, float]:
    """The median ``verify_s`` per verify size of ``steps`` (objects with ``step``, ``verify_tokens`` and
    ``verify_s``: rows of steps.parquet), by the stall check's own rule (``stalls.VerifyTimes``: prefills and steps
    without times left out, sizes with fewer than ``stalls.MIN_SAMPLES`` steps too); a step no pass can have taken
    (no tokens, no time) is left out as well."""
    times = VerifyTimes()
    times.add(step for step in steps if step.verify_tokens >= 1 and not (step.verify_s is not None
                                                                          and step.verify_s <= 0))
    return times.medians()


def cost_curve(verify_s_by_size: dict[int, float], ar_pass_s: float | None, bytes_per_pass: int,
               bandwidth: dict | None) -> dict:
    """summary.json's ``cost_curve``: the method's t(q) per verify size, each over AR's pass (what a method's step
    costs against the step it replaces: the ratio a speedup divides MAT by; None without AR), AR's pass, the
    floor (bytes per pass over bandwidth) and AR's pass over it (None where either is unknown)."""
    floor_s = bytes_per_pass / bandwidth["bytes_per_s"] if bandwidth and bytes_per_pass > 0 else None
    return {
        "verify_s": {str(size): seconds for size, seconds in verify_s_by_size.items()},
        "relative_to_ar_pass": ({str(size): seconds / ar_pass_s for size, seconds in verify_s_by_size.items()}
                                if ar_pass_s else None),
        "ar_pass_s": ar_pass_s,
        "bytes_per_pass": bytes_per_pass or None,
        "bandwidth_bytes_per_s": bandwidth["bytes_per_s"] if bandwidth else None,
        "bandwidth_key": bandwidth["key"] if bandwidth else None,
        "floor_s": floor_s,
        "ar_pass_over_floor": ar_pass_s / floor_s if ar_pass_s and floor_s else None,
    }


def describe_curve(curve: dict) -> str | None:
    """One line for the console and the report: AR's pass against the floor and t(q) over AR's pass; None when
    neither is known."""
    parts = []
    if curve.get("ar_pass_over_floor"):
        parts.append(f"AR's pass {curve['ar_pass_s'] * 1000:.1f} ms, {curve['ar_pass_over_floor']:.1f}x the machine's "
                     f"floor ({curve['floor_s'] * 1000:.1f} ms: {curve['bytes_per_pass'] / 1e6:.0f} MB of weights at "
                     f"{curve['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)")
    relative = curve.get("relative_to_ar_pass")
    if relative:
        parts.append("verify of q tokens over AR's pass: " + " ".join(f"{size}:{ratio:.2f}"
                                                                      for size, ratio in relative.items()))
    return "; ".join(parts) or None
