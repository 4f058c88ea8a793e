"""Turning the ``run.device`` and ``model.dtype`` settings into torch devices and dtypes."""

from __future__ import annotations

import torch

from specbench.errors import SpecbenchError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise SpecbenchError(f"run.device={device!r} is not a device: use auto, cpu, cuda or cuda:N") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise SpecbenchError(f"run.device={device!r}, but torch sees no CUDA device; use run.device=cpu")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is float16 on a GPU (as Spec-Bench runs) and float32 on a CPU, where half precision is slow
    and, for lossless checks, not exact."""
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SpecbenchError(f"model.dtype={dtype!r} is not supported; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]
