"""EAGLE draft heads: the EAGLE-1/EAGLE-2 head ("eagle") and the EAGLE-3 head ("eagle3"), their KV cache, and
their checkpoints in three on-disk formats.

A head is one Llama-style decoder layer that reads the target's hidden states and drafts the next token:

- ``eagle`` (EAGLE-1 and EAGLE-2 share the weights): ``x = fc(cat(embed(token), feature))``, the target's last,
  post-norm hidden state as feature; the decoder layer has no input norm (attention runs on ``x`` itself, which is
  also the residual); no final norm; the draft logits are the *target's* ``lm_head(out)``.
- ``eagle3``: the features are the concatenated states of three target layers, fused by ``fc`` (3H -> h, no bias)
  when they come from the target, fed back as they are when they are the head's own output; the attention reads
  ``cat(input_layernorm(embed(token)), hidden_norm(hidden))`` (2h wide) while the residual is the un-normed
  ``hidden``; the head has its own ``norm`` and ``lm_head``, possibly over a reduced draft vocabulary that ``d2t``
  maps back to target ids by offset (``target_id = draft_id + d2t[draft_id]``).

Reading, checking and writing head directories in the three formats (``eagle``, ``eagle3``, ``speculators``) is
``specbench.heads.eagle_head_files``'s job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from specbench.errors import SpecbenchError
from specbench.targets.layer_keys import rotate_half  # noqa: F401  (hydra_heads imports it from here)

HEAD_KINDS = ("eagle", "eagle3")
FORMATS = ("eagle", "eagle3", "speculators")
FORMATS_OF_KIND = {"eagle": ("eagle",), "eagle3": ("eagle3", "speculators")}
# The drafters that run each kind of head, for messages that tell the user which one to choose.
DRAFTERS_OF_KIND = {"eagle": "drafter=eagle or drafter=eagle2", "eagle3": "drafter=eagle3"}
# EAGLE's code builds the head's rotary embedding with this base when the head's config names none.
DEFAULT_ROPE_THETA = 10000.0
# LlamaConfig's default, which EAGLE's configs inherit when they name no epsilon.
DEFAULT_RMS_NORM_EPS = 1e-6
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class HeadConfig:
    """The shape of a head and where it came from; see the module docstring for the two kinds."""

    kind: str                  # "eagle" (the EAGLE-1/EAGLE-2 head) or "eagle3"
    hidden_size: int           # the head's width h
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int              # usually hidden_size // num_attention_heads
    rms_norm_eps: float
    rope_theta: float          # the head config's own (EAGLE: 10000 when absent), not the target's
    rope_scaling: dict | None  # None, {"type"/"rope_type": "linear", "factor": f}, or llama3 (speculators only)
    vocab_size: int            # the target's vocabulary (rows of embed_tokens)
    draft_vocab_size: int      # eagle3: rows of its own lm_head (< vocab_size with d2t); eagle: == vocab_size
    target_hidden_size: int    # width of ONE target feature (the target's hidden size)
    feature_layers: tuple[int, ...] | None  # target layers it reads when the checkpoint says; None = not stated
    fc_bias: bool
    verifier: str | None       # the target the checkpoint names, else None
    format: str                # "eagle" | "eagle3" | "speculators": the format it was read from / is written in

    def __post_init__(self):
        if self.kind not in HEAD_KINDS:
            raise SpecbenchError(f"EAGLE head kind {self.kind!r} is unknown; choose one of {', '.join(HEAD_KINDS)}")
        if self.format not in FORMATS_OF_KIND[self.kind]:
            raise SpecbenchError(f"an {self.kind} head cannot be in format {self.format!r}; its formats: "
                                 f"{', '.join(FORMATS_OF_KIND[self.kind])}")
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "vocab_size", "draft_vocab_size", "target_hidden_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecbenchError(f"EAGLE head {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise SpecbenchError(f"EAGLE head num_key_value_heads={self.num_key_value_heads} must divide "
                                 f"num_attention_heads={self.num_attention_heads}")
        if self.head_dim % 2:  # rotary embeddings turn pairs of dimensions
            raise SpecbenchError(f"EAGLE head head_dim={self.head_dim} must be even for rotary embeddings")
        if self.draft_vocab_size > self.vocab_size:
            raise SpecbenchError(f"EAGLE head draft_vocab_size={self.draft_vocab_size} exceeds its vocab_size="
                                 f"{self.vocab_size} (the draft vocabulary is a subset of the target's)")
        if self.kind == "eagle" and self.draft_vocab_size != self.vocab_size:
            raise SpecbenchError(f"an eagle head drafts over the target's whole vocabulary ({self.vocab_size}); "
                                 f"draft_vocab_size={self.draft_vocab_size} needs kind eagle3")
        if self.kind == "eagle" and self.target_hidden_size != self.hidden_size:
            # its embedding is a copy of the target's, so it has the target's width
            raise SpecbenchError(f"an eagle head is as wide as its target: hidden_size={self.hidden_size} but "
                                 f"target_hidden_size={self.target_hidden_size}")
        for name in ("rope_theta", "rms_norm_eps"):
            if not _positive_real(getattr(self, name)):
                raise SpecbenchError(f"EAGLE head {name} must be a finite number > 0, got {getattr(self, name)!r}")
        check_rope_scaling(self.rope_scaling, self.format)
        if self.feature_layers is not None:
            layers = tuple(self.feature_layers)
            if not layers or not all(isinstance(layer, int) and not isinstance(layer, bool) for layer in layers):
                raise SpecbenchError(f"EAGLE head feature_layers must be a non-empty list of layer numbers, got "
                                     f"{self.feature_layers!r}")
            if self.kind == "eagle" and len(layers) != 1:
                raise SpecbenchError(f"an eagle head reads one target layer, got feature_layers={list(layers)}")
            object.__setattr__(self, "feature_layers", layers)  # a list from a yaml or json file

    @property
    def num_features(self) -> int:
        """Target states concatenated into one feature: EAGLE-3's three unless the checkpoint names others."""
        if self.kind == "eagle":
            return 1
        return len(self.feature_layers) if self.feature_layers is not None else 3

    @property
    def fc_in_features(self) -> int:
        if self.kind == "eagle":
            return self.hidden_size + self.target_hidden_size  # cat(embedding, feature)
        return self.num_features * self.target_hidden_size


