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


@dataclass(frozen=True)
class LayerSkip:
    """The sublayers of the target a self-speculative draft leaves out (Draft & Verify, SWIFT): ``attention`` and
    ``mlp``, sets of decoder-layer indices from 0. A skipped sublayer adds nothing to the residual stream: the
    layer's input passes through it unchanged."""

    attention: frozenset[int]
    mlp: frozenset[int]

    def __post_init__(self):
        object.__setattr__(self, "attention", frozenset(int(i) for i in self.attention))
        object.__setattr__(self, "mlp", frozenset(int(i) for i in self.mlp))

    def __len__(self) -> int:
        return len(self.attention) + len(self.mlp)

    def checked(self, num_layers: int, what: str) -> LayerSkip:
        """This skip set, refused in one line (naming ``what``: where it came from) when an index is not a layer of
        a ``num_layers``-layer target, or when it leaves out every sublayer."""
        from specbench.errors import SpecbenchError

        outside = sorted(i for i in self.attention | self.mlp if not 0 <= i < num_layers)
        if outside:
            raise SpecbenchError(f"{what} skips layer(s) {outside[:5]} of a target with layers 0..{num_layers - 1}: "
                                 "it was made for another model")
        if len(self) >= 2 * num_layers:
            raise SpecbenchError(f"{what} skips every one of the target's {2 * num_layers} sublayers: its draft "
                                 "would read nothing but the embeddings")
        return self


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

    def skipping_pass(self, tokens: np.ndarray, skip: LayerSkip, after: int | None = None) -> torch.Tensor:
        """[len(tokens), vocab] the logits of a chain pass over ``tokens`` ([q] int64) written into the cache from
        ``length`` on, with the sublayers of ``skip`` left out: self-speculative drafting (Draft & Verify, SWIFT),
        the target's own layers over its own cache. The pass's entries stay, valid only for more passes with the
        same ``skip`` (a skipped attention's are placeholders), until the drafter ``truncate``s back to where its
        first pass began, as it must before the loop's next ``verify``, which recomputes every layer.

        after: the tokens continue the first ``after`` cached positions instead of all of them (they see only those
        and sit at positions ``after``, ``after + 1``, ...): SWIFT scores a skip set on the answer so far read
        again right after the prompt, on the prompt's entries alone. None: after everything cached."""
        from specbench.errors import SpecbenchError

        raise SpecbenchError(f"the {type(self).__name__} target cannot run a pass with layers skipped, which "
                             "self-speculative drafters (drafter=self-spec, swift) draft with")

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
