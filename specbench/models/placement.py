"""Where a model's weights go: one device (``run.device``), layers spread over the visible GPUs by accelerate
(``model.device_map``), or one shard per process by transformers' tensor parallelism (``model.tp_plan``, one
process per device under ``torchrun``). The sharding is done by those engines as the model loads; specbench's
loop only learns which devices to fence (``specbench.targets.transformers``)."""

from __future__ import annotations

import math
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
    name: str = ""  # the model's, for the messages

    @property
    def placed_by_loader(self) -> bool:
        return self.kind != "single"

    def check_shapes(self, config) -> None:
        """Refuse, before the weights load, a model whose shapes this job's processes cannot split evenly:
        transformers' tensor-parallel plans shard the attention heads, the key/value heads and the vocabulary
        (embeddings and output layer) over the processes. ``config``: the model's transformers config."""
        if self.kind != "tensor_parallel":
            return
        processes = world_size()
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = getattr(text, "num_attention_heads", None)
        shapes = {"num_attention_heads": heads,
                  "num_key_value_heads": getattr(text, "num_key_value_heads", None) or heads,
                  "vocab_size": getattr(text, "vocab_size", None)}
        shapes = {key: int(value) for key, value in shapes.items() if isinstance(value, int) and value > 0}
        uneven = {key: value for key, value in shapes.items() if value % processes}
        if not uneven:
            return
        common = math.gcd(*shapes.values())
        counts = [count for count in range(2, min(common, 64) + 1) if common % count == 0][:8]
        fits = (f"run {' or '.join(map(str, counts))} processes (--nproc-per-node), which divide them all"
                if counts else "its shapes have no common divisor above 1, so it cannot be split; run one process "
                               "with model.tp_plan=null (or model.device_map over GPUs)")
        named = ", ".join(f"{key}={value}" for key, value in uneven.items())
        raise SpecbenchError(f"model {self.name!r}: tensor parallelism over {processes} processes cannot split its "
                             f"{named}: {fits}")


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
        return Placement("tensor_parallel", {"tp_plan": "auto"}, name)
    if device_map is not None:
        if world_size() > 1:
            raise SpecbenchError("model.device_map spreads one process's model over devices; under torchrun use "
                                 "model.tp_plan=auto instead")
        device_map = _plain(device_map)
        if isinstance(device_map, dict):
            refuse_offload(device_map, f"model.device_map={device_map}")
        if device_map != "cpu" and not torch.cuda.is_available():
            # accelerate would quietly keep every layer on the CPU: no silent CPU run of a placed model.
            raise SpecbenchError(f"model.device_map={device_map!r} places layers on GPUs, but torch sees none; use "
                                 "model.device_map=null (or model.device_map=cpu to check the wiring)")
        return Placement("device_map", {"device_map": device_map}, name)
    return Placement("single", {}, name)


OFFLOAD_DEVICES = ("cpu", "disk")


def refuse_offload(device_map: dict, what: str) -> None:
    """Refuse, in one line naming them, modules that a map of module -> device puts on the CPU or disk beside
    modules on GPUs (or on disk at all): accelerate would load them as ``meta`` tensors that fail in the forward
    pass, or copy them over PCIe at every pass, which the timings would then measure. A map of the CPU alone
    (``device_map=cpu``, the wiring check) is allowed."""
    devices = {str(module) or "(the whole model)": str(device) for module, device in device_map.items()}
    offloaded = [module for module, device in devices.items() if device in OFFLOAD_DEVICES]
    on_gpus = [module for module, device in devices.items() if device not in OFFLOAD_DEVICES]
    if not offloaded or not (on_gpus or "disk" in devices.values()):
        return
    named = ", ".join(f"{module} ({devices[module]})" for module in offloaded[:6])
    more = f" and {len(offloaded) - 6} more" if len(offloaded) > 6 else ""
    raise SpecbenchError(f"{what} offloads {named}{more} to the CPU or disk, which fails on meta tensors or times "
                         "PCIe copies: give every module a GPU (more or larger GPUs, a smaller dtype or model) or use "
                         "model.device_map=null (one device) or cpu (the wiring check)")


def check_loaded_placement(model: torch.nn.Module) -> None:
    """After accelerate placed ``model`` (``device_map=auto``/``balanced`` decide as they load): no module
    offloaded (``refuse_offload``)."""
    placed = getattr(model, "hf_device_map", None)
    if placed:
        refuse_offload(placed, "accelerate's placement (model.device_map)")


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
    placement.check_shapes(model.config)
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


def report_shards(model: torch.nn.Module) -> dict[str, dict]:
    """What each process of a tensor-parallel job holds of the first layer's weights, the embeddings and the
    output layer: ``{name: {"full": shape, "local": [shape on rank 0, on rank 1, ...]}}``, gathered from every
    process (each must call it) and logged by rank 0, so that a run shows its model was split, not copied."""
    import json
    import logging

    mine = {name: (list(parameter.shape), list(parameter.to_local().shape))
            for name, parameter in model.named_parameters()
            if hasattr(parameter, "to_local") and ("layers." not in name or ".layers.0." in name)}
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, mine)
    shards = {name: {"full": full, "local": [each.get(name, (None, None))[1] for each in gathered]}
              for name, (full, _) in mine.items()}
    logging.getLogger("specbench").info("tensor-parallel shards: %s", json.dumps(shards, separators=(",", ":")))
    return shards
