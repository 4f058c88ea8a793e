"""EAGLE head directories: finding one (a local directory or a hub id), reading its config.json and weights in
any of the three formats, checking that it fits the target, and writing a head back in the format asked for.

Formats: ``eagle`` (EAGLE-1's ``pytorch_model.bin``), ``eagle3`` (EAGLE-3's ``model.safetensors`` with
``midlayer.*``), ``speculators`` (vLLM speculators' ``model.safetensors`` with ``layers.0.*`` and a config naming the
verifier). Loading is strict: EAGLE's own loader (``strict=False``) leaves a misnamed weight random, which then
silently accepts nothing. A head is only as good as its fit to the target, so the loader checks that fit and says
which head and which target disagree, and on what. The head modules themselves are in
``specbench.heads.eagle_heads``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from specbench.errors import SpecbenchError, damage_reason
from specbench.storage.atomic import write_atomically
from specbench.storage.refusal import refusing_writes
from specbench.heads.eagle_heads import (
    DEFAULT_RMS_NORM_EPS,
    DEFAULT_ROPE_THETA,
    DRAFTERS_OF_KIND,
    FORMATS,
    FORMATS_OF_KIND,
    HEAD_KINDS,
    EagleHead,
    HeadConfig,
    _positive_real,
    _rope_of,
    resolve_feature_layers,
)

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Weights a checkpoint may carry that the head does not use: an old transformers' rotary buffer, speculators'
# training-only verifier copies, and t2d (a membership mask that d2t already determines).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
IGNORED_PREFIXES = ("verifier_norm.", "verifier_lm_head.")
IGNORED_KEYS = ("t2d",)
EMBEDDING_KEY = "embed_tokens.weight"
# Rows of the embedding compared with the target's: enough that a different model cannot pass by chance, few
# enough to take milliseconds on a 128k vocabulary.
EMBEDDING_SAMPLE_ROWS = 256
SPECULATIVE_TOKENS = 5  # speculators_config's proposal length when a head is written in that format


def _config_count(layer: dict, key: str, source: str, default: int | None = None) -> int:
    """A count of a head's config.json (a width, a number of heads, a vocabulary size), checked as read: a JSON
    integer >= 1, since int() would take 64.5 as 64 and "64" as 64, and fail on inf or nan in a traceback; null
    or absent is ``default`` where the head has one."""
    value = layer.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecbenchError(f"EAGLE head {source}: config.json sets {key}={value!r}; it must be a positive integer")
    return value


def _config_real(layer: dict, key: str, source: str, default: float) -> float:
    """A real of a head's config.json (rms_norm_eps, rope_theta): absent is ``default``; else a finite number > 0."""
    value = layer.get(key, default)
    if not _positive_real(value):
        raise SpecbenchError(f"EAGLE head {source}: config.json sets {key}={value!r}; it must be a finite number > 0")
    return float(value)


def load_eagle_head(target, source: str, kind: str, revision: str | None = None, feature_layers=None) -> EagleHead:
    """The head in ``source`` (a local directory or a hub id, read from the local Hugging Face cache first), loaded
    strictly, on the target's device and dtype, frozen, after checking that it fits ``target``.

    ``feature_layers`` (the drafter's setting) replaces the layers the checkpoint names.
    """
    if kind not in HEAD_KINDS:
        raise SpecbenchError(f"EAGLE head kind {kind!r} is unknown; choose one of {', '.join(HEAD_KINDS)}")
    directory = _head_directory(source, revision)
    raw_config = _read_config(directory, source)
    weights_file = _weights_file(directory, source)
    state = _read_weights(weights_file, source)
    format = detect_format(raw_config, state, source)
    found_kind = "eagle" if format == "eagle" else "eagle3"
    if found_kind != kind:
        raise SpecbenchError(f"head {source} is an {found_kind} head (format {format}) but drafter kind {kind} "
                             f"needs an {kind} head; use {DRAFTERS_OF_KIND[found_kind]}")
    config = parse_config(raw_config, format, state, source)
    if feature_layers is not None:
        config = _replace(config, feature_layers=tuple(feature_layers))
    state = _internal_names(state, format)
    _check_config_fits(config, target, source)
    layers = resolve_feature_layers(config, target.num_layers)
    if config.kind == "eagle3":
        config = _replace(config, feature_layers=layers)
    _check_keys(config, state, source)
    _check_shapes(config, state, source, target)
    if config.kind == "eagle":
        _check_embedding(state[EMBEDDING_KEY], target.weights.input_embeddings(), source, target.name)
    _check_d2t(state.get("d2t"), config, source, target)

    target_embedding = target.weights.input_embeddings()
    with torch.device("meta"):  # no random initialisation of weights that are about to be replaced
        head = EagleHead(config, target.weights.output_layer() if config.kind == "eagle" else None)
    if EMBEDDING_KEY not in state:
        state[EMBEDDING_KEY] = target_embedding.detach()  # shared, not copied: the head never changes it
    head.load_state_dict(state, strict=True, assign=True)
    head.to(device=target.device, dtype=target.dtype)
    head.eval()
    head.requires_grad_(False)
    if config.verifier and Path(config.verifier).name != Path(str(target.source)).name:
        log.warning("head %s names verifier %s, but the target is %s (%s); its drafts may be poor",
                    source, config.verifier, target.name, target.source)
    return head


