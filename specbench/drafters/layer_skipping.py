"""What the self-speculative drafters (``self_spec``: Draft & Verify; ``swift``: SWIFT) share: a skip set read from a
config, and a chain drafted by the target itself with those sublayers left out (``Target.skipping_pass``) on the
sequence's own cache, which it leaves as it found it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specbench.decoding.target import LayerSkip
from specbench.errors import SpecbenchError


def skip_set_setting(key: str, value) -> LayerSkip | None:
    """A skip set written in a config as ``{attention: [layers], mlp: [layers]}`` (layers from 0), or None for
    none; anything else is refused in one line naming ``key``."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"attention", "mlp", "source"}:
        raise SpecbenchError(f"drafter.{key} must be {{attention: [layers], mlp: [layers]}} (layers from 0), got "
                             f"{value!r}")
    sets = {}
    for part in ("attention", "mlp"):
        layers = value.get(part) or []
        if not isinstance(layers, (list, tuple)) or not all(
                isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0 for layer in layers):
            raise SpecbenchError(f"drafter.{key}.{part} must be a list of layer indices from 0, got {layers!r}")
        sets[part] = frozenset(layers)
    return LayerSkip(sets["attention"], sets["mlp"])


def drafting_target(drafter_name: str, target):
    """The Target a self-speculative drafter drafts on (``Drafter.decodes_with``), refused in one line when it has
    no layer-skipping pass."""
    from specbench.decoding.target import Target

    if type(target).skipping_pass is Target.skipping_pass:
        raise SpecbenchError(f"drafter={drafter_name} drafts with the target's own layers, which the "
                             f"{type(target).__name__} target cannot skip; use the transformers, reference or compiled "
                             "target (model.target)")
    return target


def skipping_chain(target, context_ids: np.ndarray, skip: LayerSkip, max_steps: int,
                   choose: Callable[[torch.Tensor], tuple[int, bool]]) -> list[int]:
    """Draft up to ``max_steps`` tokens after ``context_ids`` with the target's skipping passes: the first pass
    reads what the cache lacks of the context (the last step's bonus token), then one pass per drafted token.
    ``choose(logits)`` ([vocab] of the last position) gives the next token and whether to draft another after it.
    The cache is truncated back to where it was, also when a pass fails: the verification recomputes every layer."""
    start = target.length
    if start >= context_ids.size:
        raise SpecbenchError(f"a self-speculative draft after {context_ids.size} tokens found {start} in the cache: "
                             "the loop and the drafter disagree about the sequence")
    tokens: list[int] = []
    try:
        logits = target.skipping_pass(np.ascontiguousarray(context_ids[start:]), skip)[-1]
        while True:
            token, go_on = choose(logits)
            tokens.append(token)
            if not go_on or len(tokens) >= max_steps:
                break
            logits = target.skipping_pass(np.asarray([token], dtype=np.int64), skip)[-1]
    finally:
        target.truncate(start)
    return tokens