def _positive_real(value) -> bool:
    """Whether ``value`` is a finite number > 0: not a bool (true would pass as 1), a string, inf or nan."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0






def check_rope_scaling(rope_scaling: dict | None, format: str) -> None:
    """Refuse a rotary scaling the head cannot apply as its authors' code does: EAGLE applies only linear scaling
    (it never applies Llama-3.1's llama3 scaling to its heads), vLLM applies a speculators head's llama3 scaling."""
    if rope_scaling is None:
        return
    kind = rope_scaling.get("rope_type", rope_scaling.get("type")) if isinstance(rope_scaling, dict) else None
    allowed = ("linear", "llama3") if format == "speculators" else ("linear",)
    if kind not in allowed:
        raise SpecbenchError(f"EAGLE head rope_scaling {rope_scaling!r} is not supported in format {format}; "
                             f"supported: none or rope_type {' or '.join(allowed)}")
    needed = ("factor",) if kind == "linear" else LLAMA3_ROPE_KEYS
    missing = [key for key in needed if not _positive_real(rope_scaling.get(key))]
    if missing:
        raise SpecbenchError(f"EAGLE head rope_scaling {rope_scaling!r} needs positive numbers for "
                             f"{', '.join(needed)}")


class HeadCache:
    """The head's own KV cache of one sequence: keys/values of its (one) decoder layer, [kv_heads, capacity,
    head_dim] each, growing when full."""

    def __init__(self, config: HeadConfig, capacity: int, device, dtype):
        if capacity < 1:
            raise ValueError(f"a head cache needs a capacity of at least 1 position, got {capacity}")
        shape = (config.num_key_value_heads, capacity, config.head_dim)
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``keys``/``values`` [kv_heads, n, head_dim] after the held positions; return every held key and value
        [kv_heads, length, head_dim] (views, valid until the next append)."""
        end = self.length + keys.shape[1]
        if end > self.capacity:
            self._grow(max(end, 2 * self.capacity))  # doubling: appends stay amortised O(1) per position
        self.keys[:, self.length:end] = keys
        self.values[:, self.length:end] = values
        self.length = end
        return self.keys[:, :end], self.values[:, :end]

    def truncate(self, length: int) -> None:
        """Forget positions >= ``length`` (the rejected part of a draft)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a head cache of {self.length} positions to {length}")
        self.length = length

    def _grow(self, capacity: int) -> None:
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty((old.shape[0], capacity, old.shape[2]))
            new[:, :self.length] = old[:, :self.length]
            setattr(self, name, new)


class RMSNorm(nn.Module):
    """Llama's RMS norm: computed in float32, scaled in the input's dtype (as transformers and EAGLE do)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_inverse_frequencies(config: HeadConfig) -> torch.Tensor:
    """[head_dim / 2] float32 angles per position, theta^-(2i/d), with llama3 scaling applied when configured
    (linear scaling divides the positions instead, as EAGLE's code does)."""
    # on the host explicitly: heads are also built under torch.device("meta") before their weights are assigned
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64, device="cpu").float() / config.head_dim
    inverse = 1.0 / (config.rope_theta ** exponents)
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        inverse = _llama3_frequencies(inverse, scaling)
    return inverse


