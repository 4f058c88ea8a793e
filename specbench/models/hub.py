"""The loader for a Hugging Face checkpoint: a local directory, or a hub id read from the local cache first."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.loaded import LoadedModel, finish_loading

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
) -> LoadedModel:
    """A model by local directory (``path``) or Hugging Face hub id (``hub_id``).

    A hub id is first looked up in the local Hugging Face cache, so runs work offline once the model has
    been downloaded; only when it is missing is the hub asked.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
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
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, attn_implementation="sdpa", **kwargs)
        return tokenizer, model

    try:
        tokenizer, model = load(local_only=True)
    except OSError as error:
        if path:
            raise SpecbenchError(f"model.path={path} does not hold a loadable model: {error}") from error
        if os.environ.get("HF_HUB_OFFLINE") == "1" or not _hub_reachable():
            raise SpecbenchError(_unavailable_message(name, hub_id)) from error
        log.info("%s is not in the local Hugging Face cache; downloading %s", name, hub_id)
        try:
            tokenizer, model = load(local_only=False)
        except Exception as download_error:  # any network or hub failure means the same to the user
            raise SpecbenchError(_unavailable_message(name, hub_id)) from download_error
    return finish_loading(name, model, tokenizer, prompt_format, system_message, torch_device, source, linear_backend,
                          family)


def _hub_reachable(timeout_s: float = 5.0) -> bool:
    """Whether a TCP connection to the hub opens quickly; the hub client itself retries for a minute or more
    before giving up, which is no way to learn that a machine is offline."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _unavailable_message(name: str, hub_id: str) -> str:
    return (
        f"model {name!r} ({hub_id}) is not available offline and the hub cannot be reached: download it where "
        f"it can (`hf download {hub_id}`) and copy the Hugging Face cache here, or pass model.path=/dir/of/checkpoint"
    )
