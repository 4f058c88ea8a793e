"""The loader for a Hugging Face checkpoint: a local directory, or a hub id read from the local cache first."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from specbench.storage.refusal import refusal_of
from specbench import hub_cache
from specbench.errors import SpecbenchError
from specbench.models.devices import checkpoint_dtype, resolve_device, resolve_dtype
from specbench.models.loaded import LoadedModel, check_loader_arguments, finish_loading
from specbench.models.placement import choose_placement
from specbench.targets.choice import target_builder

log = logging.getLogger(__name__)


def load_pretrained(
    name: str,
    hub_id: str | None = None,
    path: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    prompt_format: str = "chat_template",
    system_message: str | None = None,
    revision: str | None = None,
    linear_backend: str = "auto",
    family: str | None = None,
    tp_plan: str | None = None,
    device_map=None,
    chat_template_kwargs: dict | None = None,
    target=None,
) -> LoadedModel:
    """A model by local directory (``path``) or Hugging Face hub id (``hub_id``).

    A hub id is first looked up in the local Hugging Face cache, so runs work offline once the model has
    been downloaded; only when it is missing is the hub asked. ``chat_template_kwargs``: keywords for the
    tokenizer's chat template (``prompt_format=chat_template`` only), e.g. Qwen3's ``{enable_thinking: false}``.
    ``target``: the ``model.target`` node, the Target class built around the model (``specbench.targets.choice``;
    None: the transformers target).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    builder = target_builder(target)
    if path is not None and not str(path).strip():
        # An empty path would fall through to hub_id and fail there, with a message about something else.
        raise SpecbenchError(f"model {name!r}: its path is empty; give a checkpoint directory "
                             f"(model.path=/dir/of/checkpoint) or leave it null to load hub id {hub_id}")
    torch_device = resolve_device(device)
    resolve_dtype(dtype, torch_device)  # a bad name is refused before anything is read
    placement = choose_placement(name, tp_plan, device_map, torch_device)
    if path:
        source = str(Path(path).expanduser())
        if not Path(source).is_dir():
            raise SpecbenchError(f"model.path={path} is not a directory holding a model checkpoint")
    elif hub_id:
        source = hub_id
    else:
        raise SpecbenchError(f"model {name!r} needs model.hub_id or model.path")

    def load(local_only: bool):
        kwargs = dict(revision=revision, local_files_only=local_only)
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        # dtype auto follows the checkpoint's own precision on a GPU (bfloat16 models overflow float16).
        config = AutoConfig.from_pretrained(source, **kwargs)
        placement.check_shapes(config)  # shapes the processes cannot split, refused before the weights load
        saved_in = checkpoint_dtype(config)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=resolve_dtype(dtype, torch_device, saved_in),
                                                     attn_implementation="sdpa", **kwargs, **placement.load_kwargs)
        return tokenizer, model

    try:
        tokenizer, model = load(local_only=True)
    except Exception as error:  # from a directory the user named, any failure to load is the directory's
        if isinstance(error, SpecbenchError):  # a refusal of what was read (Placement.check_shapes) stands as it is
            raise
        if path:
            missing = _missing_checkpoint_parts(Path(source))
            if missing:  # the loaders' own message is about a tokenizer they could not build, not about the files
                raise SpecbenchError(f"model.path={path} holds no model ({missing}); {CHECKPOINT_FILES}") from error
            raise SpecbenchError(_unloadable_message(f"model.path={path}", Path(source), error)) from error
        if not isinstance(error, OSError):  # OSError: not in the cache; anything else may be a damaged copy
            snapshot = hub_cache.cached_snapshot(hub_id, revision)
            if snapshot is None or not _damaged_weight_files(snapshot):
                raise
            advice = f"download it again: `hf download {hub_id} --force-download`"
            raise SpecbenchError(_unloadable_message(f"model {name!r} ({hub_id})", snapshot, error, advice)) from error
        if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_cache.hub_reachable():
            raise SpecbenchError(_unavailable_message(name, hub_id)) from error
        log.info("%s is not in the local Hugging Face cache; downloading %s", name, hub_id)
        try:
            tokenizer, model = load(local_only=False)
        except Exception as download_error:  # any network or hub failure means the same to the user
            if isinstance(download_error, SpecbenchError):
                raise
            refusal = refusal_of(download_error)  # but a full or read-only Hugging Face cache is not offline
            if refusal is not None:
                raise refusal from download_error
            raise SpecbenchError(_unavailable_message(name, hub_id)) from download_error
    # Another engine reads the very files loaded here: the local directory, or the hub snapshot in the cache.
    checkpoint = source if path else str(hub_cache.cached_snapshot(hub_id, revision) or hub_id)
    return finish_loading(name, model, tokenizer, prompt_format, system_message, torch_device, source, linear_backend,
                          family, placement.kind, chat_template_kwargs, checkpoint=checkpoint, target=builder)


load_pretrained.check_arguments = check_loader_arguments  # config.check_group_values calls it before anything loads


CHECKPOINT_FILES = ("a checkpoint directory holds config.json, the weights (*.safetensors or pytorch_model*.bin) and "
                    "the tokenizer's files (tokenizer.json or tokenizer.model, with tokenizer_config.json), as "
                    "save_pretrained or `hf download HUB_ID --local-dir DIR` writes them")
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model", "*.tiktoken")


def _missing_checkpoint_parts(directory: Path) -> str | None:
    """What a directory that failed to load lacks of a checkpoint ("it is empty", "no config.json, no weights"),
    or None when it has every part (then a part is damaged)."""
    if not any(directory.iterdir()):
        return "it is empty"
    parts = {"config.json": ("config.json",), "weights": WEIGHT_FILES, "tokenizer files": TOKENIZER_FILES}
    missing = [f"no {part}" for part, patterns in parts.items()
               if not any(any(directory.glob(pattern)) for pattern in patterns)]
    return ", ".join(missing) or None


def _unloadable_message(what: str, directory: Path, error: Exception,
                        advice: str = "download or build the checkpoint again") -> str:
    """One line naming the damaged weight file when there is one (a truncated download, a full disk), else the
    loader's own error."""
    damaged = _damaged_weight_files(directory)
    if damaged:
        file, file_error = damaged[0]
        return f"{what}: weight file {file} is damaged or truncated ({_one_line(file_error)}); {advice}"
    return f"{what} does not hold a loadable model ({_one_line(error)})"


def _damaged_weight_files(directory: Path) -> list[tuple[Path, Exception]]:
    """The ``.safetensors`` files of ``directory`` that do not open; opening reads only the header and checks
    that the file is as long as the header says, so it is cheap and catches truncation."""
    from safetensors import safe_open

    damaged = []
    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as error:  # safetensors raises its own SafetensorError, or OSError for unreadable files
            damaged.append((file, error))
    return damaged


def _one_line(error: Exception, limit: int = 300) -> str:
    text = " ".join(str(error).split())
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _unavailable_message(name: str, hub_id: str) -> str:
    return (
        f"model {name!r} ({hub_id}) is not available offline and the hub cannot be reached: download it where "
        f"it can (`hf download {hub_id}`) and copy the Hugging Face cache here, or pass model.path=/dir/of/checkpoint"
    )
