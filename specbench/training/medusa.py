"""Training Medusa-1 heads (kind ``medusa``) for any target, the hooks the head trainer calls (see
``specbench.training.heads`` for the data, the ``Batch`` and its index conventions).

Medusa-1's recipe (FasterDecoding/Medusa ``medusa/train/train_legacy.py`` @e2a5d20, whose loss is the first
release's, ``medusa/train/train.py`` @ab5d60c, which trained the published heads; the heads as Spec-Bench loads
them, ``model/medusa/medusa_model.py`` @fd2c1cd): the target is frozen and only the heads train; each head's
residual block starts with a zero weight and its lm_head as a copy of the target's; the loss is the sum over heads,
undecayed, of each head's mean hard-label cross-entropy, head k (0-based) at position t against the sequence's
token at t + 2 + k, over the answer (assistant) tokens only (the first release's masking, train.py:178-202
@ab5d60c; train_legacy.py's later masking at :196-212 keeps every token whose offsets are not empty).

Index conventions (``Batch``): features[:, t] is the target's final post-norm state f_t at position t, from which
the target's own lm_head predicts x_{t+1}; head k predicts x_{t+2+k}. A label x_u is trained when it is an answer
token, P <= u <= L - 1.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specbench.errors import SpecbenchError
from specbench.training.heads import dense_weight

KINDS = ("medusa",)
# specbench's defaults of the settings only Medusa has. heads: 4, the heads Spec-Bench drafts with
# (evaluation/inference_medusa.py:200); the published checkpoints hold 5, and a 5th head is never read (heads are
# trained independently: the loss is a plain sum). layers: the published heads' one residual block.
METHOD_SETTINGS = {"medusa": {"heads": 4, "layers": 1}}
# Medusa-1's own recipe for Vicuna-7B (scripts/train_vicuna_7b.sh @e2a5d20, on 4 GPUs), and the settings the
# script leaves to transformers' TrainingArguments.
PUBLISHED = {"medusa": {
    "epochs": 1,
    "lr": 1e-3,
    "schedule": "cosine",
    "warmup_ratio": 0.1,
    "weight_decay": 0.0,
    "grad_clip": 1.0,
    "grad_clip_by": "norm",  # transformers' Trainer clips the global norm at max_grad_norm, not each value
    "betas": (0.9, 0.999),
    "batch_sequences": 128,  # 8 per device x 4 processes x 4 accumulation steps
    "precision": "bf16",
    "max_length": 2048,  # tokens per conversation; longer ones are cut
    "data": "ShareGPT_V4.3_unfiltered_cleaned_split.json (ShareGPT conversations, assistant turns trained)",
    "heads": 5,
    "layers": 1,
}}
SOURCES = {"medusa": {
    "epochs": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:5 @e2a5d20",
    "lr": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:11 @e2a5d20",
    "schedule": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:14 @e2a5d20",
    "warmup_ratio": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:13 @e2a5d20",
    "weight_decay": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:12 @e2a5d20",
    "grad_clip": "not set in FasterDecoding/Medusa scripts/train_vicuna_7b.sh @e2a5d20: transformers "
                 "TrainingArguments.max_grad_norm default 1.0",
    "grad_clip_by": "FasterDecoding/Medusa medusa/train/train_legacy.py:45, 391 @e2a5d20 (a transformers "
                    "Trainer, whose loop clips with clip_grad_norm_ at max_grad_norm)",
    "max_length": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:17 @e2a5d20 (--model_max_length); "
                  "medusa/train/train_legacy.py:125-130",
    "betas": "FasterDecoding/Medusa medusa/train/train_legacy.py:124 @e2a5d20 (optim adamw_torch; "
             "TrainingArguments adam_beta1/adam_beta2 defaults)",
    "batch_sequences": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:1, 6, 8 @e2a5d20",
    "precision": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:3 @e2a5d20; medusa/train/train_legacy.py:357",
    "data": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:2 @e2a5d20; the assistant turns alone: "
            "medusa/train/train.py:178-202 @ab5d60c (the first release, which trained the published heads)",
    "heads": "FasterDecoding/Medusa medusa/model/medusa_model.py:143 @e2a5d20 (the uploaded heads hold 5; "
             "scripts/train_vicuna_7b.sh:19 says 3)",
    "layers": "FasterDecoding/Medusa scripts/train_vicuna_7b.sh:20 @e2a5d20",
}}

# 2: biases undecayed, as Medusa's Trainer leaves them (``decays``; the same head at the default weight decay, 0)
TRAINING_VERSION = {"medusa": 2}


def decays(kind: str, name: str) -> bool:
    """Whether AdamW decays the heads' parameter ``name``, as Medusa-1's training does: a transformers Trainer
    (``CustomizedTrainer``, medusa/train/train.py:44 @ab5d60c), whose ``create_optimizer`` decays every parameter
    but those whose name holds "bias" and those inside a LayerNorm (``get_decay_parameter_names``), which the heads
    have none of. Only a non-zero ``weight_decay`` tells: the published recipe's is 0."""
    _check_kind(kind)
    return "bias" not in name


# Seconds per 1000 trained tokens on the development machine's 2 CPU cores, for the estimate said before a build
# (artefacts.trained_head.build_seconds_estimate): the default build for SmolLM2-135M alone, 862 s for 145 steps of
# 4 sequences of 249 tokens. A medusa step costs about 3 eagle steps: each of the 4 heads runs and trains its own
# copy of the 49,152-row lm_head.
SECONDS_PER_KILO_TOKEN = {"medusa": 6.0}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise SpecbenchError(f"Medusa head kind {kind!r} is unknown; choose one of {', '.join(KINDS)}")


