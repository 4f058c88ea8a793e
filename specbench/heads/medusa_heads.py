"""Medusa-1 heads (Cai et al. 2024; FasterDecoding/Medusa), the directory format their authors publish them in, the
loader's checks that a head fits its target, and the writer of the same format.

A Medusa head ``k`` (0-based) reads the target's final, post-norm hidden state at a position p and predicts the
token k + 2 positions after p (the target's own lm_head predicts the one at p + 1): ``layers`` residual blocks
``x + SiLU(Linear(x))``, then a Linear(hidden, vocab) of its own, initialised as a copy of the target's lm_head. The
heads are independent of each other and of the draft tree's path.

The published format (FasterDecoding/medusa-vicuna-7b-v1.3 and its 13B, 33B siblings)::

    config.json               {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": ...}
    medusa_lm_head.safetensors or medusa_lm_head.pt
                              the state dict of Medusa's ``medusa_head`` ModuleList, keys ``{i}.{j}.linear.weight``,
                              ``{i}.{j}.linear.bias`` (block j < L of head i) and ``{i}.{L}.weight`` (head i's lm_head)

A full-model export names the same weights under ``medusa_head.``; the loader takes either spelling. The heads'
count is read from the weights, not the config: the uploaded configs name fewer heads than their files hold (Medusa
``medusa/model/medusa_model.py:143`` @e2a5d20 overrides it to 5 for that reason), and Spec-Bench drafts with the
first 4 (``evaluation/inference_medusa.py:200``). Loading is strict: Medusa's own (``strict=False``) leaves a
misnamed weight at its initial value, which then drafts the target's own next token at every depth.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specbench.errors import SpecbenchError
from specbench.heads.eagle_head_files import _head_directory, _listed, _read_config, _read_weights, _write_weights
from specbench.storage.atomic import write_atomically
from specbench.storage.refusal import refusing_writes

log = logging.getLogger(__name__)

WHAT = "Medusa head"
WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")  # the first found is read
WRITTEN_FILE = "medusa_lm_head.safetensors"  # what Medusa's trainer writes (medusa/train/train_legacy.py:416-419)
FULL_MODEL_PREFIX = "medusa_head."
# {i}.{j}.linear.weight / .linear.bias (a residual block) or {i}.{j}.weight (the head's lm_head, j = layers)
KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


@dataclass(frozen=True)
class MedusaConfig:
    """The shape of a set of Medusa heads."""

    num_heads: int       # K heads; head k predicts the token k + 2 positions after the state it reads
    num_layers: int      # residual blocks per head before its lm_head
    hidden_size: int     # the target's hidden size
    vocab_size: int      # the target's vocabulary (rows of each head's lm_head)
    base_model: str | None = None  # base_model_name_or_path: the target it was trained for


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)); Medusa zero-initialises the weight (the bias keeps torch's default), so a new block
    passes the target's state through unchanged."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = nn.SiLU()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.act(self.linear(hidden))


class MedusaHeads(nn.Module):
    """K Medusa heads over the target's final post-norm state (see the module docstring).

    ``forward(hidden)``: hidden [..., H] -> logits [K, ..., vocab], head k's at index k."""

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*(ResBlock(config.hidden_size) for _ in range(config.num_layers)),
                          nn.Linear(config.hidden_size, config.vocab_size, bias=False))
            for _ in range(config.num_heads))

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head ``k``'s logits [..., vocab] over ``hidden`` [..., H]."""
        return self.medusa_head[k](hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.head_logits(k, hidden) for k in range(self.config.num_heads)])

    def truncated(self, num_heads: int) -> MedusaHeads:
        """The first ``num_heads`` heads (the drafter may read fewer than the checkpoint holds), sharing weights."""
        if num_heads == self.config.num_heads:
            return self
        config = MedusaConfig(num_heads, self.config.num_layers, self.config.hidden_size, self.config.vocab_size,
                              self.config.base_model)
        with torch.device("meta"):
            kept = MedusaHeads(config)
        kept.medusa_head = nn.ModuleList(self.medusa_head[:num_heads])
        return kept


