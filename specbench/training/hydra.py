"""Training Hydra++ heads (kind ``hydra``) for any target: the training hooks of the common trainer interface, as
zankner/Hydra's hydra/train/train.py @3f39fbd trains them (README.md's command, which trains the published recipe).

Loss (``CustomizedTrainer.compute_loss``/``_score_preds``): for head i (0-based, shift = i + 2) at index t, fed the
prefix layer's output at t (features f_0..f_t, causal) and the true tokens x_{t+1}..x_{t+i+1}, the logits predict
x_{t+i+2}. Its loss is ``lm_loss_weight`` x cross-entropy against that data token plus ``teacher_loss_weight`` x
cross-entropy against the target's distribution at position t + i + 1 ("teacher", distillation), each a mean over
the positions whose label x_{t+i+2} is a trained (answer) token; the heads' losses are summed with equal weight
(no per-head decay). The published recipe weights the teacher 1 and the data 0. Dropout (``dropout_rate``) sits
before every residual block and before each lm head. Trained: the prefix layer, the heads' blocks and lm heads;
the target, and the embedding the heads read, stay frozen (train.py freezes the base model before building them).

Index conventions are the trainer's (``training.heads.Batch``): index t pairs f_t with x_{t+1}; ``batch.final[:, s]`` is the
target's post-norm state at position s, whose lm_head gives its distribution over x_{s+1}.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specbench.errors import SpecbenchError
from specbench.training.heads import soft_cross_entropy

KINDS = ("hydra",)
COMMIT = "@3f39fbd"
README = "zankner/Hydra README.md"
TRAIN = "zankner/Hydra hydra/train/train.py"

# Settings only Hydra's recipe has, with specbench's defaults: the published recipe's.
METHOD_SETTINGS = {"hydra": {
    "num_heads": 4,                  # hydra_num_heads: heads, one per draft depth
    "num_layers": 4,                 # hydra_num_layers: residual blocks per head
    "hidden_state_offset": 0,        # 0: the target's last, post-norm state
    "dropout_rate": 0.2,
    "lm_loss_weight": 0.0,           # cross-entropy against the data's tokens
    "teacher_loss_weight": 1.0,      # cross-entropy against the target's distribution
    # the cosine (or linear) decay ends at this fraction of the peak, not at 0 (the trainer's schedule_factor
    # reads a kind's final_lr_multiplier; kinds without one decay to 0)
    "final_lr_multiplier": 0.33,
}}

PUBLISHED = {"hydra": {
    "epochs": 10, "lr": 5e-4, "schedule": "cosine", "warmup_steps": 100,
    # README's command passes --weight_decay twice, 0.0 then 0.1: HfArgumentParser keeps the last
    "weight_decay": 0.1,
    "grad_clip": 1.0,                # transformers.TrainingArguments' max_grad_norm default (not set by the command)
    "grad_clip_by": "norm",          # transformers.Trainer clips the global norm (clip_grad_norm_)
    "betas": (0.9, 0.999),           # adamw_torch with TrainingArguments' adam_beta1/2 defaults
    "batch_sequences": 32,           # 8 GPUs x 4 sequences, no accumulation (--global_batch_size only names the run)
    "precision": "bf16",
    "data": "ShareGPT (Aeala/ShareGPT_Vicuna_unfiltered), sequences of up to 2048 tokens",
    "max_length": 2048,              # --model_max_length: longer conversations are truncated
    **METHOD_SETTINGS["hydra"],
}}

SOURCES = {"hydra": {
    "epochs": f"{README}:146 {COMMIT}", "lr": f"{README}:155 {COMMIT}", "schedule": f"{README}:158 {COMMIT}",
    "warmup_steps": f"{README}:157 {COMMIT}", "weight_decay": f"{README}:156,172 {COMMIT}",
    "grad_clip": f"{TRAIN}:512 {COMMIT} (TrainingArguments subclass; max_grad_norm not overridden)",
    "grad_clip_by": f"{TRAIN}:50 {COMMIT} (CustomizedTrainer, a transformers.Trainer: clip_grad_norm_)",
    "betas": f"{TRAIN}:514 {COMMIT} (optim adamw_torch, default betas)",
    "batch_sequences": f"{README}:142,148,150 {COMMIT} (nproc_per_node 8 x per_device_train_batch_size 4 x "
                       "gradient_accumulation_steps 1)",
    "precision": f"{README}:144 {COMMIT}",
    "data": f"{README}:131,143,162 {COMMIT}", "max_length": f"{README}:162 {COMMIT}",
    "num_heads": f"{README}:164 {COMMIT}", "num_layers": f"{README}:165 {COMMIT}",
    "hidden_state_offset": f"{README}:168 {COMMIT}", "dropout_rate": f"{README}:171 {COMMIT}",
    "lm_loss_weight": f"{README}:169 {COMMIT}", "teacher_loss_weight": f"{README}:170 {COMMIT}",
    "final_lr_multiplier": f"{README}:159 {COMMIT}, hydra/train/utils.py:17,59 {COMMIT}",
}}

# 2: biases undecayed, as Hydra's Trainer leaves them (``decays``); 1 (none written) decayed every parameter
TRAINING_VERSION = {"hydra": 2}


def decays(kind: str, name: str) -> bool:
    """Whether AdamW decays the head's parameter ``name``, as Hydra's training does: a transformers Trainer
    (hydra/train/train.py:50 @3f39fbd, transformers==4.36.2 by pyproject.toml:16), whose ``create_optimizer``
    (trainer.py:923-946 in 4.36.2) decays the parameters ``get_decay_parameter_names`` lists (:912-921): every one
    but those whose name holds "bias" and those inside an instance of ``ALL_LAYERNORM_LAYERS`` (``nn.LayerNorm``,
    pytorch_utils.py:25, and transformers' own LlamaRMSNorm, which its modeling_llama.py:120 adds). Hydra's prefix
    layer normalises with its own RMSNorm class (hydra/model/modeling_llama_kv.py:107 @3f39fbd), which that list
    does not hold, so its norm weights are decayed; the head's names are Hydra's (``heads.hydra_heads``)."""
    _check_kind(kind)
    return "bias" not in name


# Seconds per 1000 training tokens (4 heads of 4 blocks) on the 2-core CPU of the development machine, for the
# one-line estimate printed before a build (artefacts.trained_head.build_seconds_estimate): the default build for
# SmolLM2-135M (145 steps of 4 sequences of 249 tokens) ran its last steps alone at 14.7 s a step; its whole
# training took 3,238 s because test runs shared the cores for about half of it. Each head trains its own copy of
# the target's 49,152-row lm head, forward and backward, beside the target's distribution at every label
# position: 2.5 times Medusa's cost, whose heads are one block each.
SECONDS_PER_KILO_TOKEN = {"hydra": 14.8}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise SpecbenchError(f"Hydra head kind {kind!r} is unknown; choose one of {', '.join(KINDS)}")


def check(kind: str, settings: dict) -> None:
    """Ranges the settings' types cannot say (the trainer already refuses negative numbers)."""
    _check_kind(kind)
    for name in ("num_heads", "num_layers"):
        if settings[name] < 1:
            raise SpecbenchError(f"hydra training {name} must be an integer >= 1, got {settings[name]}")
    if settings["dropout_rate"] >= 1:
        raise SpecbenchError(f"hydra training dropout_rate must be a number in [0, 1), got {settings['dropout_rate']:g}")
    if settings["lm_loss_weight"] == 0 and settings["teacher_loss_weight"] == 0:
        raise SpecbenchError("hydra training lm_loss_weight and teacher_loss_weight are both 0, which trains "
                             "nothing; give one a positive weight (the published recipe: teacher_loss_weight 1)")
    if settings["final_lr_multiplier"] > 1:  # train.py:472 asserts it too
        raise SpecbenchError(f"hydra training final_lr_multiplier must be a number in [0, 1], got "
                             f"{settings['final_lr_multiplier']:g}")


def chain_length(kind: str, recipe) -> int:
    """One chain token per head."""
    _check_kind(kind)
    return recipe.method["num_heads"]


def batch_depth(kind: str, recipe) -> int:
    """Head i's label is x_{t+i+2}: a batch must reach num_heads label positions past each index, one per chain
    token."""
    return chain_length(kind, recipe)


def feature_layers(kind: str, num_layers: int, recipe) -> tuple[int, ...]:
    """The one target layer the head reads: N (the post-norm last state) at offset 0, else layer N - offset."""
    _check_kind(kind)
    offset = recipe.method["hidden_state_offset"]
    if not 0 <= offset <= num_layers:
        raise SpecbenchError(f"Hydra training hidden_state_offset={offset} must be between 0 and the target's "
                             f"{num_layers} layers")
    return (num_layers - offset,)


def new_head(target, kind: str, recipe, sequences=None) -> torch.nn.Module:
    """A new head for ``target`` initialised as Hydra does (``heads.hydra_heads.build_head``), seeded by the
    recipe, on the host in float32, trainable but for nothing it does not own."""
    from specbench.heads.hydra_heads import build_head, head_config_for

    _check_kind(kind)
    settings = recipe.method
    config = head_config_for(target, settings["num_heads"], settings["num_layers"], settings["hidden_state_offset"])
    head = build_head(target, config, recipe.seed)
    head.train()
    return head


def place(head, kind: str, device: torch.device) -> torch.nn.Module:
    """``head`` on ``device`` to train there, with the host copy of the target's embedding it reads beside it: that
    copy is held outside the module tree (``heads.hydra_heads.HydraHead``), so ``Module.to`` leaves it behind."""
    _check_kind(kind)
    head.to(device)
    object.__setattr__(head, "target_embedding", head.target_embedding.to(device))
    return head


def _dropout(rate: float, generator: torch.Generator | None):
    """Hydra's Dropout(rate) with its draws from ``generator`` (a resumed training draws what an uninterrupted one
    did); None when not training (no generator) or the rate is 0."""
    if generator is None or rate <= 0:
        return None

    def apply(x: torch.Tensor) -> torch.Tensor:
        keep = torch.rand(x.shape, generator=generator, device=generator.device).to(x.device) >= rate
        return x * keep / (1.0 - rate)

    return apply


def _head_inputs(head, batch, index: int, prefix: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T, (index + 2) h]: at t, cat(prefix_t, E[x_{t+1}], ..., E[x_{t+index+1}])."""
    embedded = [head.embed(batch.token_ids[:, 1 + step:1 + step + width]) for step in range(index + 1)]
    return torch.cat((prefix, *embedded), dim=-1)


def _check_batch(batch, heads: int) -> int:
    width = batch.features.shape[1]
    if batch.token_ids.shape[1] < width + heads + 1:
        raise SpecbenchError(f"a Hydra batch for {heads} heads needs make_batch(sequences, depth >= {heads}); this "
                             f"one reaches {batch.token_ids.shape[1] - width - 1} positions past its last index")
    return width


def loss(head, labels, batch, kind: str, recipe, generator: torch.Generator | None):
    """Hydra's training loss on ``batch`` (see the module docstring) and its parts per head for the log: the
    teacher and data cross-entropies and the top-1 agreement with the target's greedy token."""
    _check_kind(kind)
    settings = recipe.method
    heads = head.config.num_heads
    width = _check_batch(batch, heads)
    dropout = _dropout(settings["dropout_rate"], generator)
    prefix = head.prefix_sequences(batch.features.to(head.hydra_lm_head[0][1].weight.dtype))
    positions = torch.arange(width, device=batch.lengths.device)[None, :]
    with torch.no_grad():  # the target's logits once for every head (each head's labels are a window of them)
        target_logits = labels.logits(batch.final[:, 1:1 + width + heads - 1])
    total = batch.features.new_zeros(())
    parts: dict[str, float] = {}
    for index in range(heads):
        label = index + 1  # the target's distribution at t + index + 1 predicts x_{t+index+2}
        logits = head.head_logits(index, _head_inputs(head, batch, index, prefix, width), dropout).float()
        # Hydra's mask: the data token x_{t+index+2} exists and is trained (an answer token)
        mask = batch.labelled[:, label:label + width] & (positions + label + 1 < batch.lengths[:, None])
        teacher = soft_cross_entropy(logits, target_logits[:, index:index + width], mask)
        data = F.cross_entropy(logits.transpose(1, 2), batch.token_ids[:, label + 1:label + 1 + width],
                               reduction="none")
        data = (data * mask).sum() / mask.sum().clamp(min=1)
        total = total + settings["teacher_loss_weight"] * teacher + settings["lm_loss_weight"] * data
        with torch.no_grad():
            hits = (logits.argmax(-1) == batch.greedy[:, label:label + width]) & mask
            parts[f"head{index}_teacher"] = float(teacher)
            parts[f"head{index}_lm"] = float(data)
            parts[f"head{index}_top1"] = float(hits.sum() / mask.sum().clamp(min=1))
    return total, parts


@torch.no_grad()
def chain_tokens(head, labels, batch, kind: str, positions: int) -> torch.LongTensor:
    """[B, T, positions]: after index t, head k - 1's greedy token fed the true x_{t+1}..x_{t+k} (exact under "the
    first k - 1 were right"), as target ids; -1 beyond the head's depth (it names no token there)."""
    _check_kind(kind)
    heads = head.config.num_heads
    width = batch.features.shape[1]
    depth = min(positions, heads)
    _check_batch(batch, depth)
    chain = torch.full((batch.features.shape[0], width, positions), -1, dtype=torch.long,
                       device=batch.features.device)
    prefix = head.prefix_sequences(batch.features.to(head.hydra_lm_head[0][1].weight.dtype))
    for index in range(depth):
        chain[:, :, index] = head.head_logits(index, _head_inputs(head, batch, index, prefix, width)).argmax(-1)
    return chain


def save(head, kind: str, directory: Path) -> None:
    """The head in Hydra's format (config.json and hydra_lm_head.pt)."""
    from specbench.heads.hydra_heads import save_hydra_head

    _check_kind(kind)
    save_hydra_head(head, directory)


def load(target, directory, kind: str) -> torch.nn.Module:
    """The head at ``directory``, read by the drafter's own loader."""
    from specbench.heads.hydra_heads import load_hydra_head

    _check_kind(kind)
    return load_hydra_head(target, str(directory))
