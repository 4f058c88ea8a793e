"""A KV cache that appends in place and keeps only the accepted path of a verified tree.

transformers' DynamicLayer appends with ``torch.cat``, copying the whole history of every layer on every
forward pass; on a CPU that copy is a visible share of a decoding step. Here each layer owns a buffer that
grows by doubling, a forward pass writes its new keys/values into the free tail and reads a view of the
filled part, and discarding rejected draft tokens is only a change of the filled length (plus, for a tree,
moving the accepted nodes' entries next to each other).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer


class _GrowingLayer(DynamicLayer):
    """One layer's keys/values in a buffer [batch, kv_heads, capacity, head_dim] filled up to ``length``."""

    def __init__(self, initial_capacity: int):
        super().__init__()
        self._capacity = max(int(initial_capacity), 1)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (*key_states.shape[:2], self._capacity, key_states.shape[-1])
        self._key_buffer = key_states.new_empty(shape)
        self._value_buffer = value_states.new_empty((*value_states.shape[:2], self._capacity, value_states.shape[-1]))
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        capacity = self._key_buffer.shape[-2]
        while capacity < needed:
            capacity *= 2
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], capacity, old.shape[-1]))
            new[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            self._grow(end)
        self._key_buffer[..., self.length : end, :] = key_states
        self._value_buffer[..., self.length : end, :] = value_states
        self.length = end
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]
        return self.keys, self.values

    def advance(self, count: int) -> None:
        """``count`` more entries whose values are left as they are: a skipped layer's placeholders in a
        self-speculative draft (``targets.layer_skip``), which nothing reads before they are cut off."""
        end = self.length + count
        if not self.is_initialized:  # a draft before anything was cached: the buffers come with the first write
            self.length = end
            return
        if end > self._key_buffer.shape[-2]:
            self._grow(end)
        self.length = end
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query: int | torch.Tensor) -> tuple[int, int]:
        """(kv_length, kv_offset) of the mask for a query. transformers 5.4 and later pass the query's length,
        5.0 to 5.3 its ``cache_position`` (one position per query token)."""
        query_length = query.shape[0] if isinstance(query, torch.Tensor) else query
        return self.length + query_length, 0

    def crop(self, count: int) -> None:
        """A negative ``count`` removes that many entries (every 5.x release); a positive one is the length to
        keep, as transformers before 5.15 meant it (later releases never pass one)."""
        self.truncate(self.length + count if count < 0 else (count or self.length))

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)
        if self.is_initialized:
            self.keys = self._key_buffer[..., : self.length, :]
            self.values = self._value_buffer[..., : self.length, :]

    def keep(self, start: int, offsets: torch.Tensor | None, count: int) -> None:
        """Keep ``count`` entries: those at ``start + offsets`` move to ``start, start+1, ...``.

        offsets=None means the first ``count`` entries after ``start`` already are the ones to keep.
        """
        if offsets is not None and self.is_initialized:
            source = offsets + start
            self._key_buffer[..., start : start + count, :] = self._key_buffer.index_select(-2, source)
            self._value_buffer[..., start : start + count, :] = self._value_buffer.index_select(-2, source)
        self.length = start + count
        if self.is_initialized:
            self.keys = self._key_buffer[..., : self.length, :]
            self.values = self._value_buffer[..., : self.length, :]


class TreeKVCache(Cache):
    """A transformers ``Cache`` of growing layers, for one sequence (batch size 1)."""

    def __init__(self, num_layers: int, initial_capacity: int):
        super().__init__(layers=[_GrowingLayer(initial_capacity) for _ in range(num_layers)])

    @property
    def length(self) -> int:
        return self.layers[0].length

    def truncate(self, length: int) -> None:
        """Forget every entry from position ``length`` on."""
        for layer in self.layers:
            layer.truncate(length)

    def keep_nodes(self, start: int, node_indices: list[int], upload=None) -> None:
        """After verifying nodes written from position ``start``, keep only ``node_indices`` (ascending, node
        0 first) and drop the rest. A chain's accepted prefix is already in place, so nothing moves.
        ``upload(array, device)`` puts the node offsets on a layer's device (layers may sit on several)."""
        count = len(node_indices)
        contiguous = node_indices[-1] == count - 1
        offsets_on: dict = {}
        for layer in self.layers:
            offsets = None
            if not contiguous and layer.is_initialized:
                offsets = offsets_on.get(layer.device)
                if offsets is None:
                    indices = np.asarray(node_indices, dtype=np.int64)
                    offsets = (torch.as_tensor(indices, device=layer.device) if upload is None
                               else upload(indices, layer.device))
                    offsets_on[layer.device] = offsets
            layer.keep(start, offsets, count)
