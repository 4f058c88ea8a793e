"""Depth-pruned ("wide") draft models: keep a few of the target's layers at full width, optionally distilled
against the target ("Decoding Speculative Decoding" finds such shallow, wide drafts beat deep, narrow ones,
because a draft's latency is driven by its depth)."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from tqdm import tqdm

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)
SELECTIONS = ("first", "evenly", "last")
# Distillation corpus made of the target's own chat conversations: its greedy answers (with the chat template)
# to the built-in prompt set that HD's model database uses, disjoint from the evaluation questions. It matches
# what the draft must predict at run time far better than general text does.
TARGET_ANSWERS = "target-answers"
LOGIT_FLOATS_PER_SLICE = 2**25  # 128 MB of fp32 logits per distillation forward pass


def select_layers(num_layers: int, keep, selection: str = "evenly") -> list[int]:
    """Indices of the layers to keep: ``keep`` of ``num_layers`` chosen by ``selection`` (first, evenly
    spaced with the first and last included, last), or an explicit list of indices.

    Example: select_layers(30, 4, "evenly") -> [0, 10, 19, 29].
    """
    if isinstance(keep, (list, tuple)):
        layers = sorted({int(i) for i in keep})
        if not layers or layers[0] < 0 or layers[-1] >= num_layers:
            raise SpecbenchError(f"layers {list(keep)} are not all within 0..{num_layers - 1}")
        return layers
    if not isinstance(keep, int) or not 1 <= keep <= num_layers:
        raise SpecbenchError(f"layers to keep must be between 1 and {num_layers}, got {keep!r}")
    if selection not in SELECTIONS:
        raise SpecbenchError(f"layer selection {selection!r} is not known; choose one of {', '.join(SELECTIONS)}")
    if selection == "first":
        return list(range(keep))
    if selection == "last":
        return list(range(num_layers - keep, num_layers))
    return sorted({int(round(i)) for i in np.linspace(0, num_layers - 1, keep)})


def token_blocks(token_documents, block_size: int, batch_size: int, seed: int):
    """Endless batches [batch_size, block_size] of consecutive tokens cut from the concatenated documents,
    in a shuffled order."""
    tokens = np.concatenate([np.asarray(doc, dtype=np.int64) for doc in token_documents if len(doc)])
    blocks = tokens[: tokens.size // block_size * block_size].reshape(-1, block_size)
    if blocks.shape[0] < batch_size:
        raise SpecbenchError(f"the distillation corpus has {tokens.size} tokens, too few for one batch")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(blocks.shape[0])
        for begin in range(0, order.size - batch_size + 1, batch_size):
            yield torch.from_numpy(blocks[order[begin : begin + batch_size]])


def distill(student, teacher, batches, tokens: int, lr: float, device) -> list[float]:
    """Train ``student`` to match ``teacher``'s next-token distributions (KL(teacher || student), averaged
    over positions) on about ``tokens`` tokens; return the KL of every step. ``teacher``: the target's
    ``TargetWeights``."""
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    first = next(batches)
    steps = max(1, math.ceil(tokens / first.numel()))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    losses = []
    bar = tqdm(range(steps), desc="distilling", unit="step")
    batch = first
    # Logits are [rows, block, vocab] floats several times over (teacher, student, gradients): with a large
    # vocabulary a whole batch does not fit in memory, so the batch runs in slices of rows whose gradients add
    # up to those of the whole batch.
    vocab = teacher.vocab_size
    rows_per_slice = max(1, LOGIT_FLOATS_PER_SLICE // (first.shape[1] * vocab))
    for _ in bar:
        batch = batch.to(device)
        optimizer.zero_grad()
        loss_value = 0.0
        for rows in batch.split(rows_per_slice):
            with torch.no_grad():
                target_log_probs = torch.log_softmax(teacher.logits(rows).float(), dim=-1)
            student_log_probs = torch.log_softmax(student(input_ids=rows).logits.float(), dim=-1)
            loss = torch.nn.functional.kl_div(student_log_probs, target_log_probs, log_target=True,
                                              reduction="none").sum(-1).mean() * (rows.shape[0] / batch.shape[0])
            loss.backward()
            loss_value += float(loss.detach())
            del target_log_probs, student_log_probs, loss
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss_value)
        bar.set_postfix_str(f"KL {np.mean(losses[-10:]):.3f}")
        batch = next(batches)
    student.eval()
    return losses


# The numbers of a drafter's ``pruned`` entry (build_pruned_draft's keyword arguments): the least each may be.
_PRUNED_COUNTS = {"distill_tokens": 0, "block_size": 1, "batch_size": 1, "seed": 0}
# The most any of them (and a layer count or index) may be: the bound of every drafter count
# (``drafters.base.MAX_COUNT``, which a module on this floor cannot import; tests/test_setting_values.py holds the two
# equal), so that a finite count never overflows the int64 arithmetic of what it sizes.
_MOST = 2**31 - 1


def check_pruned_settings(settings: dict) -> None:
    """The numbers of a drafter's ``pruned`` entry, checked before anything is planned or built, in one line
    naming the key: counts that are ints (not bools, fractions, strings, inf or nan), a finite positive lr,
    and layers a count or a list of layer indices (their range is checked against the target by select_layers)."""
    layers = settings.get("layers")
    entries = layers if isinstance(layers, (list, tuple)) else [layers]
    if not entries or not all(isinstance(layer, int) and not isinstance(layer, bool) and layer <= _MOST
                              for layer in entries):
        raise SpecbenchError(f"pruned.layers must be a number of layers or a list of layer indices (at most {_MOST}), "
                             f"got {layers!r}")
    for key, least in _PRUNED_COUNTS.items():
        value = settings.get(key, least)
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= _MOST:
            raise SpecbenchError(f"pruned.{key} must be an integer in [{least}, {_MOST}], got {value!r}")
    lr = settings.get("lr", 3e-4)
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise SpecbenchError(f"pruned.lr must be a number > 0, not inf or nan, got {lr!r}")
