"""Hydra draft heads (Ankner et al. 2024, zankner/Hydra @3f39fbd; Spec-Bench's copy in model/hydra/ @fd2c1cd): the
head module, and its checkpoints in Hydra's own on-disk format.

The published heads (``ankner/hydra-vicuna-{7b,13b,33b}-v1.3``) are Hydra++: ``hydra_head_arch: prefix-mlp``,
``grounded_heads: true``, 4 heads of 4 layers, reading the target's last, post-norm hidden state
(``hidden_state_offset: 0``). The head is:

- a *prefix* layer: one Llama decoder layer and a final norm run over the target's hidden states (not over token
  embeddings) with a KV cache of its own over the committed positions; its output at the last committed position is
  ``prefix``. Its rotary base is 10000 whatever the target's (Spec-Bench model/hydra/modeling_llama_kv.py: the
  attention builds ``LlamaRotaryEmbedding`` without the config's ``rope_theta``).
- head ``i`` (0-based) reads ``cat(prefix, embed(r), embed(c_1), ..., embed(c_i))``, (i + 2) x h wide, where ``r``
  is the root (the last committed token) and ``c_1..c_i`` the draft tokens before it on the path ("sequentially
  dependent"), and predicts the token after ``c_i``. Its MLP is a projecting residual block ((i + 2)h -> h, with a
  linear residual connection), then ``num_layers - 1`` applications of ONE h -> h residual block: Hydra builds the
  block list as ``[Dropout, ResBlock] * (num_layers - 1)``, which repeats the same module objects, so those blocks
  share their weights. A residual block is ``res(x) + silu(linear(x))``. Its lm head is its own biased
  ``Linear(h, vocab)`` (initialised from the target's lm_head).

The token embedding is the target's own (Hydra's ``input_embed_fn`` is the base model's ``embed_tokens``).

Format: a directory with ``config.json`` (``hydra_head_arch``, ``hydra_num_heads``, ``hydra_num_layers``,
``grounded_heads``, ``hidden_state_offset``, ``base_model_name_or_path``) and ``hydra_lm_head.pt``, the
``state_dict`` of Hydra's head module saved with ``torch.save``; the prefix layer's shape is the base model's config
with one layer (Hydra deep-copies it), so it is read from the target. Hydra's file also holds two tensors the head
never uses, which specbench neither keeps nor writes: ``input_embed_fn.weight`` (the base model's embedding, compared
with the target's when present) and ``prefix_embeding_layer.embed_tokens.weight`` (the prefix model is fed hidden
states, never ids); a rotary ``inv_freq`` buffer is ignored too. Loading is strict otherwise: Hydra's own loader
(``strict=False``) would leave a misnamed weight random.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specbench.errors import SpecbenchError
from specbench.heads.eagle_heads import HeadAttention, HeadCache, HeadMLP, RMSNorm, _rope_of, _whole, rotate_half

ARCHITECTURES = ("prefix-mlp",)  # the head architectures specbench runs: the published heads'
# Hydra's others (model/hydra/hydra_model.py: mlp, cross-attn, eagle-attn), named in the refusal.
OTHER_ARCHITECTURES = ("mlp", "cross-attn", "eagle-attn")
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "hydra_lm_head.pt"
# Tensors of Hydra's file that the head does not use (see the module docstring).
BASE_EMBEDDING_KEY = "input_embed_fn.weight"
UNUSED_KEYS = ("prefix_embeding_layer.embed_tokens.weight",)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
PREFIX = "prefix_embeding_layer"  # Hydra's spelling, kept: it is the weights' names
# The prefix layer's rotary base: Hydra's attention builds its rotary embedding with the default base.
HYDRA_ROPE_THETA = 10000.0
# LlamaConfig's initializer_range default, the std of the prefix layer's initial weights when the target names none.
DEFAULT_INITIALIZER_RANGE = 0.02
WHAT = "Hydra head"


@dataclass(frozen=True)
class HydraHeadConfig:
    """A Hydra head's settings (config.json's) and the shape of its prefix layer (the target's, one layer). The
    attention, MLP and KV cache of specbench's EAGLE heads read the fields they share by these names."""

    num_heads: int               # hydra_num_heads: draft depth
    num_layers: int              # hydra_num_layers: residual blocks per head (the second to last share weights)
    hidden_state_offset: int     # 0: the target's last, post-norm state; k: the output of layer N - k
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope_scaling: dict | None = None  # linear only, as Hydra's attention applies it
    base_model: str | None = None     # base_model_name_or_path: the target the head was trained for
    rope_theta: float = HYDRA_ROPE_THETA
    head_arch: str = "prefix-mlp"
    grounded: bool = True

    def __post_init__(self):
        for name in ("num_heads", "num_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecbenchError(f"{WHAT} {name} must be a positive integer, got {value!r}")
        if not isinstance(self.hidden_state_offset, int) or isinstance(self.hidden_state_offset, bool) \
                or self.hidden_state_offset < 0:
            raise SpecbenchError(f"{WHAT} hidden_state_offset must be an integer >= 0, got "
                                 f"{self.hidden_state_offset!r}")
        if self.head_arch not in ARCHITECTURES:
            raise SpecbenchError(f"{WHAT} architecture {self.head_arch!r} is not supported; supported: "
                                 f"{', '.join(ARCHITECTURES)} (Hydra++, the published heads')")
        if self.grounded is not True:
            raise SpecbenchError(f"{WHAT} grounded_heads={self.grounded!r} is not supported; supported: true "
                                 f"(sequentially dependent heads, the published heads')")
        if self.num_attention_heads % self.num_key_value_heads:
            raise SpecbenchError(f"{WHAT} num_key_value_heads={self.num_key_value_heads} must divide "
                                 f"num_attention_heads={self.num_attention_heads}")
        scaling = self.rope_scaling
        if scaling is not None and (not isinstance(scaling, dict)
                                    or scaling.get("rope_type", scaling.get("type")) != "linear"
                                    or not _positive(scaling.get("factor"))):
            raise SpecbenchError(f"{WHAT} rope_scaling {scaling!r} is not supported; supported: none or linear "
                                 f"with a factor > 0 (the scalings Hydra's prefix layer applies)")

    def feature_layer(self, num_target_layers: int) -> int:
        """The target layer the head reads: N (the post-norm last state, transformers' ``hidden_states[N]``) for
        offset 0, else the output of decoder layer N - offset (Hydra's ``hidden_states[-(offset + 1)]``)."""
        layer = num_target_layers - self.hidden_state_offset
        if layer < 0:
            raise SpecbenchError(f"{WHAT} hidden_state_offset={self.hidden_state_offset} reaches below the "
                                 f"embeddings of a {num_target_layers}-layer target")
        return layer


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


class ResBlock(nn.Module):
    """``res_connection(x) + silu(linear(x))``: Hydra's residual block; ``res_connection`` is a linear layer when
    the block narrows its input ((i + 2)h -> h), else the identity."""

    def __init__(self, in_width: int, width: int):
        super().__init__()
        self.linear = nn.Linear(in_width, width)
        self.res_connection = nn.Linear(in_width, width) if in_width != width else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res_connection(x) + F.silu(self.linear(x))


class PrefixLayer(nn.Module):
    """The prefix model: one Llama decoder layer (input norm, attention, post-attention norm, MLP) and the final
    norm, over the target's hidden states."""

    def __init__(self, config: HydraHeadConfig):
        super().__init__()
        self.layers = nn.ModuleList([_DecoderLayer(config)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, states: torch.Tensor, positions: torch.LongTensor, cache: HeadCache) -> torch.Tensor:
        """[n, h] for ``states`` [n, h] at ``positions`` [n], attending to the cached positions and causally among
        themselves; appends their keys and values to ``cache``."""
        return self.norm(self.layers[0](states, positions, cache))


class _DecoderLayer(nn.Module):
    def __init__(self, config: HydraHeadConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = HeadAttention(config, in_width=config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = HeadMLP(config)

    def forward(self, states: torch.Tensor, positions: torch.LongTensor, cache: HeadCache) -> torch.Tensor:
        states = states + self.self_attn(self.input_layernorm(states), positions, cache, None)
        return states + self.mlp(self.post_attention_layernorm(states))


class HydraHead(nn.Module):
    """A Hydra++ head (see the module docstring). ``target_embedding`` [vocab, h] is the target's embedding matrix,
    held outside the module tree: not the head's to save, move or train."""

    def __init__(self, config: HydraHeadConfig, target_embedding: torch.Tensor):
        super().__init__()
        self.config = config
        width = config.hidden_size
        setattr(self, PREFIX, PrefixLayer(config))
        mlps = []
        for index in range(config.num_heads):
            shared = ResBlock(width, width)  # one module, repeated: Hydra's list multiplication shares it
            mlps.append(nn.Sequential(nn.Dropout(0.0), ResBlock((index + 2) * width, width),
                                      *([nn.Dropout(0.0), shared] * (config.num_layers - 1))))
        self.hydra_mlp = nn.ModuleList(mlps)
        self.hydra_lm_head = nn.ModuleList([nn.Sequential(nn.Dropout(0.0), nn.Linear(width, config.vocab_size))
                                            for _ in range(config.num_heads)])
        object.__setattr__(self, "target_embedding", target_embedding)

    @property
    def prefix(self) -> PrefixLayer:
        return getattr(self, PREFIX)

    def new_cache(self, capacity: int) -> HeadCache:
        weight = self.hydra_lm_head[0][1].weight
        return HeadCache(self.config, capacity, weight.device, weight.dtype)

    def embed(self, token_ids: torch.LongTensor) -> torch.Tensor:
        """The target's embeddings of ``token_ids`` (any shape), in the head's dtype."""
        return F.embedding(token_ids, self.target_embedding).to(self.hydra_lm_head[0][1].weight.dtype)

    def prefix_states(self, states: torch.Tensor, positions: torch.LongTensor, cache: HeadCache) -> torch.Tensor:
        """The prefix layer over n new committed positions (see ``PrefixLayer.forward``)."""
        assert states.ndim == 2 and positions.ndim == 1, "states [n, h], positions [n]"
        if states.shape[1] != self.config.hidden_size:
            raise ValueError(f"{WHAT} reads target states of width {self.config.hidden_size}, got "
                             f"{list(states.shape)}")
        return self.prefix(states.to(self.hydra_lm_head[0][1].weight.dtype), positions, cache)

    def prefix_sequences(self, states: torch.Tensor) -> torch.Tensor:
        """The prefix layer over whole sequences ``states`` [B, T, h] from position 0, causal, batched and
        differentiable (training): what ``prefix_states`` gives position by position. Right padding changes no
        earlier position."""
        assert states.ndim == 3, "states [B, T, h]"
        layer = self.prefix.layers[0]
        attention = layer.self_attn
        config = self.config
        count, length = states.shape[:2]
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        normed = layer.input_layernorm(states)
        queries = attention.q_proj(normed).view(count, length, heads, head_dim).transpose(1, 2)
        keys = attention.k_proj(normed).view(count, length, kv_heads, head_dim).transpose(1, 2)
        values = attention.v_proj(normed).view(count, length, kv_heads, head_dim).transpose(1, 2)
        cos, sin = attention.rotary(torch.arange(length, device=states.device), queries.dtype)
        queries = queries * cos + rotate_half(queries) * sin
        keys = keys * cos + rotate_half(keys) * sin
        groups = heads // kv_heads
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        attended = F.scaled_dot_product_attention(queries, keys, values, is_causal=True)
        attended = attention.o_proj(attended.transpose(1, 2).reshape(count, length, heads * head_dim))
        hidden = states + attended
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.prefix.norm(hidden)

    def head_logits(self, index: int, inputs: torch.Tensor, dropout=None) -> torch.Tensor:
        """Head ``index``'s logits [..., vocab] for ``inputs`` [..., (index + 2) h] =
        cat(prefix, embed(root), embed(c_1), ..., embed(c_index)). ``dropout``: a function applied where Hydra's
        Dropout modules sit (before every residual block and before the lm head), for training."""
        expected = (index + 2) * self.config.hidden_size
        if inputs.shape[-1] != expected:
            raise ValueError(f"{WHAT} head {index} reads {expected} features, got {list(inputs.shape)}")
        hidden = inputs
        for module in self.hydra_mlp[index]:
            if isinstance(module, nn.Dropout):
                hidden = dropout(hidden) if dropout is not None else hidden
            else:
                hidden = module(hidden)
        if dropout is not None:
            hidden = dropout(hidden)
        return self.hydra_lm_head[index][1](hidden)

    def feature_layer(self, num_target_layers: int) -> int:
        return self.config.feature_layer(num_target_layers)


def head_config_for(target, num_heads: int, num_layers: int, hidden_state_offset: int = 0,
                    base_model: str | None = None) -> HydraHeadConfig:
    """The config of a Hydra++ head for ``target`` (a LoadedModel): the prefix layer shaped like one of the target's
    layers, as Hydra deep-copies the base model's config."""
    text = target.weights.architecture
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    _, scaling = _rope_of(text)
    if (scaling or {}).get("rope_type", (scaling or {}).get("type")) != "linear":
        scaling = None  # Hydra's attention applies linear scaling only (its dynamic one: no target of ours)
    return HydraHeadConfig(
        num_heads=num_heads, num_layers=num_layers, hidden_state_offset=hidden_state_offset, hidden_size=hidden,
        intermediate_size=int(text["intermediate_size"]), num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads), rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        vocab_size=int(target.vocab_size), rope_scaling=scaling,
        base_model=base_model if base_model is not None else str(target.source))


def build_head(target, config: HydraHeadConfig, seed: int) -> HydraHead:
    """A new head initialised as Hydra's code does, on the host in float32, its draws from ``seed`` alone:

    - the prefix layer as transformers initialises a fresh ``LlamaModel``: linear weights normal(0,
      initializer_range), norms 1 (Hydra builds it from the config, not from the base model's layers);
    - each residual block's ``linear`` weight zero (Hydra's "identity mapping" start), its bias and the projecting
      blocks' ``res_connection`` as nn.Linear's defaults;
    - each lm head's weight a copy of the target's lm_head, its bias nn.Linear's default.

    Drawn from a generator rather than torch.nn.init, which a tensor-parallel load leaves patched (as EAGLE's
    heads are)."""
    generator = torch.Generator().manual_seed(int(seed))
    with torch.device("cpu"):
        # a host float32 copy, as the trainer's batches are: a target on a GPU or in bfloat16 keeps its own
        head = HydraHead(config, _whole(target.weights.input_embeddings().detach()).to("cpu", torch.float32))
    std = float(target.weights.architecture.get("initializer_range") or DEFAULT_INITIALIZER_RANGE)
    lm_weight = _whole(_dense(target.weights.output_layer())).to("cpu", torch.float32)
    if tuple(lm_weight.shape) != (config.vocab_size, config.hidden_size):
        raise SpecbenchError(f"{WHAT}: the target's lm_head is {list(lm_weight.shape)}, the head needs "
                             f"[{config.vocab_size}, {config.hidden_size}]")
    with torch.no_grad():
        for module in head.prefix.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, std, generator=generator)
        for mlp in head.hydra_mlp:
            for block in dict.fromkeys(module for module in mlp if isinstance(module, ResBlock)):
                _default_linear(block.linear, generator)
                block.linear.weight.zero_()
                if isinstance(block.res_connection, nn.Linear):
                    _default_linear(block.res_connection, generator)
        for lm_head in head.hydra_lm_head:
            _default_linear(lm_head[1], generator)
            lm_head[1].weight.copy_(lm_weight)
    return head


def _default_linear(module: nn.Linear, generator: torch.Generator) -> None:
    """nn.Linear's default initialisation (kaiming_uniform(a=sqrt(5)) weight, uniform bias), from ``generator``."""
    bound = 1.0 / math.sqrt(module.in_features)
    module.weight.uniform_(-bound, bound, generator=generator)
    if module.bias is not None:
        module.bias.uniform_(-bound, bound, generator=generator)


def _dense(module: nn.Module) -> torch.Tensor:
    packed = getattr(module, "packed_weight", None)
    return (packed.to_dense() if packed is not None else module.weight).detach()


# ---- files -------------------------------------------------------------------------------------------------------


def load_hydra_head(target, source: str, revision: str | None = None) -> HydraHead:
    """The Hydra head in ``source`` (a local directory or a hub id, read from the local Hugging Face cache first),
    loaded strictly, on the target's device and dtype, frozen, after checking that it fits ``target``."""
    from specbench.heads.eagle_head_files import _check_embedding, _head_directory, _read_config, _read_weights

    directory = _head_directory(source, revision, what=WHAT)
    raw = _read_config(directory, source, what=WHAT)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise SpecbenchError(f"{WHAT} {source} has no weights in {directory}: expected {WEIGHTS_FILE}")
    config = parse_config(raw, target, source)
    state = _read_weights(weights, source, what=WHAT)
    base_embedding = state.pop(BASE_EMBEDDING_KEY, None)
    state = {key: value for key, value in state.items()
             if key not in UNUSED_KEYS and not key.endswith(IGNORED_SUFFIXES)}
    _check_keys_and_shapes(config, state, source, target)
    _check_shared_blocks(config, state, source)
    if base_embedding is not None:
        _check_embedding(base_embedding, target.weights.input_embeddings(), source, target.name)
    with torch.device("meta"):  # no random initialisation of weights that are about to be replaced
        head = HydraHead(config, target.weights.input_embeddings().detach())
    head.load_state_dict(state, strict=True, assign=True)
    head.to(device=target.device, dtype=target.dtype)
    head.eval()
    head.requires_grad_(False)
    return head


def parse_config(raw: dict, target, source: str) -> HydraHeadConfig:
    """The head's config from its config.json (Hydra's keys, with HydraConfig's defaults where absent) and the
    target's layer shape; one-line refusals for what specbench does not run."""
    arch = raw.get("hydra_head_arch", "mlp")  # HydraConfig's default
    if arch not in ARCHITECTURES:
        known = "a Hydra architecture" if arch in OTHER_ARCHITECTURES else "no Hydra architecture"
        raise SpecbenchError(f"{WHAT} {source} has hydra_head_arch={arch!r} ({known}); supported: "
                             f"{', '.join(ARCHITECTURES)} (Hydra++, the published heads')")
    values = {}
    for key, name, default in (("hydra_num_heads", "num_heads", 4), ("hydra_num_layers", "num_layers", 1),
                               ("hidden_state_offset", "hidden_state_offset", 0)):
        value = raw.get(key, default)
        minimum = 0 if name == "hidden_state_offset" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise SpecbenchError(f"{WHAT} {source}: config.json sets {key}={value!r}; it must be an integer >= "
                                 f"{minimum}")
        values[name] = value
    grounded = raw.get("grounded_heads", False)
    if grounded is not True:
        raise SpecbenchError(f"{WHAT} {source} has grounded_heads={grounded!r}; supported: true (sequentially "
                             f"dependent heads, the published heads')")
    base = raw.get("base_model_name_or_path")
    config = head_config_for(target, base_model=base if isinstance(base, str) else None, **values)
    config.feature_layer(target.num_layers)
    return config


def expected_shapes(config: HydraHeadConfig) -> dict[str, tuple[int, ...]]:
    """Every weight name of a head with ``config`` (Hydra's file's names) and its shape."""
    with torch.device("meta"):
        head = HydraHead(config, torch.empty(0))
    return {key: tuple(value.shape) for key, value in head.state_dict().items()}


def _listed(keys, limit: int = 5) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _check_keys_and_shapes(config: HydraHeadConfig, state: dict, source: str, target) -> None:
    expected = expected_shapes(config)
    lm_bias = state.get("hydra_lm_head.0.1.bias")
    if lm_bias is not None and lm_bias.ndim == 1 and lm_bias.shape[0] != target.vocab_size:
        raise SpecbenchError(f"{WHAT} {source} was trained for a vocabulary of {lm_bias.shape[0]} tokens, target "
                             f"{target.name} has {target.vocab_size}")
    q_proj = state.get(f"{PREFIX}.layers.0.self_attn.q_proj.weight")
    if q_proj is not None and q_proj.ndim == 2 and q_proj.shape[1] != config.hidden_size:
        raise SpecbenchError(f"{WHAT} {source} reads target states of width {q_proj.shape[1]}, target "
                             f"{target.name} has hidden size {config.hidden_size}")
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    if missing or unexpected:
        parts = ([f"missing {_listed(missing)}"] if missing else []) + \
                ([f"unexpected {_listed(unexpected)}"] if unexpected else [])
        raise SpecbenchError(f"{WHAT} {source} does not match its config.json ({config.num_heads} heads of "
                             f"{config.num_layers} layers): {'; '.join(parts)}")
    wrong = [f"{key} {list(state[key].shape)} (needs {list(shape)})" for key, shape in expected.items()
             if tuple(state[key].shape) != shape]
    if wrong:
        raise SpecbenchError(f"{WHAT} {source} does not fit target {target.name}: weights of the wrong shape: "
                             f"{_listed(wrong, 3)}")


def _check_shared_blocks(config: HydraHeadConfig, state: dict, source: str) -> None:
    """The repeated residual block of a head is one module in Hydra, so its copies in the file are equal; copies
    that differ are a file of another layout, which loading would silently reduce to the last copy."""
    for index in range(config.num_heads):
        names = [f"hydra_mlp.{index}.{2 * block + 1}" for block in range(1, config.num_layers)]
        for suffix in ("linear.weight", "linear.bias"):
            first = state[f"{names[0]}.{suffix}"] if names else None
            for name in names[1:]:
                if not torch.equal(state[f"{name}.{suffix}"], first):
                    raise SpecbenchError(f"{WHAT} {source}: {name}.{suffix} differs from {names[0]}.{suffix}; in "
                                         f"Hydra's heads those blocks are one shared module")


def save_hydra_head(head: HydraHead, directory: str | Path) -> None:
    """Write ``head`` into ``directory`` in Hydra's format (config.json and hydra_lm_head.pt, which Hydra's
    ``HydraModel.from_pretrained`` reads), each file through a temporary name and a rename."""
    from specbench.storage.atomic import write_atomically
    from specbench.storage.refusal import refusing_writes

    config = head.config
    directory = Path(directory)
    state = {key: value.detach().to("cpu").contiguous().clone() for key, value in head.state_dict().items()}
    values = {
        "base_model_name_or_path": config.base_model, "grounded_heads": config.grounded,
        "hidden_state_offset": config.hidden_state_offset, "hydra_head_arch": config.head_arch,
        "hydra_num_heads": config.num_heads, "hydra_num_layers": config.num_layers,
    }
    text = json.dumps(values, indent=2) + "\n"

    def write_weights(path: Path) -> None:
        with open(path, "wb") as handle:  # a file object: a full disk reaches the error as its OSError (errno)
            torch.save(state, handle)

    with refusing_writes(directory):
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(directory / WEIGHTS_FILE, write_weights)
        write_atomically(directory / CONFIG_FILE, lambda path: path.write_text(text))
