"""The target as the decoding loop sees it: a small interface, so that the loop is the same whether the model runs
on a CPU, one GPU, layers spread over several GPUs (accelerate's ``device_map``) or one shard per process under
transformers' tensor parallelism, or in another engine altogether.

The loop owns drafting, planning, acceptance and the records; a target owns the model, its KV cache of the one
sequence being decoded, the transfers between host and device, and the fence of the loop's clock. Per greedy step
the loop asks it for one verification pass and reads back one small block of choices: that read is the only
blocking device-to-host transfer of a step.

Implementations live in ``specbench.targets``: ``transformers.TransformersTarget`` (a KV cache edited in place) and
``reference.ReferenceTarget`` (no cache: one full forward over the whole sequence per pass, the oracle the contract
tests hold the other to). What builders need from a model besides decoding is ``specbench.targets.weights``'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TargetChoices:
    """What one forward pass of the target says, on the host: per scored position its argmax (the first best
    index, as plain greedy decoding picks) and its top ``k`` tokens with their logits (best first). ``logits``
    stays on the device, for sampling."""

    argmax: np.ndarray  # [n_nodes]
    top_ids: np.ndarray  # [n_nodes, k]
    top_logits: np.ndarray  # [n_nodes, k]
    logits: torch.Tensor  # [n_nodes, vocab]


@dataclass(frozen=True)
class VerifyInputs:
    """The host side of one verification pass: ``tokens`` and ``positions`` ([q] int64) of the nodes written from
    cache position ``start``, and ``visible`` ([q, q] bool), which of them each may attend to (every cached
    position before ``start`` is visible to all). Built on the host without touching the device."""

    tokens: np.ndarray
    positions: np.ndarray
    visible: np.ndarray
    start: int


class Target(ABC):
    """A target model decoding one sequence at a time.

    vocab_size: the size of its output layer (every choice is below it).
    num_layers: its decoder layers, for drafters that read hidden states.
    device:     where its logits are (the choices' ``logits``; the loop's random draws, a draft model and the
                sampling verifier run there); a pass whose logits come back elsewhere is refused.
    devices:    every device holding part of the model (what the runner's GPU-memory figures cover), an attribute
                of each implementation.
    """

    vocab_size: int
    num_layers: int
    device: torch.device
    regime: str = "eager"  # run.regime: how its passes run ("compiled": specbench.targets.compiled)

    def prepare(self, longest_sequence: int, largest_pass: int, hidden_layers: list[tuple[int, ...]],
                progress=None) -> None:
        """Get ready, before anything is timed, for sequences of up to ``longest_sequence`` tokens verified up to
        ``largest_pass`` tokens at a time, asking for the hidden states of each of ``hidden_layers`` (() for
        none): a compiled target compiles its passes here (``progress``: a tqdm-like factory for the bar). An
        eager target needs nothing."""

    @abstractmethod
    def start(self, capacity: int) -> None:
        """Begin a new sequence with an empty KV cache sized for ``capacity`` tokens (it grows if needed)."""

    @abstractmethod
    def release(self) -> None:
        """Forget the sequence (its KV cache and whatever a pass left on the device), so the target is as a fresh
        one would be: after every decode, and after any error the caller goes on from (an out-of-memory error
        inside a pass). ``start`` begins the next sequence."""

    @property
    @abstractmethod
    def length(self) -> int:
        """Tokens in the KV cache of the sequence (0 after ``release``)."""

    @abstractmethod
    def prefill(self, prompt_ids: np.ndarray, every_position: bool, top_k: int) -> TargetChoices:
        """Read ``prompt_ids`` ([len] int64) into the cache; the choices after the last prompt token, or after
        every one (row i: after prompt token i)."""

    @abstractmethod
    def verify(self, inputs: VerifyInputs, n_nodes: int, top_k: int) -> TargetChoices:
        """One forward pass over ``inputs`` on top of the cache; the choices of its first ``n_nodes`` positions
        (the rest is padding, whose outputs are dropped)."""

    @abstractmethod
    def keep(self, start: int, nodes: list[int]) -> None:
        """After a pass written from ``start``, keep the cache entries of ``nodes`` (ascending, node 0 first)
        and forget the rest."""

    @abstractmethod
    def truncate(self, length: int) -> None:
        """Forget every cache entry from position ``length`` on."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all work queued on the devices the model uses: the fence of the loop's clock."""

    @abstractmethod
    def upload(self, array: np.ndarray, role: str = "upload") -> torch.Tensor:
        """``array`` on the logits' device, without blocking the host where the device allows it; ``role`` names
        the upload, so that two uploads of one step never share a staging buffer."""

    def request_hidden_states(self, layers: tuple[int, ...]) -> None:
        """From the next pass on, keep the hidden states of ``layers`` (0 = the embeddings' output, i = after
        decoder layer i), for drafters that read the target's features; () keeps none."""
        if layers:
            raise NotImplementedError(f"{type(self).__name__} does not expose hidden states")

    def checked_hidden_layers(self, layers: tuple[int, ...]) -> tuple[int, ...]:
        """``layers`` as ints, each refused in one line unless 0 (the embeddings' output) .. ``num_layers``: the
        check every implementation of ``request_hidden_states`` makes."""
        from specbench.errors import SpecbenchError

        for layer in layers:
            if not 0 <= layer <= self.num_layers:
                raise SpecbenchError(f"hidden states of layer {layer} requested; the target has layers 0.."
                                     f"{self.num_layers} (0: the embeddings' output)")
        return tuple(int(layer) for layer in layers)

    def hidden_states(self, rows: list[int] | None = None) -> torch.Tensor | None:
        """[len(layers), n, hidden] the requested layers' states at ``rows`` of the last pass (all rows when
        None), on the device; None when none were requested."""
        return None