def _replace(config: HeadConfig, **changes) -> HeadConfig:
    values = asdict(config)
    values.update(changes)
    return HeadConfig(**values)


def _head_directory(source: str, revision: str | None, what: str = "EAGLE head") -> Path:
    """The local directory of ``source``: itself when it is one, else a hub id's snapshot (the cache first).
    ``what`` names the checkpoint in the errors (the Medusa heads' loader shares this)."""
    source = str(source)
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source.startswith(("/", ".", "~")) or path.exists() or source.count("/") != 1:
        raise SpecbenchError(f"{what} {source} is not a directory holding a head checkpoint, nor a hub id "
                             f"(owner/name)")
    from specbench import hub_cache

    cached = hub_cache.cached_snapshot(source, revision)
    if cached is not None:
        return cached
    unavailable = (f"{what} {source} is not in the local Hugging Face cache and the hub is unreachable; "
                   f"download it where the hub can be reached (`hf download {source}`) or pass "
                   f"drafter.head.path=/dir/of/head")
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_cache.hub_reachable():
        raise SpecbenchError(unavailable)
    from huggingface_hub import snapshot_download

    log.info("%s %s is not in the local Hugging Face cache; downloading it", what, source)
    try:
        return Path(snapshot_download(source, revision=revision))
    except Exception as error:  # any hub failure (offline, unknown id, no access) means the same to the user
        from specbench.storage.refusal import refusal_of

        refusal = refusal_of(error)  # a full or read-only cache is not the hub's fault
        if refusal is not None:
            raise refusal from error
        raise SpecbenchError(f"{what} {source} could not be downloaded ({type(error).__name__}); check the id, "
                             f"or download it (`hf download {source}`) and pass drafter.head.path=/dir/of/head"
                             ) from error


def _read_config(directory: Path, source: str, what: str = "EAGLE head") -> dict:
    file = directory / "config.json"
    if not file.is_file():
        raise SpecbenchError(f"{what} {source} has no config.json in {directory}")
    try:
        config = json.loads(file.read_text())
    except Exception as error:  # OSError, not UTF-8, not JSON, RecursionError (deep nesting): damaged all the same
        raise SpecbenchError(f"{what} {source}: {file} is not readable JSON ({damage_reason(error)})") from None
    if not isinstance(config, dict):
        raise SpecbenchError(f"{what} {source}: {file} holds {type(config).__name__}, not a config object")
    return config


def _weights_file(directory: Path, source: str) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise SpecbenchError(f"EAGLE head {source} has no weights in {directory}: expected {' or '.join(WEIGHT_FILES)}")


def _read_weights(file: Path, source: str, what: str = "EAGLE head") -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(file))
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # safetensors' own error, pickle's, or OSError: a damaged or truncated download
        raise SpecbenchError(f"{what} {source}: weight file {file} is damaged or unreadable "
                             f"({type(error).__name__}: {' '.join(str(error).split())[:200]})") from error
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise SpecbenchError(f"{what} {source}: {file} does not hold a dict of weights")
    return state


def detect_format(config: dict, state: dict, source: str) -> str:
    """Which of FORMATS a checkpoint is in, from its config (speculators') or its weight names (EAGLE's)."""
    if "speculators_config" in config or "speculators_model_type" in config:
        return "speculators"
    if any(key.startswith("midlayer.") for key in state):
        return "eagle3"
    fc = state.get("fc.weight")
    # EAGLE-1's format is told by its fc's width, 2 x hidden_size: a hidden_size that is no count is named first
    hidden = _config_count(config, "hidden_size", source) if "hidden_size" in config else None
    if any(key.startswith("layers.0.") for key in state) and fc is not None and fc.ndim == 2 \
            and fc.shape[1] == 2 * (hidden or -1):
        return "eagle"
    raise SpecbenchError(f"EAGLE head {source} is in no known format: no speculators_config in config.json, no "
                         f"midlayer.* weights (EAGLE-3), no layers.0.* weights with fc in-features 2 x hidden_size "
                         f"(EAGLE-1); formats: {', '.join(FORMATS)}")


