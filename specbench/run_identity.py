"""How a run was placed, as its run.json records it: how many processes ran it (``processes``), how its target's
weights were placed (``placement``: single, device_map or tensor_parallel), the devices its target uses
(``devices``; under tensor parallelism rank 0's, each process using one of its own) and the linear kernels it
ran on (``linear_backend_used``: ``run.linear_backend=auto`` resolved, which depends on the dtype, the device
and the torch build).

Each of these changes timings without changing the configuration's other keys (two processes of a 2-way
tensor-parallel run, four GPUs of a ``device_map=auto`` instead of two), so each is part of the run's identity:
a resumed run must match them (``specbench.runner``) and analysis keeps runs that differ in them apart
(``analysis.runs``). Run directories written before these keys were recorded get what their other settings
imply (``implied_placement``), and ``UNRECORDED`` where they imply nothing.
"""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError

# Known before the model is loaded (checked before anything is loaded) ...
PLANNED_KEYS = ("processes",)
# ... and once it is.
LOADED_KEYS = ("placement", "devices", "linear_backend_used")
PLACEMENT_KEYS = PLANNED_KEYS + LOADED_KEYS
UNRECORDED = "unrecorded"


def planned_settings(world_size: int) -> dict:
    """The placement settings known before loading: this job's number of processes."""
    return {"processes": int(world_size)}


def loaded_placement(model) -> dict:
    """The placement settings of a loaded ``specbench.models.LoadedModel``."""
    return {"placement": model.placement, "devices": ",".join(str(device) for device in model.devices),
            "linear_backend_used": model.weights.linear_backend_used}


def unrecorded_refusal(output_dir: str | Path, earlier: dict) -> SpecbenchError | None:
    """The one-line refusal to resume a run directory whose run.json (``earlier``) predates the placement keys,
    or None when it records them all: whether this run is placed as that one was cannot be checked."""
    missing = [key for key in PLACEMENT_KEYS if key not in earlier]
    if not missing:
        return None
    return SpecbenchError(
        f"{output_dir} holds a run recorded before specbench kept how a run is placed (its run.json lacks "
        f"{', '.join(missing)}), so whether this run is placed as that one was cannot be checked and it cannot be "
        "resumed: choose another hydra.run.dir (python -m analysis still reads it, apart from runs that record "
        "their placement)")


def implied_placement(settings: dict) -> dict[str, str]:
    """For a run.json (either schema's layout) that lacks placement keys, what its other settings imply for
    them, as text; ``UNRECORDED`` where they imply nothing. Keys it records are not returned.

    Configs without ``tp_plan`` and ``device_map`` predate both: one process, one device. A tensor-parallel run
    did not record its process count, nor a placed run its devices. ``run.linear_backend=auto`` is aten on
    anything but a float32 model on one CPU, where it depended on the torch build."""
    model_config = settings.get("model_config")
    model_config = model_config if isinstance(model_config, dict) else {}
    run = settings.get("run") if isinstance(settings.get("run"), dict) else settings  # schema 2 kept run.* flat
    if model_config.get("tp_plan") is not None:
        kind = "tensor_parallel"
    elif model_config.get("device_map") is not None:
        kind = "device_map"
    else:
        kind = "single"
    device = settings.get("device")
    backend = run.get("linear_backend")
    if backend not in ("aten", "onednn"):
        dtype = settings.get("dtype")
        off_cpu_float32 = (kind != "single" or (device is not None and device != "cpu")
                           or (device == "cpu" and dtype not in (None, "float32")))
        backend = "aten" if off_cpu_float32 else UNRECORDED
    implied = {"processes": "1" if kind != "tensor_parallel" else UNRECORDED, "placement": kind,
               "devices": str(device) if kind == "single" and device is not None else UNRECORDED,
               "linear_backend_used": backend}
    return {key: value for key, value in implied.items() if key not in settings}
