"""Turning the ``run.device`` and ``model.dtype`` settings into torch devices and dtypes, and telling a GPU
that torch cannot use from no GPU at all.

A GPU job must never run on the CPU without a word: ``run.device=cuda`` (or ``cuda:N``) that torch cannot give
is a one-line error naming the reason; ``run.device=auto`` on a machine whose driver (``nvidia-smi -L``) lists
GPUs that torch cannot use runs on the CPU with a warning naming the fix, and the run records those GPUs
(``environment()``'s ``gpus_not_used``; a flag under the summary table).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import torch

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CUDA_TORCH_FIX = "SPECBENCH_TORCH=cuda ./setup.sh, or install a CUDA build of torch"


def resolve_device(device: str) -> torch.device:
    """The torch device of ``run.device``: auto (the first visible GPU if torch can use one, else the CPU),
    cpu, cuda or cuda:N; refused with one line when torch cannot give it."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        unused = gpus_listed_by_driver()
        if unused:
            log.warning("run.device=auto runs on the CPU although nvidia-smi lists %d GPU(s) (%s): %s; "
                        "run.device=cpu runs on the CPU without this warning", len(unused), "; ".join(unused),
                        why_no_cuda(unused))
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise SpecbenchError(f"run.device={device!r} is not a device: use auto, cpu, cuda or cuda:N") from error
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecbenchError(f"run.device={device!r}, but torch sees no CUDA device: "
                                 f"{why_no_cuda(gpus_listed_by_driver())}; use run.device=cpu")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise SpecbenchError(f"run.device={device!r}, but torch sees {count} CUDA device(s) (cuda:0 to "
                                 f"cuda:{count - 1}; CUDA_VISIBLE_DEVICES={_visible_devices()}); choose one of them")
    return resolved


def why_no_cuda(listed: list[str]) -> str:
    """Why torch has no CUDA device, in a few words, given the GPUs the driver lists (``gpus_listed_by_driver``)."""
    listing = f"nvidia-smi lists {len(listed)} GPU(s)" if listed else "nvidia-smi lists no GPU"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build ({listing}; for a GPU: {CUDA_TORCH_FIX})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU ({listing})"
    if listed:
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use them ({listing}; is the driver "
                f"older than CUDA {torch.version.cuda} needs? CUDA_VISIBLE_DEVICES={_visible_devices()})")
    return f"this machine has no GPU that torch {torch.__version__} (CUDA {torch.version.cuda}) can use ({listing})"


def gpus_listed_by_driver() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists ("GPU 0: NVIDIA H200 (UUID: ...)", UUIDs left out), whatever torch
    sees and whatever CUDA_VISIBLE_DEVICES hides; empty without nvidia-smi or when it fails."""
    output = nvidia_smi("-L")
    if output is None:
        return []
    return [line.split(" (UUID", 1)[0].strip() for line in output.splitlines() if line.startswith("GPU ")]


def driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (the first GPU's), or None without nvidia-smi."""
    output = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    return lines[0] if lines else None


def nvidia_smi(*arguments: str) -> str | None:
    """nvidia-smi's standard output for ``arguments``, or None when it is missing, fails or hangs."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return None
    try:
        result = subprocess.run([program, *arguments], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def _visible_devices() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "unset (every GPU of the machine)" if visible is None else repr(visible)


def resolve_dtype(dtype: str, device: torch.device, checkpoint: torch.dtype | None = None) -> torch.dtype:
    """``auto`` is float32 on a CPU, where half precision is slow and, for lossless checks, not exact; on a GPU,
    the half precision the checkpoint was saved in (``checkpoint``, from its config): float16 for Vicuna and
    Llama-2 (as Spec-Bench runs them), bfloat16 for Llama-3 and Qwen, whose activations overflow float16; float16
    when the checkpoint names neither (a float32 checkpoint, a GGUF file), as Spec-Bench runs every model."""
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        if checkpoint == torch.bfloat16:
            if not torch.cuda.is_bf16_supported():
                log.warning("the checkpoint is bfloat16, which this GPU does not support: running it in float16, "
                            "which may overflow (a run whose logits are not finite stops)")
                return torch.float16
            return torch.bfloat16
        return torch.float16
    if dtype not in DTYPES:
        raise SpecbenchError(f"model.dtype={dtype!r} is not supported; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def checkpoint_dtype(config) -> torch.dtype | None:
    """The dtype a transformers config says its checkpoint was saved in (``dtype``, ``torch_dtype`` before
    transformers 5; a string or a torch dtype), or None when it says none that specbench knows."""
    for holder in (config, getattr(config, "get_text_config", lambda: None)()):
        for key in ("dtype", "torch_dtype"):
            value = getattr(holder, key, None) if holder is not None else None
            if isinstance(value, torch.dtype):
                return value
            if isinstance(value, str) and value.removeprefix("torch.") in DTYPES:
                return DTYPES[value.removeprefix("torch.")]
    return None