def check(kind: str, settings: dict) -> None:
    """Ranges the settings' types cannot say (the trainer already refuses negative numbers): at least one head
    and one residual block, which Medusa's loader requires too (``heads.medusa_heads``: a config's
    medusa_num_layers must be positive, and weights without a head are refused), so that a recipe that could only
    publish an unusable head is refused before anything is built."""
    _check_kind(kind)
    for name in ("heads", "layers"):
        if settings[name] < 1:
            raise SpecbenchError(f"medusa training {name} must be an integer >= 1, got {settings[name]}")


# Medusa-1 trains on the data's tokens (hard labels): the trainer need not put the target's lm_head copy (Labels,
# vocabulary x hidden in float32) on the training device.
READS_LABELS = False


def feature_layers(kind: str, num_layers: int, recipe) -> tuple[int, ...]:
    """The final, post-norm state (layer ``num_layers``): what Medusa's heads read (medusa_model.py:194-207)."""
    _check_kind(kind)
    return (num_layers,)


def new_head(target, kind: str, recipe, sequences):
    """Heads initialised as Medusa does (``heads.medusa_heads.new_medusa_heads``), seeded by the recipe, on the
    host in float32; ``sequences`` are not needed (Medusa's initialisation reads no data)."""
    from specbench.heads.medusa_heads import MedusaConfig, new_medusa_heads

    _check_kind(kind)
    settings = {**METHOD_SETTINGS[kind], **(recipe.method or {})}
    config = MedusaConfig(int(settings["heads"]), int(settings["layers"]), target.weights.hidden_size,
                          target.vocab_size, str(target.source))
    output_layer = dense_weight(target.weights.output_layer()).float().cpu()
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(recipe.seed)
    try:
        return new_medusa_heads(config, output_layer)
    finally:
        torch.random.set_rng_state(generator_state)  # the caller's random stream is not this build's business


def _labels(batch, k: int, width: int) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """Head k's labels [B, T] (the token at t + 2 + k) and where they are trained (an answer token, P <= u < L)."""
    count, device = batch.token_ids.shape[0], batch.token_ids.device
    labels = torch.zeros(count, width, dtype=torch.long, device=device)
    trained = torch.zeros(count, width, dtype=torch.bool, device=device)
    available = min(width, batch.token_ids.shape[1] - (2 + k))  # u = t + 2 + k within the padded arrays
    if available > 0:
        positions = torch.arange(2 + k, 2 + k + available, device=device)
        labels[:, :available] = batch.token_ids[:, positions]
        # labelled[u - 1] holds for P <= u <= L; u < L leaves out the position after the answer, which has no token
        trained[:, :available] = batch.labelled[:, positions - 1] & (positions[None, :] < batch.lengths[:, None])
    return labels, trained


def loss(head, labels, batch, kind: str, recipe, generator) -> tuple[torch.Tensor, dict[str, float]]:
    """Medusa-1's loss on one batch: the sum over heads of each one's mean cross-entropy against the hard labels
    (train_legacy.py:72-78), and per head its loss and top-1 accuracy (the ``medusa{k}_loss``/``_top1`` it logs).
    The heads' logits are computed only at trained positions (the others carry no loss). ``labels`` (the
    target's distributions) and ``generator`` are not used: Medusa-1 trains on the data's tokens, without noise."""
    _check_kind(kind)
    features = batch.features  # [B, T, H]
    assert features.ndim == 3, "batch.features must be [B, T, H]"
    width = features.shape[1]
    total = features.new_zeros(())
    parts: dict[str, float] = {}
    for k in range(head.config.num_heads):
        targets, trained = _labels(batch, k, width)
        logits = head.head_logits(k, features[trained])  # [n, vocab]
        if logits.shape[0] == 0:
            parts[f"medusa{k}_loss"], parts[f"medusa{k}_top1"] = 0.0, 0.0
            continue
        head_loss = F.cross_entropy(logits.float(), targets[trained])
        total = total + head_loss
        with torch.no_grad():
            parts[f"medusa{k}_loss"] = float(head_loss)
            parts[f"medusa{k}_top1"] = float((logits.argmax(-1) == targets[trained]).float().mean())
    return total, parts


def chain_length(kind: str, recipe) -> int:
    """One chain token per head."""
    _check_kind(kind)
    return int({**METHOD_SETTINGS[kind], **(recipe.method or {})}["heads"])


@torch.no_grad()
def chain_tokens(head, labels, batch, kind: str, positions: int) -> torch.LongTensor:
    """The heads' greedy chain after each index t, [B, T, positions]: chain[:, t, k] is head k's argmax at f_t (the
    token k + 1 after x_{t+1}, the target's own next token there); -1 past the heads' count. The heads do not read
    the chain, so this is also the chain under any earlier tokens."""
    _check_kind(kind)
    features = batch.features
    count, width = features.shape[:2]
    chain = torch.full((count, width, positions), -1, dtype=torch.long, device=features.device)
    for k in range(min(positions, head.config.num_heads)):
        chain[:, :, k] = head.head_logits(k, features).argmax(-1)
    return chain


def save(head, kind: str, directory: Path) -> None:
    """The heads in Medusa's published format (``heads.medusa_heads.save_medusa_heads``)."""
    from specbench.heads.medusa_heads import save_medusa_heads

    _check_kind(kind)
    save_medusa_heads(head, directory)


def load(target, directory, kind: str):
    """The heads at ``directory``, checked against ``target``: the drafter's own loader."""
    from specbench.heads.medusa_heads import load_medusa_heads

    _check_kind(kind)
    return load_medusa_heads(target, str(directory))
