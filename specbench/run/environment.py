"""The software and machine a run runs on, as its summary and its run.json record them."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import specbench
from specbench.measure.machine import cpu_model_and_flags
from specbench.models.devices import driver_version, gpus_listed_by_driver, why_no_cuda
from specbench.run.locked_versions import versions_against_lock

if TYPE_CHECKING:
    from specbench.models import LoadedModel


def environment(model: LoadedModel) -> dict:
    """The software and machine a run runs on. On a GPU also: torch's CUDA version (``cuda``), the NVIDIA
    driver's (``cuda_driver``), how many CUDA devices the process sees (``cuda_device_count``,
    ``cuda_visible_devices``) and each GPU the target uses (``gpus``: name, memory, compute capability); those are
    None on a CPU. ``gpus_not_used`` names the GPUs nvidia-smi lists when the run is on the CPU because torch
    cannot use them, and why (None otherwise): the summary table flags it. ``versions_vs_lock``: every installed
    version that differs from the lock of this torch build (``specbench.run.locked_versions``), which the report
    shows."""
    import transformers

    device = model.device
    gpus = [used for used in model.devices if used.type == "cuda"]
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = _cpu_name()
    unused = None
    if not gpus and not torch.cuda.is_available():
        listed = gpus_listed_by_driver()
        unused = {"listed": listed, "reason": why_no_cuda(listed)} if listed else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "specbench": specbench.__version__,
        "device": f"{device.type}: {device_name}",
        "dtype": str(model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "git_sha": _git_sha(),
        "cuda": torch.version.cuda if gpus else None,
        "cuda_driver": _cuda_driver() if gpus else None,
        "cuda_device_count": torch.cuda.device_count() if gpus else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES") if gpus else None,
        "gpus": [_gpu_description(used) for used in gpus] if gpus else None,
        "gpus_not_used": unused,
        "versions_vs_lock": versions_against_lock(torch.version.cuda),
    }


def _gpu_description(device: torch.device) -> dict:
    properties = torch.cuda.get_device_properties(device)
    return {"device": str(device), "name": properties.name, "total_memory_bytes": int(properties.total_memory),
            "capability": f"{properties.major}.{properties.minor}"}


def _cuda_driver() -> str | None:
    """The NVIDIA driver's version from nvidia-smi; without it, the CUDA version the driver supports, as torch
    reads it ("CUDA 12.4 (driver API)")."""
    version = driver_version()
    if version is not None:
        return version
    try:
        api = int(torch._C._cuda_getDriverVersion())  # e.g. 12040; torch has no public name for it
    except (AttributeError, RuntimeError, ValueError):
        return None
    return f"CUDA {api // 1000}.{api % 1000 // 10} (driver API)" if api > 0 else None


def _cpu_name() -> str:
    return cpu_model_and_flags()[0] or platform.processor() or "unknown CPU"


def _git_sha() -> str | None:
    root = Path(specbench.__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None
