"""The EAGLE kinds' hooks of the head trainer (``training.heads``): ``eagle`` (EAGLE-1's head, also EAGLE-2's) and
``eagle3``.

Recipes (the papers' code, SafeAILab/EAGLE ``eagle/train/main.py`` and ``eagle/traineagle3/``, @cb7e084):

- ``eagle``: SmoothL1 regression of the target's next feature plus ``p_weight`` x soft cross-entropy of the
  target's lm_head on the head's output against the target's distribution; uniform noise on the input features.
- ``eagle3``: a draft vocabulary of the ``draft_vocab_size`` most frequent target tokens (``d2t`` offsets), and
  "training-time test": the head is unrolled ``ttt_steps`` steps, each step fed its own previous outputs as EAGLE-3
  drafts, with soft cross-entropy against the target's distribution over the draft vocabulary at every step
  (weighted ``ttt_decay ** step``).

Index conventions (``training.heads``' docstring): the head's pair at index t is (feature f_t, token x_{t+1}) at
rotary position t; at unroll step j the pair at index t is (the head's own step j-1 output at t, token x_{t+1+j}) at
position t + j, and every step predicts the target's distribution at position t + 1 + j.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from specbench.errors import SpecbenchError
from specbench.heads.eagle_heads import rotate_half
from specbench.training.heads import Batch, Labels, Sequence, soft_cross_entropy

KINDS = ("eagle", "eagle3")
# feature_layers: () = the kind's own (EAGLE-1: the post-norm last state; EAGLE-3: 2, N/2, N-3).
METHOD_SETTINGS = {
    "eagle": {"feature_layers": (), "p_weight": 0.1, "v_weight": 1.0, "noise": 0.2},
    "eagle3": {"feature_layers": (), "draft_vocab_size": 4096, "ttt_steps": 2, "ttt_decay": 0.8},
}
NULLABLE = {"eagle3": ("draft_vocab_size",)}  # draft_vocab_size null: the target's whole vocabulary, no d2t
_EAGLE1 = "eagle/train/main.py"
_EAGLE3 = "eagle/traineagle3"
_AT = " @cb7e084"
PUBLISHED = {
    "eagle": {"epochs": 20, "lr": 3e-5, "schedule": "linear", "warmup_steps": 2000, "decay_steps": 800000,
              "weight_decay": 0.01, "grad_clip": 0.5, "grad_clip_by": "value", "betas": (0.9, 0.95),
              "batch_sequences": 4, "precision": "bfloat16",
              "data": "ShareGPT, 68,000 dialogues, with the dataset's own answers",
              "p_weight": 0.1, "v_weight": 1.0, "noise": 0.2},
    "eagle3": {"epochs": 40, "lr": 5e-5, "schedule": "linear", "warmup_steps": 12000, "decay_steps": 800000,
               "weight_decay": 0.0, "grad_clip": 0.5, "grad_clip_by": "norm", "betas": (0.9, 0.95),
               "batch_sequences": 1, "gradient_accumulation": 2, "precision": "float16",
               "data": "the target's own answers to ShareGPT and UltraChat prompts (a regenerated jsonl)",
               "ttt_steps": 7, "ttt_decay": 0.8, "draft_vocab_size": 32000},
}
SOURCES = {
    "eagle": {
        "epochs": f"{_EAGLE1}:19{_AT}", "lr": f"{_EAGLE1}:6{_AT} (--lr)",
        "schedule": f"{_EAGLE1}:333{_AT} (get_linear_schedule_with_warmup)", "warmup_steps": f"{_EAGLE1}:21{_AT}",
        "decay_steps": f"{_EAGLE1}:22{_AT} (total_steps)",
        "weight_decay": f"{_EAGLE1}:325{_AT} (AdamW without weight_decay: torch's default, 0.01)",
        "grad_clip": f"{_EAGLE1}:39{_AT}", "grad_clip_by": f"{_EAGLE1}:365{_AT} (clip_grad_value_)",
        "betas": f"{_EAGLE1}:37-38{_AT}", "batch_sequences": f"{_EAGLE1}:7{_AT} (--bs)",
        "precision": f"{_EAGLE1}:54{_AT} (mixed_precision='bf16')",
        "data": f"eagle/train/main_deepspeed.py:7{_AT} (sharegpt_0_67999)",
        "p_weight": f"{_EAGLE1}:23{_AT}", "v_weight": f"{_EAGLE1}:24{_AT}",
        "noise": f"{_EAGLE1}:29-32, 128{_AT} (uniform, (U - 0.5) x 0.2 x 512 / length)",
    },
    "eagle3": {
        "epochs": f"{_EAGLE3}/main.py:22{_AT}", "lr": f"{_EAGLE3}/ds_config.json:27{_AT} (warmup_max_lr)",
        "schedule": f"{_EAGLE3}/ds_config.json:24{_AT} (WarmupDecayLR)",
        "warmup_steps": f"{_EAGLE3}/ds_config.json:28{_AT}",
        "decay_steps": f"{_EAGLE3}/ds_config.json:29{_AT} (total_num_steps)",
        "weight_decay": f"{_EAGLE3}/ds_config.json:15{_AT}",
        "grad_clip": f"{_EAGLE3}/ds_config.json:43{_AT}",
        "grad_clip_by": f"{_EAGLE3}/ds_config.json:43{_AT} (DeepSpeed's gradient_clipping: the global norm)",
        "betas": f"{_EAGLE3}/ds_config.json:17-20{_AT}",
        "batch_sequences": f"{_EAGLE3}/ds_config.json:45{_AT} (per GPU)",
        "gradient_accumulation": f"{_EAGLE3}/ds_config.json:42{_AT}",
        "precision": f"{_EAGLE3}/ds_config.json:2-3{_AT}",
        "data": f"{_EAGLE3}/main.py:6-7{_AT} (--trainpath)",
        "ttt_steps": f"{_EAGLE3}/cnets.py:498{_AT} (self.length = 7), the loop at :790",
        "ttt_decay": f"{_EAGLE3}/main.py:284{_AT}",
        "draft_vocab_size": f"{_EAGLE3}/config.json:23{_AT} (for Llama-3.1-8B)",
    },
}
# Seconds per 1000 (tokens x unroll steps) of training on the 2-core CPU of the development machine, for the
# one-line estimate printed before a build (artefacts.trained_head.build_seconds_estimate): the default builds for
# SmolLM2-135M, each alone, 4 sequences of 249 tokens a step: eagle 609 s for 290 steps, eagle3 518 s for 580 steps
# of 2 unrolled passes. eagle's cost 5 times eagle3's per pass: its loss runs the target's whole 49,152-row
# lm_head, forward and backward, where eagle3's runs its 4,096-token draft vocabulary's.
SECONDS_PER_KILO_TOKEN = {"eagle": 2.11, "eagle3": 0.45}


def check(kind: str, settings: dict) -> None:
    """Ranges the settings' types cannot say."""
    if kind == "eagle3":
        if settings["ttt_steps"] < 1:
            raise SpecbenchError(f"eagle3 training ttt_steps must be an integer >= 1, got {settings['ttt_steps']}")
        if settings["draft_vocab_size"] is not None and settings["draft_vocab_size"] < 1:
            raise SpecbenchError(f"eagle3 training draft_vocab_size must be an integer >= 1 or null (the whole "
                                 f"vocabulary), got {settings['draft_vocab_size']}")