def parse_config(raw: dict, format: str, state: dict, source: str) -> HeadConfig:
    """The HeadConfig of a checkpoint's config.json in ``format``."""
    if format == "speculators":
        model_type = raw.get("speculators_model_type")
        if model_type != "eagle3":
            raise SpecbenchError(f"EAGLE head {source} is a speculators {model_type!r} model; supported: eagle3")
        for key, supported in (("norm_before_residual", False), ("norm_before_fc", False)):
            if bool(raw.get(key, False)) != supported:
                raise SpecbenchError(f"EAGLE head {source} sets {key}={raw.get(key)}; supported: {supported} "
                                     f"(EAGLE-3's own layout)")
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise SpecbenchError(f"EAGLE head {source}: its speculators config.json has no transformer_layer_config")
        verifier = (raw.get("speculators_config") or {}).get("verifier") or {}
        verifier_name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
        feature_layers = raw.get("eagle_aux_hidden_state_layer_ids")
        draft_vocab, target_hidden = raw.get("draft_vocab_size"), raw.get("target_hidden_size")
        fc_bias = "fc.bias" in state  # older speculators exports built fc with a bias
    else:
        layer = raw
        verifier_name = raw.get("verifier")
        feature_layers = raw.get("eagle_aux_hidden_state_layer_ids")
        draft_vocab = raw.get("draft_vocab_size") if format == "eagle3" else None
        target_hidden = raw.get("target_hidden_size") if format == "eagle3" else None
        fc_bias = bool(raw.get("bias", True)) if format == "eagle" else False
    layer_count = layer.get("num_hidden_layers", 1)
    if not isinstance(layer_count, int) or isinstance(layer_count, bool) or layer_count != 1:  # true == 1.0 == 1
        raise SpecbenchError(f"EAGLE head {source} has num_hidden_layers={layer_count!r}; supported: 1")
    if not isinstance(raw.get("bias", True), bool):  # bool("false") is true
        raise SpecbenchError(f"EAGLE head {source}: config.json sets bias={raw.get('bias')!r}; it must be true or false")
    activation = layer.get("hidden_act", "silu")
    if activation != "silu":
        raise SpecbenchError(f"EAGLE head {source} has hidden_act={activation!r}; supported: silu")
    missing = [key for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
               if key not in layer]
    if missing:
        raise SpecbenchError(f"EAGLE head {source}: its config lacks {', '.join(missing)}")
    hidden, heads = _config_count(layer, "hidden_size", source), _config_count(layer, "num_attention_heads", source)
    theta, scaling = _rope_of(layer)
    vocab = _config_count(layer, "vocab_size", source)
    # the others as read, by the names config.json gives them (draft_vocab_size and target_hidden_size at its top)
    outer = raw if format == "speculators" else layer
    return HeadConfig(
        kind="eagle" if format == "eagle" else "eagle3", hidden_size=hidden,
        intermediate_size=_config_count(layer, "intermediate_size", source), num_attention_heads=heads,
        num_key_value_heads=_config_count(layer, "num_key_value_heads", source, heads),
        head_dim=_config_count(layer, "head_dim", source, hidden // heads or 1),
        rms_norm_eps=_config_real(layer, "rms_norm_eps", source, DEFAULT_RMS_NORM_EPS),
        rope_theta=_config_real({"rope_theta": theta}, "rope_theta", source, DEFAULT_ROPE_THETA) if theta is not None
        else DEFAULT_ROPE_THETA, rope_scaling=scaling, vocab_size=vocab,
        draft_vocab_size=_config_count(outer, "draft_vocab_size", source, vocab) if draft_vocab is not None else vocab,
        target_hidden_size=_config_count(outer, "target_hidden_size", source, hidden) if target_hidden is not None
        else hidden,
        feature_layers=tuple(feature_layers) if feature_layers is not None else None, fc_bias=fc_bias,
        verifier=verifier_name, format=format)


def _internal_names(state: dict, format: str) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under the module's names (speculators'), without the ones the head ignores."""
    renamed = {}
    for key, tensor in state.items():
        if key.endswith(IGNORED_SUFFIXES) or key.startswith(IGNORED_PREFIXES) or key in IGNORED_KEYS:
            continue
        if format == "eagle3" and key.startswith("midlayer."):
            key = "layers.0." + key[len("midlayer."):]
        renamed[key] = tensor
    return renamed


def _file_names(state: dict, format: str) -> dict[str, torch.Tensor]:
    """The module's weights under ``format``'s names."""
    if format != "eagle3":
        return dict(state)
    return {("midlayer." + key[len("layers.0."):] if key.startswith("layers.0.") else key): tensor
            for key, tensor in state.items()}


def _listed(keys, limit: int = 5) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _expected_keys(config: HeadConfig) -> tuple[set[str], set[str]]:
    """(required, optional) weight names of a head with ``config``, under the module's names."""
    with torch.device("meta"):
        names = set(EagleHead(config, nn.Identity()).state_dict())
    optional = {EMBEDDING_KEY} if config.kind == "eagle3" and config.hidden_size == config.target_hidden_size \
        else set()
    return names - optional, optional