def new_medusa_heads(config: MedusaConfig, output_layer_weight: torch.Tensor) -> MedusaHeads:
    """Heads initialised as Medusa does: each block's linear weight zero (an identity block), its bias torch's
    default, each head's lm_head a copy of the target's (``output_layer_weight`` [vocab, H])."""
    if tuple(output_layer_weight.shape) != (config.vocab_size, config.hidden_size):
        raise SpecbenchError(f"the target's lm_head is {list(output_layer_weight.shape)}, Medusa heads of this config "
                             f"need [{config.vocab_size}, {config.hidden_size}]")
    heads = MedusaHeads(config)
    with torch.no_grad():
        for head in heads.medusa_head:
            for block in head[:-1]:
                block.linear.weight.zero_()
            head[-1].weight.copy_(output_layer_weight)
    return heads


# ---- the published format ----------------------------------------------------------------------------------------


def _config_count(raw: dict, key: str, source: str, default: int | None) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecbenchError(f"{WHAT} {source}: config.json sets {key}={value!r}; it must be a positive integer")
    return value


def _weights_file(directory: Path, source: str) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise SpecbenchError(f"{WHAT} {source} has no weights in {directory}: expected {' or '.join(WEIGHT_FILES)}")


def _file_state(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The weights under Medusa-1's own names (``{i}.{j}...``), also from a full-model export (``medusa_head.``)."""
    prefixed = [key for key in state if key.startswith(FULL_MODEL_PREFIX)]
    if prefixed and len(prefixed) != len(state):
        raise SpecbenchError(f"{WHAT} {source} mixes {FULL_MODEL_PREFIX}* weights with others: "
                             f"{_listed(set(state) - set(prefixed))}")
    return {key[len(FULL_MODEL_PREFIX):]: value for key, value in state.items()} if prefixed else dict(state)


def _heads_in(state: dict[str, torch.Tensor], layers: int, source: str) -> int:
    """How many heads the weights hold, after checking that they are exactly heads 0..K-1 of ``layers`` blocks."""
    unexpected = [key for key in state if not KEY.match(key)]
    indices = sorted({int(KEY.match(key).group(1)) for key in state if KEY.match(key)})
    if not indices:
        raise SpecbenchError(f"{WHAT} {source} holds no Medusa head weights ({{i}}.{{j}}.linear.weight, "
                             f"{{i}}.{layers}.weight){'; it holds ' + _listed(state) if state else ''}")
    count = indices[-1] + 1
    expected = set()
    for head in range(count):
        expected |= {f"{head}.{block}.linear.{part}" for block in range(layers) for part in ("weight", "bias")}
        expected.add(f"{head}.{layers}.weight")
    missing = expected - set(state)
    unexpected += [key for key in state if KEY.match(key) and key not in expected]
    if missing or unexpected:
        parts = ([f"missing {_listed(missing)}"] if missing else []) + \
                ([f"unexpected {_listed(unexpected)}"] if unexpected else [])
        raise SpecbenchError(f"{WHAT} {source} does not match medusa_num_layers={layers}: {'; '.join(parts)}")
    return count


def _check_shapes(state: dict[str, torch.Tensor], config: MedusaConfig, source: str, target) -> None:
    hidden, vocab = target.weights.hidden_size, target.vocab_size
    lm_head = state[f"0.{config.num_layers}.weight"]
    if lm_head.ndim != 2:
        raise SpecbenchError(f"{WHAT} {source}: its lm_head weight is {list(lm_head.shape)}, not a matrix")
    if lm_head.shape[1] != hidden:
        raise SpecbenchError(f"{WHAT} {source} reads target states of width {lm_head.shape[1]}, target "
                             f"{target.name} has hidden size {hidden}")
    if lm_head.shape[0] != vocab:
        raise SpecbenchError(f"{WHAT} {source} was trained for a vocabulary of {lm_head.shape[0]} tokens, target "
                             f"{target.name} has {vocab}")
    with torch.device("meta"):
        expected = {key: tuple(value.shape) for key, value in MedusaHeads(config).state_dict().items()}
    wrong = [f"{key} {list(state[key].shape)} (expected {list(shape)})"
             for key, shape in ((key[len(FULL_MODEL_PREFIX):], shape) for key, shape in expected.items())
             if tuple(state[key].shape) != shape]
    if wrong:
        raise SpecbenchError(f"{WHAT} {source}: weights of the wrong shape: {_listed(wrong, 3)}")


def load_medusa_heads(target, source: str, revision: str | None = None, num_heads: int | None = None) -> MedusaHeads:
    """The Medusa heads in ``source`` (a local directory or a hub id, the local Hugging Face cache first), the first
    ``num_heads`` of them (None: all the file holds), checked against ``target``, on its device and dtype, frozen."""
    directory = _head_directory(str(source), revision, WHAT)
    raw = _read_config(directory, source, WHAT)
    layers = _config_count(raw, "medusa_num_layers", source, 1)  # MedusaConfig's default
    named_heads = _config_count(raw, "medusa_num_heads", source, None)
    state = _file_state(_read_weights(_weights_file(directory, source), source, WHAT), source)
    count = _heads_in(state, layers, source)
    if named_heads is not None and named_heads != count:
        log.info("%s %s: config.json names %d heads, its weights hold %d (read from the weights)", WHAT, source,
                 named_heads, count)
    base_model = raw.get("base_model_name_or_path")
    config = MedusaConfig(count, layers, target.weights.hidden_size, target.vocab_size,
                          base_model if isinstance(base_model, str) else None)
    _check_shapes(state, config, source, target)
    if num_heads is not None and num_heads > count:
        raise SpecbenchError(f"{WHAT} {source} holds {count} heads; drafter.heads={num_heads} needs at least that "
                             f"many (choose drafter.heads <= {count}, or a tree no deeper than {count})")
    with torch.device("meta"):  # no random initialisation of weights that are about to be replaced
        heads = MedusaHeads(config)
    heads.load_state_dict({FULL_MODEL_PREFIX + key: value for key, value in state.items()}, strict=True, assign=True)
    heads = heads.truncated(num_heads or count)
    heads.to(device=target.device, dtype=target.dtype)
    heads.eval()
    heads.requires_grad_(False)
    if config.base_model and Path(config.base_model).name != Path(str(target.source)).name:
        log.warning("%s %s was trained for %s, but the target is %s (%s); its drafts may be poor", WHAT, source,
                    config.base_model, target.name, target.source)
    return heads


def save_medusa_heads(heads: MedusaHeads, directory: str | Path) -> None:
    """Write ``heads`` into ``directory`` in Medusa's published format (config.json and medusa_lm_head.safetensors
    with Medusa-1's key names), each file through a temporary name and a rename."""
    config = heads.config
    directory = Path(directory)
    # no copy of heads already on the host: SmolLM2's 4 lm_heads alone are 453 MB in float32
    state = {key[len(FULL_MODEL_PREFIX):]: value.detach().to("cpu").contiguous()
             for key, value in heads.state_dict().items()}
    values = {"medusa_num_heads": config.num_heads, "medusa_num_layers": config.num_layers,
              "base_model_name_or_path": config.base_model,
              # not read by Medusa's code; a reader can check a head's fit before loading its weights
              "hidden_size": config.hidden_size, "vocab_size": config.vocab_size}
    text = json.dumps(values, indent=2) + "\n"
    with refusing_writes(directory):
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(directory / WRITTEN_FILE, lambda path: _write_weights(state, path))
        write_atomically(directory / "config.json", lambda path: path.write_text(text))
        for other in WEIGHT_FILES:  # a loader must not find an older head's weights beside the new ones
            if other != WRITTEN_FILE and (directory / other).exists():
                (directory / other).unlink()