def batch_depth(kind: str, recipe) -> int:
    return recipe.method["ttt_steps"] if kind == "eagle3" else 1


def _head_config(target, kind: str, recipe):
    from specbench.heads.eagle_heads import head_config_for, resolve_feature_layers

    vocab = recipe.method["draft_vocab_size"] if kind == "eagle3" else None
    if vocab is not None and vocab >= target.vocab_size:
        vocab = None  # the whole vocabulary: no d2t
    layers = recipe.method["feature_layers"] or None
    if kind == "eagle" and layers is None:
        layers = (target.num_layers,)  # EAGLE-1's: the post-norm last state
    config = head_config_for(target, kind, draft_vocab_size=vocab, feature_layers=layers,
                             format="speculators" if kind == "eagle3" else "eagle")
    return dataclasses.replace(config, feature_layers=resolve_feature_layers(config, target.num_layers))


def feature_layers(kind: str, num_layers: int, recipe) -> tuple[int, ...]:
    """The target layers the head reads: the recipe's, else EAGLE-1's (N, the post-norm last state) or EAGLE-3's
    (2, N//2, N-3); a layer outside the target is a one-line SpecbenchError."""
    from specbench.heads.eagle_heads import resolve_feature_layers

    # resolve_feature_layers reads a config's kind and feature_layers only
    wanted = SimpleNamespace(kind=kind, feature_layers=tuple(recipe.method["feature_layers"]) or None)
    return resolve_feature_layers(wanted, num_layers)


def new_head(target, kind: str, recipe, sequences: list[Sequence]):
    """A randomly initialised head (seeded by the recipe) shaped like ``target``'s layers, reading its feature
    layers (resolved, so the checkpoint names them), on the host in float32. An eagle3 head's draft vocabulary is
    the most frequent greedy choices of the training ``sequences`` (the first ids when there are none: an untrained
    head drafts at random anyway)."""
    from specbench.heads.eagle_heads import build_head

    config = _head_config(target, kind, recipe)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(recipe.seed)
    try:
        head = build_head(config, target.weights.output_layer() if kind == "eagle" else None,
                          target.weights.input_embeddings())
    finally:
        torch.random.set_rng_state(generator_state)  # the caller's random stream is not this build's business
    if getattr(head, "d2t", None) is not None:
        if sequences:
            counts = greedy_token_counts(sequences, target.vocab_size)
            chosen = torch.from_numpy(select_draft_vocabulary(counts, head.config.draft_vocab_size))
        else:
            chosen = torch.arange(head.config.draft_vocab_size)
        head.set_draft_vocabulary(chosen)
    return head


