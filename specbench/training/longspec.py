"""Training LongSpec's drafter layer (kind ``longspec``) for any target, the hooks the head trainer calls (see
``specbench.training.heads`` for the data, the ``Batch`` and its index conventions).

LongSpec's recipe (sail-sg/LongSpec @15e4998, ``longspec/train``): the target is frozen; its last layer's keys and
values feed the drafter's cross-attention; the loss is plain next-token cross-entropy on the data
(``LlamaGlide.forward``, llama_glide.py:492-545: labels are the text, no distillation). Three stages: a short
pre-training on SlimPajama at 1,024 tokens with the anchor-offset positions, then long-context and long-CoT SFT at
32,768 tokens. specbench runs the first stage, scaled down, on its own data (``methods.DIFFERENCES`` says each
departure); the long stages need tens of thousands of tokens per sequence, which 2 CPU cores cannot train on.

What a training step does, as LongSpec's (train copy of llama_glide.py:123-140, 518-528):
- positions: a sequence of at most 1,200 tokens keeps positions 0..sink-1 for its first ``sink`` tokens (0 to 4,
  drawn) and shifts the rest by an offset drawn from 0..max(min(30000, context - 1000) - L, 0): the drafter sees
  the large positions of long contexts while training on short text ("anchor-offset indices");
- cross-attention staleness: a ``pad`` of 1 to 4 is drawn; the query at index t sees the target's entries at
  indices <= t - pad (the first ``pad`` rows see none and get zeros), as drafting several tokens past the
  target's cache does.

Differences from the original's mechanics: the target's hidden states come from one pass at the natural positions
0..L-1 (the trainer computes every sequence's once, ``training.heads.target_sequences``), and the offset is applied
to the drafter's rotations and to the recomputed target keys; LongSpec also runs the target at the offset positions.
Relative positions inside the target are the same either way except across the sink boundary.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specbench.errors import SpecbenchError

KINDS = ("longspec",)
# anchor_offset: stage 1's anchor-offset positions (off: positions 0..L-1); stale_max: the largest cross-attention
# staleness drawn (LongSpec: randint(1, 4)).
METHOD_SETTINGS = {"longspec": {"anchor_offset": True, "stale_max": 4}}
SINK_MAX = 4  # random.randint(0, 4), llama_glide.py:522 (train copy)
OFFSET_LIMIT = 30000  # min(30000, model_max_length - 1000), :523
SHORT_SEQUENCE = 1200  # the anchor-offset applies at or under this many tokens, :519
# Stage 1 of LongSpec's recipe (longspec/train/conf/exp/qwq_glide_8gpu_slim6b.yaml and the DeepSpeed config it
# names, train_hybrid_engine_zero1_optim_offload_cosine.yaml; 8 GPUs).
PUBLISHED = {"longspec": {
    "epochs": 1,
    "lr": 5e-4,
    "schedule": "cosine",
    "warmup_ratio": 0.1,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "grad_clip_by": "norm",
    "betas": (0.9, 0.95),
    "batch_sequences": 2048,  # 2 per GPU x 128 accumulated x 8 GPUs
    "seed": 42,
    "precision": "fp16 (bfloat16 weights)",
    "max_length": 1024,
    "data": "SlimPajama-6B (plain text, every token labelled), then long-context and long-CoT SFT at 32,768 tokens",
    "anchor_offset": True,
    "stale_max": 4,
}}
_CONFIG = "sail-sg/LongSpec longspec/train/conf/exp/qwq_glide_8gpu_slim6b.yaml"
SOURCES = {"longspec": {
    "epochs": f"{_CONFIG}:119 @15e4998",
    "lr": f"{_CONFIG}:109 @15e4998",
    "schedule": f"{_CONFIG}:3 @15e4998 (deepspeed train_hybrid_engine_zero1_optim_offload_cosine: WarmupCosineLR)",
    "warmup_ratio": f"{_CONFIG}:121 @15e4998",
    "weight_decay": f"{_CONFIG}:112 @15e4998",
    "grad_clip": f"{_CONFIG}:118 @15e4998",
    "grad_clip_by": f"{_CONFIG}:118 @15e4998 (max_grad_norm: DeepSpeed's gradient_clipping, a global norm)",
    "betas": f"{_CONFIG}:161 @15e4998 (the ds_cfg optimizer's betas, which the top-level adam_betas at :114 does "
             "not reach)",
    "batch_sequences": f"{_CONFIG}:106, 111 @15e4998 (x 8 GPUs, train/train.sh:2)",
    "seed": f"{_CONFIG}:136 @15e4998",
    "precision": f"{_CONFIG}:138-140, 164-166 @15e4998",
    "max_length": f"{_CONFIG}:77 @15e4998",
    "data": f"{_CONFIG}:15 @15e4998; the later stages: ..._longv2-32k-zero3_5e-6-ligce-nomask.yaml:15, 60-62, 94",
    "anchor_offset": "sail-sg/LongSpec longspec/train/models/llama_glide.py:518-528 @15e4998",
    "stale_max": "sail-sg/LongSpec longspec/test/llama_glide.py:123-140 @15e4998 (random.randint(1, 4))",
}}

# Seconds per 1000 trained tokens on the development machine's 2 CPU cores, for the estimate said before a build:
# the default build for SmolLM2-135M, 290 steps of 4 sequences at 1.4 steps a second alone on the machine, most of
# it the target's 49,152-row lm_head over every token, forward and back.
SECONDS_PER_KILO_TOKEN = {"longspec": 0.75}
# LongSpec's loss reads the data's tokens, not the target's distributions.
READS_LABELS = False


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise SpecbenchError(f"LongSpec kind {kind!r} is unknown; choose one of {', '.join(KINDS)}")


def check(kind: str, settings: dict) -> None:
    _check_kind(kind)
    if settings["stale_max"] < 1:
        raise SpecbenchError(f"longspec training stale_max must be an integer >= 1 (the drafter never sees the "
                             f"target's entry at its own position), got {settings['stale_max']}")


def feature_layers(kind: str, num_layers: int, recipe) -> tuple[int, ...]:
    """The last decoder layer's input (hidden state ``num_layers - 1``), from which its cache entries are
    recomputed (``targets.layer_keys``)."""
    _check_kind(kind)
    return (num_layers - 1,)


def new_head(target, kind: str, recipe, sequences):
    """A fresh layer as LongSpec initialises it (``heads.longspec_heads.new_longspec_head``), seeded by the
    recipe, float32 on the host, attached to float32 copies of the target's parts it reads."""
    from specbench.heads.longspec_heads import attach_to, glide_config_for, new_longspec_head

    _check_kind(kind)
    head = new_longspec_head(glide_config_for(target), torch.Generator().manual_seed(recipe.seed))
    head.context_length = int(target.weights.architecture.get("max_position_embeddings") or OFFSET_LIMIT + 1000)
    return attach_to(head, target, torch.float32)


