"""LongSpec's drafter (sail-sg/LongSpec @15e4998, ``longspec/test/llama_glide.py``): one decoder layer as wide as
the target, with a sliding-window self-attention over its own cache and a cross-attention to the target's
last-layer keys and values, the target's embedding in and the target's lm_head out.

The layer (``LlamaGlideDecoderLayer``, llama_glide.py:372-468), in order: input RMS norm, self-attention (q/k/v
projections with biases, rotary at the token's position, a window of 512 earlier positions: flash-attention's
``window_size=(512, -1)``), residual; ``post_self_attention_layernorm``, cross-attention (only the query is
projected, with a bias, and rotated; keys and values are the target's cached ones, already rotated), residual;
``post_cross_attention_layernorm``, the MLP (SiLU-gated), residual. No final norm: the target's lm_head reads the
layer's output as it is. ``head_dim`` is hidden_size / num_attention_heads (GlideAttention's own rule, :30).

A one-layer model's self-attention keys and values depend on the token's embedding and position alone, so the
drafter's cache of a sequence is the same whatever the cross-attention saw; only the rows whose logits are read
need the whole layer (``LongSpecHead.forward``).

The published drafters (``sail/longspec-vicuna-7b-v1.5-16k`` and others) are Hugging Face folders of that layer:
a Llama ``config.json`` and its weights under the names below (``EXPECTED``); their ``cross_attn.k_proj`` and
``v_proj`` are never used (LongSpec reads the target's cache instead) and are ignored. specbench writes its own
trained drafters in the same form.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specbench.errors import SpecbenchError
from specbench.heads.eagle_head_files import _head_directory, _listed, _read_config, _read_weights, _write_weights
from specbench.heads.eagle_heads import RMSNorm  # Llama's, as LongSpec's layer uses (LlamaRMSNorm)
from specbench.targets.layer_keys import rotate_half
from specbench.storage.atomic import write_atomically
from specbench.storage.refusal import refusing_writes

log = logging.getLogger(__name__)
WHAT = "LongSpec drafter"
WINDOW = 512  # llama_glide.py:199, 227, 262, 300: window_size=(512, -1)
INITIALIZER_RANGE = 0.02  # LlamaConfig's initializer_range, which _init_weights draws with (:412-420)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "draft_model_weights.pth")
WEIGHTS = "model.safetensors"
# The cross-attention's key/value projections exist in the published files but LongSpec never calls them.
UNUSED = ("cross_attn.k_proj.weight", "cross_attn.k_proj.bias", "cross_attn.v_proj.weight", "cross_attn.v_proj.bias")
# Prefixes a training checkpoint may carry (LongSpec's train copy names the layer draft_model, the test copy glide).
PREFIXES = ("draft_model.", "glide.")


@dataclass(frozen=True)
class GlideConfig:
    """The drafter layer's shape, which must be its target's (it reads the target's cache and embeddings)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float
    verifier: str | None = None  # the target it was trained for, when its config says

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def as_dict(self) -> dict:
        """config.json of the layer, as LongSpec's ``LlamaGlideDecoderLayer.save_pretrained`` would write it (a
        LlamaConfig of one layer), with the target it was trained for."""
        return {"architectures": ["LlamaGlideDecoderLayer"], "model_type": "llama", "hidden_act": "silu",
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
                "num_hidden_layers": 1, "rms_norm_eps": self.rms_norm_eps, "initializer_range": INITIALIZER_RANGE,
                "torch_dtype": "float32", **({"verifier": self.verifier} if self.verifier else {})}


def glide_config_for(target) -> GlideConfig:
    """The layer shape of ``target`` (a LoadedModel): what a drafter for it must have."""
    text = target.weights.architecture
    heads = int(text["num_attention_heads"])
    return GlideConfig(int(text["hidden_size"]), int(text["intermediate_size"]), heads,
                       int(text.get("num_key_value_heads") or heads), float(text.get("rms_norm_eps", 1e-6)),
                       str(target.source))


class GlideAttention(nn.Module):
    """The self-attention (q, k, v, o) or, ``cross``, the cross-attention (q and o: LongSpec's cross-attention
    reads the target's keys and values as they are)."""

    def __init__(self, config: GlideConfig, cross: bool):
        super().__init__()
        width, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        head_dim = config.head_dim
        self.q_proj = nn.Linear(width, heads * head_dim, bias=True)
        if not cross:
            self.k_proj = nn.Linear(width, kv * head_dim, bias=True)
            self.v_proj = nn.Linear(width, kv * head_dim, bias=True)
        self.o_proj = nn.Linear(heads * head_dim, width, bias=False)


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [B, n, heads, d] turned by the rotary angles ``cos``/``sin`` [B, n, d]."""
    return x * cos[:, :, None] + rotate_half(x) * sin[:, :, None]


def attend(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: ``queries`` [B, n, heads, d] over ``keys``/``values`` [B, kv_heads, S, d], each
    query seeing the keys ``visible`` [B, n, S] marks; a query that sees none gets zeros (as LongSpec's training
    pads the cross-attention's first rows). Softmax in float32. Returns [B, n, heads * d]."""
    count, n, heads, head_dim = queries.shape
    kv_heads = keys.shape[1]
    grouped = queries.transpose(1, 2).reshape(count, kv_heads, heads // kv_heads, n, head_dim)
    scores = torch.einsum("bkgnd,bksd->bkgns", grouped, keys).float() / math.sqrt(head_dim)
    mask = visible[:, None, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    any_visible = mask.any(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~any_visible, 0.0), dim=-1) * any_visible
    out = torch.einsum("bkgns,bksd->bkgnd", weights.to(values.dtype), values)
    return out.reshape(count, heads, n, head_dim).transpose(1, 2).reshape(count, n, heads * head_dim)


class LongSpecHead(nn.Module):
    """The drafter layer. The target's embedding, lm_head and last-layer cache recomputation are attached by
    ``attach`` and held outside the module's parameters (frozen, never saved)."""

    def __init__(self, config: GlideConfig):
        super().__init__()
        self.config = config
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = GlideAttention(config, cross=False)
        self.post_self_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.cross_attn = GlideAttention(config, cross=True)
        self.post_cross_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = nn.ModuleDict({name: nn.Linear(a, b, bias=False) for name, a, b in (
            ("gate_proj", config.hidden_size, config.intermediate_size),
            ("up_proj", config.hidden_size, config.intermediate_size),
            ("down_proj", config.intermediate_size, config.hidden_size))})
        self._target: dict = {}

    # ---- the target's parts --------------------------------------------------------------------------------

    def attach(self, embedding: torch.Tensor, output_weight: torch.Tensor, target_keys_values) -> LongSpecHead:
        """Give the head the target's input ``embedding`` [vocab, hidden], its lm_head's ``output_weight``
        [vocab, hidden] (both plain tensors without gradients: they are the target's, never trained) and its last
        layer's cache recomputation (``targets.layer_keys.LayerKeysValues``, also the rotary embedding)."""
        self._target = {"embedding": embedding.detach(), "output": output_weight.detach(), "kv": target_keys_values}
        return self

    def embed(self, token_ids: torch.LongTensor) -> torch.Tensor:
        embedding = self._target["embedding"]
        return F.embedding(token_ids.to(embedding.device), embedding).to(self.input_layernorm.weight.dtype)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """The target's lm_head over the layer's output ``out`` [..., hidden] (no final norm: LongSpec has none)."""
        weight = self._target["output"]
        return F.linear(out.to(weight.dtype), weight)

    def rotary(self, positions: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._target["kv"].rotary(positions, self.input_layernorm.weight.dtype)

    def target_entries(self, hidden: torch.Tensor, positions: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's last-layer keys/values [..., kv_heads, n, d] from its last layer's input ``hidden``."""
        keys, values = self._target["kv"](hidden, positions)
        dtype = self.input_layernorm.weight.dtype
        return keys.to(dtype), values.to(dtype)

    # ---- the layer -----------------------------------------------------------------------------------------

    def self_entries(self, embeddings: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The self-attention's keys/values [B, kv_heads, n, d] of tokens with ``embeddings`` [B, n, hidden] at the
        angles ``cos``/``sin`` [B, n, d]: all the drafter's cache holds of them."""
        count, n, _ = embeddings.shape
        kv, head_dim = self.config.num_key_value_heads, self.config.head_dim
        x = self.input_layernorm(embeddings)
        keys = rotated(self.self_attn.k_proj(x).view(count, n, kv, head_dim), cos, sin)
        values = self.self_attn.v_proj(x).view(count, n, kv, head_dim)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def forward(self, embeddings: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, self_keys: torch.Tensor,
                self_values: torch.Tensor, self_visible: torch.Tensor, target_keys: torch.Tensor,
                target_values: torch.Tensor, target_visible: torch.Tensor) -> torch.Tensor:
        """The layer's output [B, n, hidden] for queries ``embeddings`` [B, n, hidden] at angles ``cos``/``sin``,
        self-attending to ``self_keys``/``self_values`` [B, kv_heads, S, d] (their own entries among them) where
        ``self_visible`` [B, n, S], and cross-attending to the target's ``target_keys``/``target_values``
        [B, kv_heads, L, d] where ``target_visible`` [B, n, L]."""
        count, n, _ = embeddings.shape
        heads, head_dim = self.config.num_attention_heads, self.config.head_dim
        x = self.input_layernorm(embeddings)
        queries = rotated(self.self_attn.q_proj(x).view(count, n, heads, head_dim), cos, sin)
        hidden = embeddings + self.self_attn.o_proj(attend(queries, self_keys, self_values, self_visible))
        x = self.post_self_attention_layernorm(hidden)
        queries = rotated(self.cross_attn.q_proj(x).view(count, n, heads, head_dim), cos, sin)
        hidden = hidden + self.cross_attn.o_proj(attend(queries, target_keys, target_values, target_visible))
        x = self.post_cross_attention_layernorm(hidden)
        mlp = self.mlp
        return hidden + mlp["down_proj"](F.silu(mlp["gate_proj"](x)) * mlp["up_proj"](x))


def expected_keys(config: GlideConfig) -> set[str]:
    with torch.device("meta"):
        return set(LongSpecHead(config).state_dict())


def new_longspec_head(config: GlideConfig, generator: torch.Generator) -> LongSpecHead:
    """A head initialised as LongSpec's training initialises its layer (``post_init`` -> ``_init_weights``,
    llama_glide.py:412-420): every linear weight from N(0, 0.02), biases 0, norms 1; float32 on the host."""
    head = LongSpecHead(config)
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, INITIALIZER_RANGE, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
    return head


def _count(config: dict, name: str, source: str) -> int:
    value = config.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecbenchError(f"{WHAT} {source}: config.json {name} must be a positive integer, got {value!r}")
    return value


def read_glide_config(raw: dict, source: str) -> GlideConfig:
    heads = _count(raw, "num_attention_heads", source)
    config = GlideConfig(_count(raw, "hidden_size", source), _count(raw, "intermediate_size", source), heads,
                         int(raw.get("num_key_value_heads") or heads), float(raw.get("rms_norm_eps", 1e-6)),
                         raw.get("verifier") if isinstance(raw.get("verifier"), str) else None)
    if config.hidden_size % heads or heads % config.num_key_value_heads:
        raise SpecbenchError(f"{WHAT} {source}: config.json's hidden_size {config.hidden_size}, "
                             f"num_attention_heads {heads} and num_key_value_heads {config.num_key_value_heads} do "
                             "not divide")
    return config


def check_fits(config: GlideConfig, target, source: str) -> None:
    """A drafter reads its target's cache and embeddings: every width must be the target's. One line naming the
    first that differs, and the published drafters' targets."""
    wanted = glide_config_for(target)
    for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size"):
        have, need = getattr(config, name), getattr(wanted, name)
        if have != need:
            raise SpecbenchError(
                f"{WHAT} {source} was trained for another target ({name} {have}; {target.name} has {need}): a "
                f"LongSpec drafter reads its own target's cache; choose the one trained for {target.name} "
                f"(drafter.heads_by_model) or train one (python -m specbench.prepare drafter=longspec "
                f"model={target.name})")


def load_longspec_head(target, source: str, revision: str | None = None) -> LongSpecHead:
    """The drafter layer in ``source`` (a local directory or a hub id, the local Hugging Face cache first), checked
    against ``target`` and attached to it, on its device and dtype, frozen."""
    directory = _head_directory(str(source), revision, WHAT)
    config = read_glide_config(_read_config(directory, source, WHAT), source)
    file = next((directory / name for name in WEIGHT_FILES if (directory / name).is_file()), None)
    if file is None:
        raise SpecbenchError(f"{WHAT} {source} has no weights in {directory}: expected {' or '.join(WEIGHT_FILES)}")
    state = _read_weights(file, source, WHAT)
    for prefix in PREFIXES:
        if state and all(key.startswith(prefix) for key in state):
            state = {key[len(prefix):]: value for key, value in state.items()}
    state = {key: value for key, value in state.items() if key not in UNUSED and not key.endswith("inv_freq")}
    check_fits(config, target, source)
    expected = expected_keys(config)
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        parts = ([f"missing {_listed(missing)}"] if missing else []) + \
                ([f"unexpected {_listed(unexpected)}"] if unexpected else [])
        raise SpecbenchError(f"{WHAT} {source} is not a LongSpec layer: {'; '.join(parts)}")
    with torch.device("meta"):
        head = LongSpecHead(config)
    for key, value in state.items():
        shape = tuple(head.state_dict()[key].shape)
        if tuple(value.shape) != shape:
            raise SpecbenchError(f"{WHAT} {source}: {key} is {list(value.shape)}, expected {list(shape)}")
    head.load_state_dict({key: value.float() for key, value in state.items()}, strict=True, assign=True)
    head.to(device=target.device, dtype=target.weights.dtype)
    head.eval()
    head.requires_grad_(False)
    if config.verifier and Path(config.verifier).name != Path(str(target.source)).name:
        log.warning("%s %s was trained for %s, but the target is %s (%s); its drafts may be poor", WHAT, source,
                    config.verifier, target.name, target.source)
    return attach_to(head, target)


def attach_to(head: LongSpecHead, target, dtype: torch.dtype | None = None) -> LongSpecHead:
    """``head`` given ``target``'s embedding, lm_head weight and last-layer cache recomputation, on the head's
    device, in ``dtype`` (None: as the target holds them; shared, not copied, where they are plain tensors)."""
    from specbench.targets.layer_keys import plain_weight

    weights = target.weights
    device = head.input_layernorm.weight.device
    keys_values = weights.layer_keys_values(weights.num_layers - 1).to(device=device, dtype=dtype)
    embedding = weights.input_embeddings()
    embedding = (embedding.full_tensor() if hasattr(embedding, "full_tensor") else embedding).detach()
    output = plain_weight(weights.output_layer())
    return head.attach(embedding.to(device, dtype), output.to(device, dtype), keys_values)


def save_longspec_head(head: LongSpecHead, directory: str | Path) -> None:
    """Write ``head`` into ``directory`` as LongSpec's published drafters are (config.json and the layer's
    weights), each file through a temporary name and a rename."""
    directory = Path(directory)
    with refusing_writes(directory):
        directory.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().to("cpu", torch.float32).contiguous() for key, value in head.state_dict().items()}
    write_atomically(directory / "config.json",
                     lambda partial: partial.write_text(json.dumps(head.config.as_dict(), indent=2) + "\n"))
    write_atomically(directory / WEIGHTS, lambda partial: _write_weights(state, partial))