def _llama3_frequencies(inverse: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's scaling: wavelengths longer than the original context / low_freq_factor are slowed by
    ``factor``, shorter than context / high_freq_factor kept, and the band between interpolated smoothly."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inverse
    smooth = ((context / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    blended = (1 - smooth) * inverse / factor + smooth * inverse
    return torch.where(wavelength > context / low, inverse / factor,
                       torch.where(wavelength < context / high, inverse, blended))


def causal_visible(past: int, n: int, device) -> torch.Tensor:
    """[n, past + n] bool: each new row sees every cached position and the new rows up to itself."""
    return torch.ones(n, past + n, dtype=torch.bool, device=device).tril(diagonal=past)


class HeadAttention(nn.Module):
    """Llama attention with grouped-query heads, whose keys/values go to a ``HeadCache``; ``in_width`` is h for
    EAGLE-1 and 2h for EAGLE-3 (embedding and hidden side by side)."""

    def __init__(self, config: HeadConfig, in_width: int):
        super().__init__()
        self.config = config
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(in_width, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_width, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_width, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=False)
        # Not a buffer: Module.to(float16) would round the frequencies, and the angles at long positions with them.
        self._inverse_frequencies = rotary_inverse_frequencies(config)
        self._frequencies_on: dict[torch.device, torch.Tensor] = {}

    def rotary(self, positions: torch.LongTensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, head_dim] for ``positions``, computed in float32 and then cast, as EAGLE's tables are."""
        inverse = self._frequencies_on.get(positions.device)
        if inverse is None:
            inverse = self._frequencies_on.setdefault(positions.device, self._inverse_frequencies.to(positions.device))
        scaling = self.config.rope_scaling or {}
        factor = scaling["factor"] if scaling.get("rope_type", scaling.get("type")) == "linear" else 1.0
        angles = (positions.float() / factor)[:, None] * inverse[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, x: torch.Tensor, positions: torch.LongTensor, cache: HeadCache,
                visible: torch.BoolTensor | None) -> torch.Tensor:
        n = x.shape[0]
        heads, kv_heads, head_dim = (self.config.num_attention_heads, self.config.num_key_value_heads,
                                     self.config.head_dim)
        queries = self.q_proj(x).view(n, heads, head_dim).transpose(0, 1)  # [heads, n, head_dim]
        keys = self.k_proj(x).view(n, kv_heads, head_dim).transpose(0, 1)
        values = self.v_proj(x).view(n, kv_heads, head_dim).transpose(0, 1)
        cos, sin = self.rotary(positions, queries.dtype)
        queries = queries * cos + rotate_half(queries) * sin
        keys = keys * cos + rotate_half(keys) * sin
        past = cache.length
        all_keys, all_values = cache.append(keys, values)
        if visible is None:
            visible = causal_visible(past, n, x.device)
        elif tuple(visible.shape) != (n, past + n):
            raise ValueError(f"visible must be [n, cached + n] = [{n}, {past + n}], got {list(visible.shape)}")
        groups = heads // kv_heads
        all_keys = all_keys.repeat_interleave(groups, dim=0)  # each kv head serves `groups` consecutive heads
        all_values = all_values.repeat_interleave(groups, dim=0)
        # a batch of one: the fused CUDA kernels take 4-dimensional inputs only
        attended = F.scaled_dot_product_attention(queries[None], all_keys[None], all_values[None],
                                                  attn_mask=visible[None, None])[0]
        return self.o_proj(attended.transpose(0, 1).reshape(n, heads * head_dim))


class HeadMLP(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HeadLayer(nn.Module):
    """The head's one decoder layer. EAGLE-1's has no input_layernorm; EAGLE-3's has input_layernorm (over the
    embedding) and hidden_norm (over the hidden) and attends over both side by side."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.kind = config.kind
        width = config.hidden_size
        self.self_attn = HeadAttention(config, in_width=width if config.kind == "eagle" else 2 * width)
        self.mlp = HeadMLP(config)
        self.post_attention_layernorm = RMSNorm(width, config.rms_norm_eps)
        if config.kind == "eagle3":
            self.input_layernorm = RMSNorm(width, config.rms_norm_eps)
            self.hidden_norm = RMSNorm(width, config.rms_norm_eps)

    def forward(self, embeddings: torch.Tensor | None, hidden: torch.Tensor, positions: torch.LongTensor,
                cache: HeadCache, visible: torch.BoolTensor | None) -> torch.Tensor:
        if self.kind == "eagle":
            attention_input = hidden  # EAGLE-1 drops layer 0's input norm: attention reads fc's output raw
        else:
            attention_input = torch.cat((self.input_layernorm(embeddings), self.hidden_norm(hidden)), dim=-1)
        hidden = hidden + self.self_attn(attention_input, positions, cache, visible)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    """An EAGLE or EAGLE-3 draft head; ``forward`` runs it over n new positions of one sequence."""

    def __init__(self, config: HeadConfig, target_lm_head: nn.Module | None = None):
        super().__init__()
        if config.kind == "eagle" and target_lm_head is None:
            raise ValueError("an eagle head drafts through the target's lm_head: pass target_lm_head")
        self.config = config
        width = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, width)
        self.embed_tokens.weight.requires_grad_(False)  # a copy of the target's, frozen in EAGLE's training too
        self.fc = nn.Linear(config.fc_in_features, width, bias=config.fc_bias)
        self.layers = nn.ModuleList([HeadLayer(config)])
        if config.kind == "eagle3":
            self.norm = RMSNorm(width, config.rms_norm_eps)
            self.lm_head = nn.Linear(width, config.draft_vocab_size, bias=False)
            if config.draft_vocab_size < config.vocab_size:
                # identity offsets until set_draft_vocabulary or a checkpoint says which target ids these are
                self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        # Outside the module tree: the target's lm_head is not the head's to save, move or train.
        object.__setattr__(self, "target_lm_head", target_lm_head)

    def new_cache(self, capacity: int) -> HeadCache:
        weight = self.fc.weight
        return HeadCache(self.config, capacity, weight.device, weight.dtype)

    def forward(self, token_ids: torch.LongTensor, hidden: torch.Tensor, positions: torch.LongTensor,
                cache: HeadCache, visible: torch.BoolTensor | None, from_target: bool) -> torch.Tensor:
        """The head's output hidden states [n, h] (EAGLE's ``out_hidden``, before any final norm) for n new
        positions, appending their keys/values to ``cache``.

        token_ids [n]: target token ids (each paired with the feature of the position before it);
        hidden [n, w]: target features when ``from_target`` (w = ``config.fc_in_features`` for eagle3, the target's
        hidden size for eagle), else the head's own outputs [n, h] fed back during tree expansion;
        positions [n]: rotary positions; visible [n, cache.length + n]: True where a new row may attend (before
        this call's append); None = every cached position plus causal among the new rows.
        """
        assert token_ids.ndim == 1 and hidden.ndim == 2 and positions.ndim == 1, "token_ids [n], hidden [n, w]"
        config = self.config
        expected = (config.target_hidden_size if config.kind == "eagle" else config.fc_in_features) \
            if from_target else config.hidden_size
        if hidden.shape[1] != expected or hidden.shape[0] != token_ids.shape[0]:
            raise ValueError(f"{config.kind} head expects hidden [{token_ids.shape[0]}, {expected}] "
                             f"({'target features' if from_target else 'its own outputs'}), got {list(hidden.shape)}")
        embeddings = self.embed_tokens(token_ids).to(hidden.dtype)  # EAGLE casts the embedding to the hidden's dtype
        if config.kind == "eagle":
            # The embedding goes FIRST: fc's columns were trained in that order (EAGLE cnets.py).
            return self.layers[0](None, self.fc(torch.cat((embeddings, hidden), dim=-1)), positions, cache, visible)
        if from_target:
            hidden = self.fc(hidden)
        return self.layers[0](embeddings, hidden, positions, cache, visible)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """[n, draft_vocab_size] logits for the heads' outputs ``out`` [n, h]: the target's lm_head for eagle (no
        norm: the head learnt to predict the target's post-norm state), the head's own norm and lm_head for eagle3."""
        if self.config.kind == "eagle":
            return self.target_lm_head(out)
        return self.lm_head(self.norm(out))

    def to_target_ids(self, draft_ids: torch.LongTensor) -> torch.LongTensor:
        """Target ids of draft-vocabulary ids: ``draft_ids + d2t[draft_ids]`` (d2t holds offsets, not ids) for a
        reduced vocabulary, the ids themselves otherwise."""
        d2t = getattr(self, "d2t", None)
        return draft_ids if d2t is None else draft_ids + d2t[draft_ids]

    def set_draft_vocabulary(self, target_ids: torch.LongTensor) -> None:
        """Make draft id i stand for ``target_ids[i]`` (ascending target ids, as EAGLE-3's training picks the most
        frequent tokens and sorts them), stored as EAGLE's offsets."""
        if getattr(self, "d2t", None) is None:
            raise ValueError("this head drafts over the whole target vocabulary; it has no d2t")
        self.d2t.copy_(draft_offsets(target_ids, self.config.draft_vocab_size, self.config.vocab_size))

    def resolve_feature_layers(self, num_target_layers: int) -> tuple[int, ...]:
        """The target layers (0 = embeddings, i = after decoder layer i) whose states the head reads.

        eagle: (N,), the post-final-norm last state (transformers' ``hidden_states[N]``). eagle3: the checkpoint's
        layers when it names them, else EAGLE-3's (2, N//2, N-3): the inputs of decoder layers 2, N//2 and N-3.
        """
        return resolve_feature_layers(self.config, num_target_layers)


def resolve_feature_layers(config: HeadConfig, num_target_layers: int) -> tuple[int, ...]:
    """``EagleHead.resolve_feature_layers`` for a config."""
    n = num_target_layers
    if config.feature_layers is not None:
        layers = config.feature_layers
    elif config.kind == "eagle":
        layers = (n,)
    elif n < 6:
        # below 6 layers EAGLE-3's three layers coincide or come out of order
        raise SpecbenchError(f"an eagle3 head's default feature layers (2, N//2, N-3) need a target of at least 6 "
                             f"layers, this one has {n}; give drafter.feature_layers=[...]")
    else:
        layers = (2, n // 2, n - 3)
    outside = [layer for layer in layers if not 0 <= layer <= n]
    if outside:
        raise SpecbenchError(f"feature layers {list(layers)} include {outside}, outside 0..{n} (the target has {n} "
                             f"layers; 0 = the embeddings)")
    return tuple(layers)


def draft_offsets(target_ids: torch.LongTensor, draft_vocab_size: int, vocab_size: int) -> torch.LongTensor:
    """EAGLE-3's d2t [draft_vocab_size] for draft id i standing for ``target_ids[i]``: target_ids[i] - i.

    Example: target ids [3, 5, 9] -> d2t [3, 4, 7], and draft id 2 -> 2 + 7 = 9.
    """
    target_ids = torch.as_tensor(target_ids, dtype=torch.long).reshape(-1)
    if target_ids.numel() != draft_vocab_size or (target_ids.numel() and not (
            0 <= int(target_ids.min()) and int(target_ids.max()) < vocab_size)):
        raise ValueError(f"a draft vocabulary needs {draft_vocab_size} target ids in 0..{vocab_size - 1}")
    if target_ids.unique().numel() != target_ids.numel():
        raise ValueError("a draft vocabulary's target ids must be distinct")
    return target_ids - torch.arange(draft_vocab_size)


def build_head(config: HeadConfig, target_lm_head: nn.Module | None = None,
               target_embedding: torch.Tensor | None = None) -> EagleHead:
    """A randomly initialised head (the caller seeds torch), on the host in float32.

    eagle needs ``target_lm_head`` (its draft logits are the target's). ``target_embedding`` [vocab, h], when given,
    is copied into the head's frozen embedding: EAGLE-1 heads carry such a copy, EAGLE-3 loads it from the base
    model.
    """
    head = EagleHead(config, target_lm_head)
    _initialise(head, torch.Generator().manual_seed(int(torch.initial_seed()) % 2**63))
    if target_embedding is not None:
        expected = (config.vocab_size, config.hidden_size)
        if tuple(target_embedding.shape) != expected:
            raise ValueError(f"target_embedding must be {list(expected)}, got {list(target_embedding.shape)}")
        with torch.no_grad():
            head.embed_tokens.weight.copy_(_whole(target_embedding.detach()).to("cpu", torch.float32))
    return head


def _initialise(head: EagleHead, generator: torch.Generator) -> None:
    """nn.Linear's and nn.Embedding's default initialisation, drawn from ``generator``: not through torch.nn.init,
    which a transformers model loaded with a tensor-parallel plan leaves patched, so that a head of one seed is the
    same in every process and placement."""
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.Linear):
                bound = 1.0 / math.sqrt(module.in_features)  # kaiming_uniform(a=sqrt(5)), as nn.Linear does
                module.weight.uniform_(-bound, bound, generator=generator)
                if module.bias is not None:
                    module.bias.uniform_(-bound, bound, generator=generator)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(generator=generator)


def head_config_for(target, kind: str, draft_vocab_size: int | None = None, feature_layers=None,
                    **overrides) -> HeadConfig:
    """A one-layer head config shaped like ``target`` (a LoadedModel): attention and MLP sizes, norm epsilon and
    rotary base copied from the target's config, as published heads copy their base model's. ``overrides`` replace
    any other HeadConfig field (e.g. ``format="speculators"``)."""
    if kind not in HEAD_KINDS:
        raise SpecbenchError(f"EAGLE head kind {kind!r} is unknown; choose one of {', '.join(HEAD_KINDS)}")
    text = target.weights.architecture
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    theta, scaling = _rope_of(text)
    format = overrides.get("format", kind)
    scaling_kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if scaling_kind != "linear" and not (scaling_kind == "llama3" and format == "speculators"):
        scaling = None  # EAGLE's heads never apply the other scalings (llama3 runs as plain rotary there)
    values = dict(
        kind=kind, hidden_size=hidden, intermediate_size=int(text["intermediate_size"]), num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        rms_norm_eps=float(text.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)),
        rope_theta=float(theta if theta is not None else DEFAULT_ROPE_THETA), rope_scaling=scaling,
        vocab_size=int(target.vocab_size),
        draft_vocab_size=int(draft_vocab_size) if draft_vocab_size is not None else int(target.vocab_size),
        target_hidden_size=hidden, feature_layers=tuple(feature_layers) if feature_layers is not None else None,
        fc_bias=kind == "eagle",  # EAGLE-1's default ("bias" absent = True); EAGLE-3's fc has none
        verifier=target.source, format=kind)
    unknown = sorted(set(overrides) - {field.name for field in fields(HeadConfig)})
    if unknown:
        raise SpecbenchError(f"unknown EAGLE head setting(s) {', '.join(unknown)}; settings: "
                             f"{', '.join(field.name for field in fields(HeadConfig))}")
    values.update(overrides)
    return HeadConfig(**values)


def _rope_of(config: dict) -> tuple[float | None, dict | None]:
    """(rope_theta, rope_scaling) of a Llama config dict, from either transformers 4's ``rope_theta`` /
    ``rope_scaling`` or transformers 5's ``rope_parameters`` (where the plain rotary is rope_type "default")."""
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        theta = parameters["rope_theta"]
        scaling = {key: value for key, value in parameters.items() if key != "rope_theta"}
    else:
        theta, scaling = config.get("rope_theta"), config.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) in ("default", None):
        scaling = None
    return theta, scaling


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, as one process has it: under tensor parallelism the target's weights are shards (DTensors),
    and the head, which is not sharded, runs on plain tensors in every process."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