def place(head, kind: str, device: torch.device):
    """The layer and the target parts it reads on ``device``."""
    _check_kind(kind)
    head.to(device)
    parts = head._target
    parts["kv"] = parts["kv"].to(device)
    parts["embedding"] = parts["embedding"].to(device)
    parts["output"] = parts["output"].to(device)
    return head


def _positions(length: int, context_length: int, anchor_offset: bool, draw) -> torch.LongTensor:
    """The training positions of a batch ``length`` wide: 0..length-1, or the anchor-offset ones (see the module
    docstring). ``draw(low, high)`` returns an integer in [low, high], as random.randint."""
    positions = torch.arange(length)
    if anchor_offset and length <= SHORT_SEQUENCE:
        sink = draw(0, SINK_MAX)
        offset = draw(0, max(min(OFFSET_LIMIT, context_length - 1000) - length, 0))
        positions[sink:] += offset
    return positions


def _draw(generator: torch.Generator):
    return lambda low, high: int(torch.randint(low, high + 1, (), generator=generator))


def window_visible(queries: torch.LongTensor, keys: torch.LongTensor, window: int) -> torch.BoolTensor:
    """[n, S] whether the query at index queries[i] sees the key at index keys[j]: causal, at most ``window`` back
    (flash-attention's ``window_size=(window, -1)``)."""
    distance = queries[:, None] - keys[None, :]
    return (distance >= 0) & (distance <= window)


