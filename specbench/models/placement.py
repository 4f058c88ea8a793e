"""Where a model's weights go: one device (``run.device``), layers spread over the visible GPUs by accelerate
(``model.device_map``), or one shard per process by transformers' tensor parallelism (``model.tp_plan``, one
process per device under ``torchrun``). The sharding is done by those engines as the model loads; specbench's
loop only learns which devices to fence (``specbench.targets.transformers``)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import torch

from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class Placement:
    """``kind``: single, device_map or tensor_parallel; ``load_kwargs``: what ``from_pretrained`` is given."""

    kind: str
    load_kwargs: dict

    @property
    def placed_by_loader(self) -> bool:
        return self.kind != "single"


def world_size() -> int:
    """Processes of this job as torchrun counts them (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank (0 outside torchrun): rank 0 alone writes results."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def choose_placement(name: str, tp_plan: str | None, device_map, device: torch.device) -> Placement:
    """The placement asked for by a model config, checked before anything is loaded."""
    if tp_plan is not None and device_map is not None:
        raise SpecbenchError(f"model {name!r}: set model.tp_plan or model.device_map, not both")
    if tp_plan is not None:
        if tp_plan != "auto":
            raise SpecbenchError(f"model.tp_plan={tp_plan!r} is not supported; use auto (the model's own plan) or null")
        if world_size() < 2:
            raise SpecbenchError(f"model.tp_plan=auto shards the model over processes, one per device, and this job has "
                                 f"{world_size()}: run it under torchrun with two or more, e.g. "
                                 "`torchrun --nproc-per-node 2 -m specbench model.tp_plan=auto ...`")
        return Placement("tensor_parallel", {"tp_plan": "auto"})
    if device_map is not None:
        if world_size() > 1:
            raise SpecbenchError("model.device_map spreads one process's model over devices; under torchrun use "
                                 "model.tp_plan=auto instead")
        if device_map != "cpu" and not torch.cuda.is_available():
            # accelerate would quietly keep every layer on the CPU: no silent CPU run of a placed model.
            raise SpecbenchError(f"model.device_map={device_map!r} places layers on GPUs, but torch sees none; use "
                                 "model.device_map=null (or model.device_map=cpu to check the wiring)")
        return Placement("device_map", {"device_map": _plain(device_map)})
    return Placement("single", {})


def _plain(device_map):
    """An OmegaConf mapping of module -> device as a plain dict (accelerate checks its type)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(device_map, DictConfig):
            return OmegaConf.to_container(device_map)
    except ImportError:  # the GPU check runs without omegaconf
        pass
    return device_map


def load_placed(model: torch.nn.Module, placement: Placement, dtype: torch.dtype) -> torch.nn.Module:
    """A model built in memory (tiny-random), loaded again through ``from_pretrained`` with ``placement``'s
    arguments: tensor parallelism and device_map are properties of loading in transformers."""
    if not placement.placed_by_loader:
        return model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="specbench-placed-") as directory:
        # Written by hand: save_pretrained writes on rank 0 alone once a process group exists, and every
        # process needs its own copy to load its shard from.
        model.config.save_pretrained(directory)
        state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
        save_file(state, f"{directory}/model.safetensors", metadata={"format": "pt"})
        return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="sdpa",
                                                    **placement.load_kwargs)
