"""The target model as the builders and run.json see it: everything they need from a model apart from decoding
one sequence (which is ``specbench.decoding.target.Target``'s job), so that no builder reads a transformers
module, its ``config`` or its ``generate``.

Who asks for what:

- run.json and the resume check: ``fingerprint``, ``dtype``, ``parameter_count``, ``linear_backend_used``;
- estimates of build times: ``architecture`` (the weight count per token);
- the target's cached answers (HD's model database, distillation) and EAGLE training's sampled answers:
  ``generate``, greedy or sampled, in batches;
- EAGLE heads (building, loading, checking): ``hidden_size``, ``architecture``, ``input_embeddings``,
  ``output_layer``; EAGLE training: ``hidden_states_and_logits``;
- the pruned draft: ``pruned_copy`` and, to distil it, ``logits``.

A backend implements this next to its ``Target`` (``specbench.targets.transformers.TransformersWeights``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class TargetWeights(ABC):
    """A loaded target model's weights and the batched passes builders run over them.

    vocab_size:   rows of its output layer.
    num_layers:   its decoder layers (hidden states are numbered 0 = the embeddings' output .. num_layers).
    hidden_size:  the width of its hidden states.
    input_device: where its inputs go (the embeddings' device); every tensor argument below is moved there.
    """

    vocab_size: int
    num_layers: int
    hidden_size: int
    input_device: torch.device

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The precision its weights are held in."""

    @property
    @abstractmethod
    def parameter_count(self) -> int:
        """Parameters of the whole model (under tensor parallelism: of every shard together)."""

    @property
    @abstractmethod
    def fingerprint(self) -> str:
        """A short hash of the weights: two checkpoints, seeds or precisions differ in it (run.json's
        ``weights_fingerprint``; computed once)."""

    @property
    @abstractmethod
    def linear_backend_used(self) -> str:
        """The kernels its linear layers run on (``onednn`` or ``aten``), as run.json records them."""

    @property
    @abstractmethod
    def architecture(self) -> dict:
        """The text model's settings as its config.json states them (``hidden_size``, ``num_hidden_layers``,
        ``intermediate_size``, ``num_attention_heads``, ``rope_theta`` or ``rope_parameters``, ...): a copy."""

    @abstractmethod
    def input_embeddings(self) -> torch.Tensor:
        """[vocab, hidden] the input embedding matrix itself (not a copy: an EAGLE-3 head shares it), whole
        under tensor parallelism."""

    @abstractmethod
    def output_layer(self) -> torch.nn.Module:
        """The output layer (hidden -> vocabulary logits) as a module an EAGLE-1 head can call: the model's own
        or, where it is sharded, a frozen whole copy."""

    @abstractmethod
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 eos_token_ids: frozenset[int], pad_token_id: int, temperature: float | None = None) -> torch.Tensor:
        """[batch, <= max_new_tokens] the continuations of a left-padded batch ``input_ids`` ([batch, width],
        ``attention_mask`` 1 on the real tokens); greedy when ``temperature`` is None, else sampled from the whole
        distribution at that temperature (no top-k, no top-p) with torch's global generator. Rows that ended at
        an EOS are filled with ``pad_token_id``."""

    @abstractmethod
    def hidden_states_and_logits(self, token_ids: torch.Tensor, layers: tuple[int, ...]
                                 ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One pass over ``token_ids`` ([n] int64, one sequence): the hidden states of ``layers`` (each [n, hidden])
        and the logits ([n, vocab]), on the device."""

    @abstractmethod
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[rows, n, vocab] the logits of a batch of sequences ``input_ids`` ([rows, n], no padding): a teacher's
        distributions for distillation."""

    @abstractmethod
    def pruned_copy(self, layers: list[int]) -> torch.nn.Module:
        """A new model of the same architecture with only ``layers`` of the decoder layers (renumbered 0..k-1),
        float32 on the host, with trainable standard linear layers: the draft that distillation trains."""

    def layer_keys_values(self, layer: int) -> torch.nn.Module:
        """A module computing decoder layer ``layer``'s KV-cache entries (keys rotated) from the layer's input
        hidden states, with the target's rotary embedding (``specbench.targets.layer_keys.LayerKeysValues``): what
        LongSpec's drafter cross-attends to. A backend that cannot say refuses in one line."""
        from specbench.errors import SpecbenchError

        raise SpecbenchError(f"{type(self).__name__} cannot recompute its layers' cache entries, which "
                             "drafter=longspec reads")

    @abstractmethod
    def save_checkpoint(self, directory) -> None:
        """Write the weights and their config into ``directory`` as a Hugging Face checkpoint (config.json and
        safetensors), for another engine to load: vLLM reads a model built in memory from there."""