def draft_ids(head, kind: str) -> torch.LongTensor | None:
    """The target ids of the head's draft vocabulary (eagle3 with a d2t), None for the whole vocabulary."""
    if getattr(head, "d2t", None) is None:
        return None
    return head.to_target_ids(torch.arange(head.config.draft_vocab_size))


def notes(head, kind: str, training: list[Sequence], held_out: list[Sequence]) -> dict:
    """The share of the greedy choices the draft vocabulary can name, in training and held out (position 1's
    ceiling)."""
    ids = draft_ids(head, kind)
    if ids is None:
        return {}
    values = {}
    for name, sequences in (("draft_vocab_coverage", training), ("held_out_draft_vocab_coverage", held_out)):
        counts = greedy_token_counts(sequences, head.config.vocab_size)
        values[name] = round(float(counts[ids.numpy()].sum() / max(1, counts.sum())), 4)
    return values


def loss(head, labels: Labels, batch: Batch, kind: str, recipe, generator: torch.Generator | None):
    """The training loss of one batch and its parts: eagle's ``v_weight`` x feature regression + ``p_weight`` x
    token loss; eagle3's sum over unroll steps of ``ttt_decay ** step`` x token loss."""
    settings = recipe.method
    width = batch.features.shape[1]
    features = batch.features
    if kind == "eagle" and settings["noise"] > 0 and generator is not None:
        # EAGLE-1's uniform noise, wider for shorter sequences
        amplitude = (settings["noise"] * 512 / batch.lengths.float())[:, None, None]
        # drawn on the host (the same numbers wherever the head trains), then moved to the features' device
        noise = (torch.rand(features.shape, generator=generator) - 0.5).to(features.device)
        features = features + noise * amplitude
    steps = settings["ttt_steps"] if kind == "eagle3" else 1
    outputs = unrolled_outputs(head, batch.token_ids[:, 1:], features, steps)
    total, parts = 0.0, {}
    for step, out in enumerate(outputs):
        label_final = batch.final[:, 1 + step:1 + step + width]
        mask = batch.labelled[:, 1 + step:1 + step + width]
        greedy = batch.greedy[:, 1 + step:1 + step + width]
        if labels.in_draft is not None:
            # EAGLE-3's rule: a position whose greedy choice the draft vocabulary cannot name teaches nothing
            mask = mask & labels.in_draft[greedy]
        draft_logits = head.lm_head(head.norm(out)) if kind == "eagle3" else F.linear(out, labels.weight)
        token_loss = soft_cross_entropy(draft_logits, labels.logits(label_final), mask)
        if kind == "eagle":
            regression = F.smooth_l1_loss(out, label_final, reduction="none").mean(-1)
            feature_loss = (regression * mask).sum() / mask.sum().clamp(min=1)
            total = settings["v_weight"] * feature_loss + settings["p_weight"] * token_loss
            parts.update(vloss=float(feature_loss.detach()), ploss=float(token_loss.detach()))
        else:
            total = total + settings["ttt_decay"] ** step * token_loss
            parts[f"ploss{step}"] = float(token_loss.detach())
    return total, parts


def chain_tokens(head, labels: Labels, batch: Batch, kind: str, positions: int) -> torch.LongTensor:
    """The head's greedy chain of ``positions`` tokens after every index [B, T, positions], as target ids: the
    unrolled forward fed the true tokens (exact under "the first k - 1 were right"). An eagle head's draft logits
    are the target's lm_head's: taken from ``labels``' float32 copy of it, which is where the head is, rather than
    from the target's own module, which may sit on another device or in half precision."""
    outputs = unrolled_outputs(head, batch.token_ids[:, 1:], batch.features, positions)

    def draft_logits(out: torch.Tensor) -> torch.Tensor:
        return labels.logits(out) if kind == "eagle" else head.draft_logits(out)

    return torch.stack([head.to_target_ids(draft_logits(out).argmax(-1)) for out in outputs], dim=-1)


def save(head, kind: str, directory: Path) -> None:
    """The head in the speculators format (eagle3) or EAGLE's (eagle), naming its target as the verifier."""
    from specbench.heads.eagle_head_files import save_eagle_head

    save_eagle_head(head, directory, head.config.format)