def loss(head, labels, batch, kind: str, recipe, generator) -> tuple[torch.Tensor, dict[str, float]]:
    """LongSpec's loss on one batch: the mean cross-entropy of the next token at every index of every sequence
    (its text is all labelled, as stage 1's plain-text data), with the positions and staleness drawn from
    ``generator``; also the top-1 accuracy. ``labels`` is not read."""
    from specbench.heads.longspec_heads import WINDOW

    _check_kind(kind)
    settings = {**METHOD_SETTINGS[kind], **(recipe.method or {})}
    features = batch.features  # [B, T, H]: f_0..f_{T-1}
    count, width = features.shape[:2]
    device = features.device
    draw = _draw(generator)
    positions = _positions(width, head.context_length, settings["anchor_offset"], draw).to(device)
    stale = draw(1, settings["stale_max"])
    inputs, targets = batch.token_ids[:, :width], batch.token_ids[:, 1:width + 1]
    index = torch.arange(width, device=device)
    trained = index[None, :] < (batch.lengths[:, None] - 1)  # predicts a token of the sequence
    cos, sin = head.rotary(positions.expand(count, width))
    embeddings = head.embed(inputs)
    self_keys, self_values = head.self_entries(embeddings, cos, sin)
    target_keys, target_values = head.target_entries(features, positions.expand(count, width))
    self_visible = window_visible(index, index, WINDOW)[None].expand(count, -1, -1)
    target_visible = (index[None, :] <= index[:, None] - stale)[None].expand(count, -1, -1)
    out = head(embeddings, cos, sin, self_keys, self_values, self_visible, target_keys, target_values, target_visible)
    logits = head.logits(out[trained]).float()
    chosen = targets[trained]
    value = F.cross_entropy(logits, chosen)
    with torch.no_grad():
        top1 = float((logits.argmax(-1) == chosen).float().mean()) if chosen.numel() else 0.0
    return value, {"top1": top1}


@torch.no_grad()
def chain_tokens(head, labels, batch, kind: str, positions: int) -> torch.LongTensor:
    """The drafter's greedy chain after each index t, [B, T, positions], as it drafts: the root x_{t+1} at position
    t + 1 sees its own cache over x_0..x_{t+1} (a window of 512) and the target's entries at 0..t; the k-th chain
    token is fed at position t + 1 + k and sees the same plus its own chain. -1 past a sequence's end."""
    from specbench.heads.longspec_heads import WINDOW

    _check_kind(kind)
    count, width = batch.features.shape[:2]
    device = batch.features.device
    chain = torch.full((count, width, positions), -1, dtype=torch.long, device=device)
    for row in range(count):
        length = int(batch.lengths[row])
        drafts = length - 1  # indices t = 0..length-2 have a root x_{t+1}
        if drafts < 1:
            continue
        tokens = batch.token_ids[row, :length][None]
        index = torch.arange(length, device=device)
        cos, sin = head.rotary(index[None])
        embeddings = head.embed(tokens)
        keys, values = head.self_entries(embeddings, cos, sin)  # x_0..x_{L-1} at their positions
        target_keys, target_values = head.target_entries(batch.features[row, :drafts][None], index[None, :drafts])
        roots = torch.arange(drafts, device=device)  # index t; its query sits at position t + 1 + step
        target_visible = (index[None, :drafts] <= roots[:, None])[None]
        query_embeddings = embeddings[:, 1:length]
        for step in range(positions):
            at = roots + 1 + step
            query_cos, query_sin = head.rotary(at[None])
            true_visible = window_visible(at, index, WINDOW) & (index[None, :] <= roots[:, None] + 1)
            if step:
                chain_keys, chain_values = head.self_entries(query_embeddings, query_cos, query_sin)
                keys = torch.cat((keys, chain_keys), dim=2)
                values = torch.cat((values, chain_values), dim=2)
            own = torch.eye(drafts, dtype=torch.bool, device=device).repeat(1, step)  # its own chain tokens
            visible = torch.cat((true_visible, own), dim=1)[None]
            out = head(query_embeddings, query_cos, query_sin, keys, values, visible, target_keys, target_values,
                       target_visible)
            best = head.logits(out[0]).argmax(-1)
            chain[row, :drafts, step] = best
            query_embeddings = head.embed(best[None])
    return chain


def save(head, kind: str, directory: Path) -> None:
    """The layer in LongSpec's published form (``heads.longspec_heads.save_longspec_head``)."""
    from specbench.heads.longspec_heads import save_longspec_head

    _check_kind(kind)
    save_longspec_head(head, directory)


def load(target, directory, kind: str):
    """The layer at ``directory``, checked against ``target`` and attached to it: the drafter's own loader."""
    from specbench.heads.longspec_heads import load_longspec_head

    _check_kind(kind)
    return load_longspec_head(target, str(directory))

