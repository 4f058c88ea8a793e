"""GPU memory of one answer: its peak, and the figures recorded when a question runs out of memory.

Figures are torch's caching-allocator statistics in bytes, over the CUDA devices the target uses (a CPU
device contributes nothing, so on a CPU every function returns None). "Allocated" counts every live tensor on
the device, the model's weights and a draft model's included, so a peak is what the answer needed in all.
"""

from __future__ import annotations

import gc

import torch

# torch's out-of-memory error: torch.OutOfMemoryError from torch 2.5, of which torch.cuda.OutOfMemoryError is the
# CUDA name (the only one before).
OUT_OF_MEMORY_ERRORS = (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError)


def _cuda(devices) -> list[torch.device]:
    return sorted({torch.device(device) for device in devices if torch.device(device).type == "cuda"}, key=str)


def reset_peak(devices) -> None:
    """Start counting a new peak on every CUDA device in ``devices`` (nothing on a CPU)."""
    for device in _cuda(devices):
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(devices) -> int | None:
    """The highest memory allocated on any CUDA device in ``devices`` since ``reset_peak``: the device that
    runs out first; None on a CPU."""
    cuda = _cuda(devices)
    if not cuda:
        return None
    return max(int(torch.cuda.max_memory_allocated(device)) for device in cuda)


def memory_figures(devices) -> dict[str, dict[str, int]] | None:
    """Per CUDA device in ``devices``: allocated, reserved, peak (since ``reset_peak``) and total bytes, read
    while the tensors of a failed step are still alive; None on a CPU."""
    cuda = _cuda(devices)
    if not cuda:
        return None
    return {str(device): {"allocated_bytes": int(torch.cuda.memory_allocated(device)),
                          "reserved_bytes": int(torch.cuda.memory_reserved(device)),
                          "peak_bytes": int(torch.cuda.max_memory_allocated(device)),
                          "total_bytes": int(torch.cuda.get_device_properties(device).total_memory)}
            for device in cuda}


def release_cached_memory(devices) -> None:
    """After an out-of-memory error has been handled (its traceback, which keeps the failed step's tensors alive,
    dropped): collect what is left and hand the allocator's cached blocks back, so the next question starts from
    the memory the model itself holds."""
    if not _cuda(devices):
        return
    gc.collect()
    torch.cuda.empty_cache()


def describe(figures: dict[str, dict[str, int]] | None) -> str:
    """``memory_figures`` in a few words: "cuda:0 peak 78.9 of 79.1 GiB (allocated 75.2, reserved 78.0)"."""
    if not figures:
        return "no CUDA memory figures"
    gib = 2**30
    return "; ".join(f"{device} peak {values['peak_bytes'] / gib:.1f} of {values['total_bytes'] / gib:.1f} GiB "
                     f"(allocated {values['allocated_bytes'] / gib:.1f}, reserved {values['reserved_bytes'] / gib:.1f})"
                     for device, values in figures.items())


PHASES = {"question": "", "warm-up": " in the warm-up", "calibration": " in the calibration of verify latency"}


def out_of_memory_record(error: BaseException, devices, question_id, decoded_by: str, prompt_tokens: int,
                         phase: str = "question") -> dict:
    """What skipped.jsonl keeps of a question that ran out of GPU memory: a one-line ``reason``, the
    ``memory_figures`` (None on a CPU), which decoder ran out (the drafter's name, ``ar`` for the baseline) and in
    which ``phase`` (its measured decode, or the untimed warm-up and calibration that run on the first pending
    question), the first turn's prompt length in tokens and torch's message."""
    figures = memory_figures(devices)
    message = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return {"reason": f"question {question_id} ran out of GPU memory while decoded by {decoded_by}{PHASES[phase]} "
                      f"({describe(figures)}; first turn {prompt_tokens} prompt tokens)",
            "memory": figures, "decoded_by": decoded_by, "phase": phase, "first_turn_prompt_tokens": prompt_tokens,
            "error": message}