def load(target, directory: Path, kind: str):
    """The head at ``directory``, loaded strictly (``load_eagle_head`` checks that it fits ``target``)."""
    from specbench.heads.eagle_head_files import load_eagle_head

    return load_eagle_head(target, str(directory), kind)


def select_draft_vocabulary(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent token ids by ``counts`` [vocab], ties going to the smaller id, returned in ascending
    id order (EAGLE-3's d2t is built from the sorted list). Ids never seen fill the rest, smallest first.

    Example: counts [5, 0, 9, 5, 1], size 3 -> [0, 2, 3] (9 and the two 5s; id 0 before id 3 would break a tie).
    """
    counts = np.asarray(counts)
    if not 1 <= size <= counts.size:
        raise SpecbenchError(f"draft_vocab_size={size} must be between 1 and the target's vocabulary, {counts.size}")
    order = np.argsort(-counts, kind="stable")  # stable: equal counts keep ascending ids
    return np.sort(order[:size])


def greedy_token_counts(sequences: list[Sequence], vocab_size: int) -> np.ndarray:
    """How often each token is the target's greedy choice at a trained label position (P - 1 .. L - 1): what the
    draft vocabulary must cover."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for sequence in sequences:
        np.add.at(counts, sequence.greedy[sequence.prompt_length - 1:].numpy(), 1)
    return counts


# ---- the head unrolled over whole sequences ----------------------------------------------------------------------


def unrolled_outputs(head, token_ids: torch.LongTensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's outputs [B, T, h] at each of ``steps`` unroll steps over whole padded sequences, as decoding would
    compute them one draft at a time (``EagleHead.forward`` with a cache), but batched and differentiable.

    token_ids [B, T + steps (or more)]: x_1.. (the token of index t at step j is ``token_ids[:, t + j]``);
    features [B, T, w]: the target features f_0..f_{T-1}.

    At step 0 index t attends causally to the step-0 entries 0..t. At step j it attends to those same entries
    (the target-fed cache a chain drafts from) and to its own chain's entries at steps 1..j (index t only): the
    mask of a greedy chain drafted from position t, EAGLE-3's training-time test."""
    assert token_ids.ndim == 2 and features.ndim == 3, "token_ids [B, T + steps], features [B, T, w]"
    config = head.config
    layer = head.layers[0]
    attention = layer.self_attn
    count, width = features.shape[:2]
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    groups = heads // kv_heads
    causal = torch.ones(width, width, dtype=torch.bool, device=features.device).tril()
    scale = 1.0 / math.sqrt(head_dim)
    hidden, outputs = features, []
    base_keys = base_values = None
    chain_keys, chain_values = [], []
    for step in range(steps):
        embeddings = head.embed_tokens(token_ids[:, step:step + width]).to(features.dtype)
        if config.kind == "eagle":
            fused = head.fc(torch.cat((embeddings, hidden), dim=-1))
            attention_input = fused
        else:
            fused = head.fc(hidden) if step == 0 else hidden
            attention_input = torch.cat((layer.input_layernorm(embeddings), layer.hidden_norm(fused)), dim=-1)
        positions = torch.arange(step, step + width, device=features.device)
        cos, sin = attention.rotary(positions, features.dtype)  # [T, head_dim]
        queries = attention.q_proj(attention_input).view(count, width, heads, head_dim).transpose(1, 2)
        keys = attention.k_proj(attention_input).view(count, width, kv_heads, head_dim).transpose(1, 2)
        values = attention.v_proj(attention_input).view(count, width, kv_heads, head_dim).transpose(1, 2)
        queries = queries * cos + rotate_half(queries) * sin
        keys = (keys * cos + rotate_half(keys) * sin).repeat_interleave(groups, dim=1)  # [B, heads, T, d]
        values = values.repeat_interleave(groups, dim=1)
        if step == 0:
            base_keys, base_values = keys, values
        else:
            chain_keys.append(keys)
            chain_values.append(values)
        scores = torch.matmul(queries, base_keys.transpose(2, 3)) * scale  # [B, heads, T, T]
        scores = scores.masked_fill(~causal, float("-inf"))
        # each index's own chain: one score per earlier step, [B, heads, T, j]
        own = [(queries * chain).sum(-1, keepdim=True) * scale for chain in chain_keys]
        weights = torch.softmax(torch.cat([scores, *own], dim=-1), dim=-1)
        attended = torch.matmul(weights[..., :width], base_values)
        for i, chain in enumerate(chain_values):
            attended = attended + weights[..., width + i:width + i + 1] * chain
        attended = attention.o_proj(attended.transpose(1, 2).reshape(count, width, heads * head_dim))
        out = fused + attended
        out = out + layer.mlp(layer.post_attention_layernorm(out))
        outputs.append(out)
        hidden = out
    return outputs


