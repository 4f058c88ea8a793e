"""A KV cache whose buffers are allocated once and never move, for a compiled forward (``run.regime=compiled``).

A compiled graph (inductor's code, a captured CUDA graph) is specialised to the shapes and, for CUDA graphs, the
addresses of its inputs. So every layer here owns one [1, kv_heads, capacity, head_dim] buffer for keys and one
for values, sized once for the run's longest sequence; a pass writes its q new entries at cache positions
``write_at + 0 .. q-1``, where ``write_at`` is a one-element device tensor (a Python int would be a constant of
the graph, one compile per position), and attends over the buffer's first ``len(columns)`` positions, where
``columns`` is a view of ``arange(capacity)`` whose length is a dynamic dimension of the graph (marked so by the
target before each pass), through a [q, len(columns)] mask that hides every position not yet written. Attending
over the whole buffer instead cost the embedded model's pass of 8 tokens 41.6 ms with a 1,280-token buffer
against 32.0 with a 512-token one (a CPU's SDPA with a mask pays for every masked column). Forgetting rejected tokens is only a smaller
``write_at``; keeping a tree's accepted path is a gather and a copy inside each buffer, between passes, outside
the compiled graph.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer


class _StaticTreeLayer(DynamicLayer):
    """One layer's keys and values in fixed buffers; ``write_at`` (shared by every layer) says where a pass writes."""

    def __init__(self, capacity: int, cache: StaticTreeCache):
        super().__init__()
        self.capacity = int(capacity)
        self.cache = cache  # its write_at and columns, shared by every layer
        self.length = 0  # on the host: the filled prefix, which the Target keeps equal to write_at

    def allocate(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (1, kv_heads, self.capacity, head_dim)
        # Zeros, not empty: a masked position still enters the attention's product (times a zero weight), and an
        # uninitialised NaN there would make the product NaN.
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.dtype, self.device = dtype, device
        self.is_initialized = True
        if device.type == "cuda":
            # A captured graph reads the buffers at fixed addresses: dynamo must not copy them into its own.
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states.shape[1], key_states.shape[-1], key_states.dtype, key_states.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.cache.write_at + torch.arange(key_states.shape[-2], device=self.keys.device)
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        visible = self.cache.columns.shape[0]
        return self.keys[:, :, :visible], self.values[:, :, :visible]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query) -> tuple[int, int]:
        """The mask spans the attended columns (the caller's mask hides what is not written)."""
        return self.cache.columns.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return self.capacity

    def crop(self, count: int) -> None:
        self.length = self.length + count if count < 0 else min(self.length, count)

    def move(self, start: int, offsets: torch.Tensor, count: int) -> None:
        """The entries at ``start + offsets`` to ``start, start+1, ...`` (``count`` of them)."""
        source = offsets + start
        self.keys[..., start : start + count, :] = self.keys.index_select(-2, source)
        self.values[..., start : start + count, :] = self.values.index_select(-2, source)


class StaticTreeCache(Cache):
    """A transformers ``Cache`` of fixed buffers for one sequence (batch size 1) of at most ``capacity`` tokens."""

    is_compileable = True

    def __init__(self, num_layers: int, capacity: int, device: torch.device):
        self.capacity = int(capacity)
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)
        self.all_columns = torch.arange(self.capacity, device=device)
        self.columns = self.all_columns  # the positions the next pass attends over (``attend``)
        super().__init__(layers=[_StaticTreeLayer(capacity, self) for _ in range(num_layers)])

    def attend(self, count: int) -> torch.Tensor:
        """The next pass attends over the first ``count`` positions: ``columns`` becomes a view of that length,
        whose length a compiled graph takes as a dynamic dimension (one graph for every length)."""
        self.columns = self.all_columns[:count]
        torch._dynamo.mark_dynamic(self.columns, 0)
        return self.columns

    def allocate(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Every layer's buffers now, before any pass: a compiled pass must find them in place."""
        for layer in self.layers:
            layer.allocate(kv_heads, head_dim, dtype, device)

    @property
    def length(self) -> int:
        return self.layers[0].length

    def set_length(self, length: int) -> None:
        """The filled prefix is ``length`` tokens: the next pass writes from there."""
        for layer in self.layers:
            layer.length = length
        self.write_at.fill_(length)

    def truncate(self, length: int) -> None:
        self.set_length(min(self.length, length))

    def keep_nodes(self, start: int, node_indices: list[int], upload=None) -> None:
        """After a pass written from ``start``, keep the entries of ``node_indices`` (ascending, node 0 first),
        moved next to each other (a chain's accepted prefix is already in place); ``upload(array, device)`` puts
        their offsets on the buffers' device."""
        count = len(node_indices)
        if node_indices[-1] != count - 1:
            indices = np.asarray(node_indices, dtype=np.int64)
            device = self.write_at.device
            offsets = torch.as_tensor(indices, device=device) if upload is None else upload(indices, device)
            for layer in self.layers:
                layer.move(start, offsets, count)
        self.set_length(start + count)
