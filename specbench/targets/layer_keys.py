"""What one decoder layer of a transformers target writes into its KV cache, recomputed from the layer's input.

LongSpec's drafter cross-attends to the target's last-layer keys and values, as they sit in the target's cache
(after the layer's input norm, its key/value projections, and, for keys, the rotary embedding of their positions).
specbench's Target interface hands drafters hidden states, not cache entries, so that every implementation (a
cache edited in place, the cache-free reference, a compiled graph, one shard per process) serves them alike; the
entries are the same function of the layer's input hidden state, so ``LayerKeysValues`` applies it: two
projections per settled token, against a pass of the whole model that produced the hidden state anyway.

The weights are frozen whole copies (under tensor parallelism the target holds shards; on oneDNN, packed
weights), and the rotary embedding is the target's own module, so every rope scaling it knows is applied as the
target applies it.
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.errors import SpecbenchError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def plain_weight(module: nn.Module, name: str = "weight") -> torch.Tensor | None:
    """A module's weight (or bias) as a plain dense tensor: the whole of a tensor-parallel shard, the dense form of
    a oneDNN-packed weight."""
    if name == "weight" and getattr(module, "packed_weight", None) is not None:
        return module.packed_weight.to_dense().detach()
    tensor = getattr(module, name, None)
    if tensor is None:
        return None
    tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return tensor.detach()


def _norm_epsilon(norm: nn.Module, what: str) -> float:
    if type(norm).__name__.startswith("Gemma"):  # Gemma scales by 1 + weight: another norm than Llama's
        raise SpecbenchError(f"{what} is a {type(norm).__name__}; LongSpec's drafter reads targets with Llama's RMS "
                             "norm (Llama, Vicuna, Qwen, Mistral)")
    for attribute in ("variance_epsilon", "eps"):
        value = getattr(norm, attribute, None)
        if isinstance(value, float):
            return value
    raise SpecbenchError(f"{what} ({type(norm).__name__}) names no epsilon specbench knows")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMS norm: computed in float32, scaled in the input's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


class LayerKeysValues(nn.Module):
    """Keys and values of decoder layer ``index`` of ``model`` (a transformers causal LM with Llama's layer
    layout: ``input_layernorm``, ``self_attn.k_proj``/``v_proj``, optionally Qwen3's per-head ``k_norm``), and the
    target's rotary embedding, which LongSpec's drafter also rotates its own queries and keys with.

    Example: for SmolLM2-135M (3 key/value heads of 64), ``kv(hidden [n, 576], positions [n])`` gives keys and
    values [3, n, 64] equal to the cache's entries of that layer at those positions."""

    def __init__(self, model: nn.Module, index: int):
        super().__init__()
        from specbench.targets.layer_skip import decoder_layers

        layers = decoder_layers(model)
        if not -len(layers) <= index < len(layers):
            raise SpecbenchError(f"decoder layer {index} asked for; the target has {len(layers)}")
        layer = layers[index]
        attention = layer.self_attn
        norm = getattr(layer, "input_layernorm", None)
        if norm is None or not hasattr(attention, "k_proj") or not hasattr(attention, "v_proj"):
            raise SpecbenchError(f"{type(model).__name__}'s decoder layers have no input_layernorm and k_proj/v_proj "
                                 "specbench knows: its cache entries cannot be recomputed")
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
        rotary_embedding = getattr(decoder, "rotary_emb", None)
        # not a submodule: moving or casting this module must never move or cast the target's own
        self.__dict__["rotary_embedding"] = rotary_embedding
        if rotary_embedding is None:
            raise SpecbenchError(f"{type(model).__name__} has no model-wide rotary embedding (rotary_emb) specbench "
                                 "knows")
        config = model.config.get_text_config()
        heads = int(config.num_attention_heads)
        self.num_key_value_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        self.norm_eps = _norm_epsilon(norm, "the target's input_layernorm")
        self.register_buffer("norm_weight", plain_weight(norm).clone(), persistent=False)
        for name in ("k", "v"):
            projection = getattr(attention, f"{name}_proj")
            self.register_buffer(f"{name}_weight", plain_weight(projection).clone(), persistent=False)
            bias = plain_weight(projection, "bias")
            self.register_buffer(f"{name}_bias", None if bias is None else bias.clone(), persistent=False)
        key_norm = getattr(attention, "k_norm", None)  # Qwen3 norms each head's key before the rotation
        self.key_norm_eps = None if key_norm is None else _norm_epsilon(key_norm, "the target's k_norm")
        self.register_buffer("key_norm_weight", None if key_norm is None else plain_weight(key_norm).clone(),
                             persistent=False)

    def rotary(self, positions: torch.LongTensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., head_dim] of ``positions`` ([...] int64) as the target computes them, in ``dtype``."""
        where = next(self.rotary_embedding.buffers(), positions).device  # the target's device
        flat = positions.reshape(1, -1).to(where)
        probe = torch.empty(0, device=where, dtype=torch.float32)  # computed in float32 and cast, as the target does
        cos, sin = self.rotary_embedding(probe, flat)
        shape = (*positions.shape, cos.shape[-1])
        return (cos.reshape(shape).to(positions.device, dtype), sin.reshape(shape).to(positions.device, dtype))

    @torch.no_grad()
    def forward(self, hidden: torch.Tensor, positions: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values [..., kv_heads, n, head_dim] of the layer's input ``hidden`` [..., n, hidden] at
        ``positions`` [..., n] (or [n])."""
        x = _rms_norm(hidden.to(self.norm_weight.dtype), self.norm_weight, self.norm_eps)
        shape = (*x.shape[:-1], self.num_key_value_heads, self.head_dim)
        keys = nn.functional.linear(x, self.k_weight, self.k_bias).view(shape)
        values = nn.functional.linear(x, self.v_weight, self.v_bias).view(shape)
        if self.key_norm_weight is not None:
            keys = _rms_norm(keys, self.key_norm_weight, self.key_norm_eps)
        cos, sin = self.rotary(positions.expand(x.shape[:-1]), keys.dtype)
        keys = keys * cos[..., None, :] + rotate_half(keys) * sin[..., None, :]
        return keys.transpose(-3, -2), values.transpose(-3, -2)