def _check_keys(config: HeadConfig, state: dict, source: str) -> None:
    required, optional = _expected_keys(config)
    missing, unexpected = required - set(state), set(state) - required - optional
    if missing or unexpected:
        in_file = lambda keys: _file_names(dict.fromkeys(keys), config.format)  # the names the user can look up
        parts = ([f"missing {_listed(in_file(missing))}"] if missing else []) + \
                ([f"unexpected {_listed(in_file(unexpected))}"] if unexpected else [])
        raise SpecbenchError(f"EAGLE head {source} ({config.format} format) does not match its config: "
                             f"{'; '.join(parts)}")


def _check_config_fits(config: HeadConfig, target, source: str) -> None:
    """The config-level checks of a head against ``target``: vocabulary and feature width."""
    if config.vocab_size != target.vocab_size:
        raise SpecbenchError(f"head {source} was trained for a vocabulary of {config.vocab_size} tokens, target "
                             f"{target.name} has {target.vocab_size}")
    hidden = target.weights.hidden_size
    if config.target_hidden_size != hidden:
        raise SpecbenchError(f"head {source} reads target features of width {config.target_hidden_size}, target "
                             f"{target.name} has hidden size {hidden}")


def _check_shapes(config: HeadConfig, state: dict, source: str, target) -> None:
    hidden = target.weights.hidden_size
    fc_in = state["fc.weight"].shape[1] if state["fc.weight"].ndim == 2 else None
    if fc_in != config.fc_in_features:
        what = (f"{config.num_features} feature layers x target hidden {hidden}" if config.kind == "eagle3"
                else f"embedding {config.hidden_size} + target hidden {hidden}")
        raise SpecbenchError(f"head {source} has fc in-features {fc_in}, but target {target.name} needs {what} = "
                             f"{config.fc_in_features}")
    with torch.device("meta"):
        expected = {key: tuple(value.shape) for key, value in EagleHead(config, nn.Identity()).state_dict().items()}
    wrong = [f"{key} {list(state[key].shape)} (config says {list(shape)})" for key, shape in expected.items()
             if key in state and tuple(state[key].shape) != shape]
    if wrong:
        raise SpecbenchError(f"EAGLE head {source}: weights of the wrong shape: {_listed(wrong, 3)}")


