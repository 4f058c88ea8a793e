"""Passes of a transformers decoder with some of its sublayers left out, for self-speculative drafting (Draft &
Verify, SWIFT): the target drafts with a shallower copy of itself that shares every weight and the KV cache.

A decoder layer adds its attention's output and then its MLP's to the residual stream; leaving a sublayer out
means adding nothing, so for the duration of the pass the sublayer's ``forward`` is replaced by one returning zeros
of its input's shape (``residual + 0`` is the residual, exactly). The replacement is an attribute of the module
instance, deleted when the pass ends, so no other pass, and no graph compiled from the model, ever sees it.

A skipped attention computes no keys or values. A cache whose layers keep lengths of their own (``TreeKVCache``)
is still moved on by the pass's tokens at that layer (``on_skipped_attention``), so that every layer agrees on the
sequence's length while the draft grows; the entries it leaves there are never read (the draft skips that layer at
every pass) and are cut off with the rest of the draft before verification, which recomputes every layer.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch

from specbench.decoding.target import LayerSkip
from specbench.errors import SpecbenchError


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM, in order; a one-line error for a model whose layers
    specbench cannot find (each must have ``self_attn`` and ``mlp``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in layers):
        raise SpecbenchError(f"layer-skipping drafts need a decoder of layers with self_attn and mlp sublayers; "
                             f"{type(model).__name__} has none specbench knows")
    return list(layers)


def skipping_mask(start: int, size: int, after: int) -> np.ndarray:
    """[size, start + size] which columns each of a skipping pass's ``size`` tokens, written from cache position
    ``start``, may attend to: the first ``after`` cached positions and the pass's own tokens up to itself."""
    mask = np.zeros((size, start + size), dtype=bool)
    mask[:, :after] = True
    mask[:, start:] = np.tril(np.ones((size, size), dtype=bool))
    return mask


def _zeros_like_input(on_skip: Callable[[int], None] | None, returns_weights: bool):
    def skipped(hidden_states: torch.Tensor, *args, **kwargs):
        if on_skip is not None:
            on_skip(hidden_states.shape[-2])
        zeros = torch.zeros_like(hidden_states)
        return (zeros, None) if returns_weights else zeros

    return skipped


@contextmanager
def skipped_sublayers(model: torch.nn.Module, skip: LayerSkip,
                      on_skipped_attention: Callable[[int, int], None] | None = None,
                      skip_rows_from: int | None = None):
    """Within the block, the passes of ``model`` leave out the sublayers of ``skip``.

    on_skipped_attention(layer, tokens): called where a skipped attention would have written its keys and values
    for the pass's ``tokens`` (a cache of per-layer lengths moves on there).
    skip_rows_from: leave the sublayers out only for the rows from this index on, computing them for the rows
    before (the reference target's full forward, whose first rows are the sequence kept before the draft).
    """
    layers = decoder_layers(model)
    patched: list[torch.nn.Module] = []
    try:
        for index, layer in enumerate(layers):
            for sublayer, skipped, is_attention in ((layer.self_attn, skip.attention, True),
                                                    (layer.mlp, skip.mlp, False)):
                if index not in skipped:
                    continue
                if skip_rows_from is None:
                    on_skip = None
                    if is_attention and on_skipped_attention is not None:
                        on_skip = (lambda tokens, layer_index=index: on_skipped_attention(layer_index, tokens))
                    sublayer.forward = _zeros_like_input(on_skip, returns_weights=is_attention)
                else:
                    sublayer.forward = _rows_zeroed(type(sublayer).forward.__get__(sublayer), skip_rows_from,
                                                    returns_weights=is_attention)
                patched.append(sublayer)
        yield
    finally:
        for sublayer in patched:
            del sublayer.forward  # the class's forward again


def _rows_zeroed(forward, first_row: int, returns_weights: bool):
    def partly_skipped(hidden_states: torch.Tensor, *args, **kwargs):
        output = forward(hidden_states, *args, **kwargs)
        values = output[0] if returns_weights else output
        values = values.clone()
        values[..., first_row:, :] = 0
        return (values, None) if returns_weights else values

    return partly_skipped
