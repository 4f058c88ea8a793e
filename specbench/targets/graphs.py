"""Captured passes for the compiled regime on a GPU: one CUDA graph per pass shape, replayed with new inputs.

Why: run eagerly on a GPU, a pass of a 7B model is a thousand kernel launches from Python, and on the H200 check
(docs/gpu.md) it took 20-100 ms where reading the weights takes about 3; a CUDA graph launches the same kernels in
one call. A graph replays the kernels it recorded on the addresses it recorded, so everything a pass reads or writes
lives at a fixed address: its inputs are copied into the graph's own input tensors before each replay, the KV cache
is the compiled regime's ``StaticTreeCache`` (buffers allocated once, written at a device-side position), and its
outputs are the graph's own tensors, overwritten by the next replay (a caller that keeps one copies it).

``CudaGraphs`` captures on a CUDA device; ``HostReplay`` stands in for it on a CPU with the same contract (inputs
copied in, outputs written into the first call's tensors), so that what a GPU run relies on, the target's side of
the contract, is checked by the CPU test suite too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Calls before a capture: torch.compile compiles (and inductor autotunes) on the first, lazily initialised state
# (cuBLAS handles, workspaces) settles on the first few; a capture must find nothing left to set up.
WARM_UP_CALLS = 3


@dataclass
class Captured:
    """One pass shape's graph, the input tensors it reads and the output tensors it writes."""

    inputs: tuple[torch.Tensor, ...]
    outputs: Any  # what the pass returned while captured: tensors, None, or tuples of them
    launch: Callable[[], None]

    def replay(self, *inputs: torch.Tensor):
        """The pass over ``inputs`` (same shapes and dtypes as captured): copied into the graph's inputs, the graph
        launched; its outputs, which the next replay overwrites."""
        for static, given in zip(self.inputs, inputs, strict=True):
            static.copy_(given)
        self.launch()
        return self.outputs


class CudaGraphs:
    """Captures passes on one CUDA device into graphs sharing one memory pool (replayed one at a time, never
    concurrently, so their temporaries can share memory; the largest captured first, as vLLM does)."""

    kind = "cuda"

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, run: Callable, inputs: tuple[torch.Tensor, ...]) -> Captured:
        """``run(*inputs)`` warmed up on a side stream (as torch requires before a capture), then captured."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARM_UP_CALLS):
                run(*inputs)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = run(*inputs)
        return Captured(inputs=inputs, outputs=outputs, launch=graph.replay)

    def memory_bytes(self) -> int:
        """What the device's caching allocator holds now (the graphs' pool included)."""
        return int(torch.cuda.memory_reserved(self.device))


class HostReplay:
    """``CudaGraphs``' contract on a CPU, for tests: a replay calls the pass again over the captured input tensors
    and writes its results into the tensors the capture returned, as a graph overwrites its outputs."""

    kind = "host"

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self.captures = 0

    def capture(self, run: Callable, inputs: tuple[torch.Tensor, ...]) -> Captured:
        for _ in range(WARM_UP_CALLS):
            run(*inputs)
        outputs = run(*inputs)
        self.captures += 1

        def launch():
            _copy_into(outputs, run(*inputs))

        return Captured(inputs=inputs, outputs=outputs, launch=launch)

    def memory_bytes(self) -> int:
        return 0


def _copy_into(kept, fresh) -> None:
    if isinstance(kept, torch.Tensor):
        kept.copy_(fresh)
    elif isinstance(kept, (tuple, list)):
        for each_kept, each_fresh in zip(kept, fresh, strict=True):
            _copy_into(each_kept, each_fresh)