def _check_embedding(head_embedding: torch.Tensor, target_embedding: torch.Tensor, source: str, target_name: str
                     ) -> None:
    """The decisive check that an EAGLE-1 head belongs to this target: its embedding copy is the target's (two
    7B Llamas have the same shapes and different embeddings). Compares evenly spaced rows by relative distance,
    with a tolerance of the coarser of the two dtypes."""
    rows = torch.linspace(0, head_embedding.shape[0] - 1, min(EMBEDDING_SAMPLE_ROWS, head_embedding.shape[0]))
    rows = rows.round().long()
    head_rows = head_embedding[rows].float().cpu()
    target_rows = target_embedding.detach()[rows.to(target_embedding.device)].float().cpu()
    coarser = max(torch.finfo(head_embedding.dtype).eps, torch.finfo(target_embedding.dtype).eps)
    distance = (head_rows - target_rows).norm(dim=1)
    scale = target_rows.norm(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    worst = float((distance / scale).max())
    if worst > 4 * coarser:
        raise SpecbenchError(f"head {source} was trained for another target: its embedding copy differs from "
                             f"{target_name}'s (relative difference {worst:.3g} in sampled rows, tolerance "
                             f"{4 * coarser:.1g})")


def _check_d2t(d2t: torch.Tensor | None, config: HeadConfig, source: str, target) -> None:
    if d2t is None:
        return
    if d2t.ndim != 1 or d2t.shape[0] != config.draft_vocab_size or d2t.dtype.is_floating_point:
        raise SpecbenchError(f"head {source}: d2t must be {config.draft_vocab_size} integer offsets, got "
                             f"{d2t.dtype} {list(d2t.shape)}")
    ids = torch.arange(d2t.shape[0]) + d2t.long()
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= target.vocab_size:
        raise SpecbenchError(f"head {source}: its d2t maps draft ids to target ids {low}..{high}, outside target "
                             f"{target.name}'s vocabulary 0..{target.vocab_size - 1}")




def save_eagle_head(head: EagleHead, directory: str | Path, format: str) -> None:
    """Write ``head`` into ``directory`` as config.json and weights in ``format`` (see the module docstring), each
    file through a temporary name and a rename, so a crash leaves the old file or the new one, never half of one."""
    config = head.config
    if format not in FORMATS_OF_KIND[config.kind]:
        raise SpecbenchError(f"an {config.kind} head cannot be written in format {format!r}; its formats: "
                             f"{', '.join(FORMATS_OF_KIND[config.kind])}")
    directory = Path(directory)
    state = {key: value.detach().to("cpu").contiguous().clone() for key, value in head.state_dict().items()}
    if config.kind == "eagle3" and config.hidden_size == config.target_hidden_size:
        del state[EMBEDDING_KEY]  # loaded from the target, as EAGLE-3 and vLLM do
    if "d2t" in state:
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(config.draft_vocab_size) + state["d2t"]] = True
        state["t2d"] = t2d
    dtype = str(head.fc.weight.dtype).removeprefix("torch.")
    with refusing_writes(directory):
        directory.mkdir(parents=True, exist_ok=True)
        weights_name = "pytorch_model.bin" if format == "eagle" else "model.safetensors"
        write_atomically(directory / weights_name, lambda path: _write_weights(_file_names(state, format), path))
        text = json.dumps(_config_dict(config, format, dtype), indent=2) + "\n"
        write_atomically(directory / "config.json", lambda path: path.write_text(text))
        for other in WEIGHT_FILES:  # a loader must not find an older head's weights beside the new ones
            if other != weights_name and (directory / other).exists():
                (directory / other).unlink()


def _write_weights(state: dict, path: Path) -> None:
    if path.name.endswith(".safetensors") or ".safetensors." in path.name:
        from safetensors.torch import save_file

        save_file(state, str(path), metadata={"format": "pt"})
    else:
        with open(path, "wb") as handle:  # a file object: a full disk reaches the error as its OSError (errno)
            torch.save(state, handle)


def _llama_dict(config: HeadConfig, dtype: str) -> dict:
    """The Llama config of the head's decoder layer, as EAGLE's configs and speculators' transformer_layer_config
    spell it (transformers 4 names, which EAGLE's EConfig reads)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "num_hidden_layers": 1, "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling, "vocab_size": config.vocab_size,
        "tie_word_embeddings": False, "torch_dtype": dtype,
    }


def _config_dict(config: HeadConfig, format: str, dtype: str) -> dict:
    layers = list(config.feature_layers) if config.feature_layers is not None else None
    if format == "speculators":
        return {
            "speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"],
            "transformer_layer_config": _llama_dict(config, dtype), "draft_vocab_size": config.draft_vocab_size,
            "norm_before_residual": False, "target_hidden_size": config.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": layers,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": SPECULATIVE_TOKENS}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": config.verifier, "architectures": ["LlamaForCausalLM"]},
            },
        }
    values = _llama_dict(config, dtype)
    if format == "eagle":
        values["bias"] = config.fc_bias
    else:
        values["draft_vocab_size"] = config.draft_vocab_size
        if config.target_hidden_size != config.hidden_size:
            # only then: EAGLE-3's loader takes the key's presence to mean the embedding is in the head's file
            values["target_hidden_size"] = config.target_hidden_size
    # Not read by EAGLE's code; kept so that specbench reloads the head as it was trained.
    if layers is not None:
        values["eagle_aux_hidden_state_layer_ids"] = layers
    if config.verifier is not None:
        values["verifier"] = config.verifier
    return values
