"""The reference target: the ``Target`` contract kept with no KV cache at all, as the oracle the contract tests
hold every other target to. Slow and obviously right.

It keeps the token ids a cache would hold and, at every pass, runs one full forward over all of them plus the
pass's nodes, with the attention mask built over the whole sequence: the kept tokens see the kept tokens before
them (causal), each node sees every kept token and the nodes its [q, q] block makes visible. ``keep`` and
``truncate`` only edit the list of ids, so whatever a cached target gets wrong in moving or cropping its cache,
this one cannot: its every answer is a fresh forward of the sequence the loop believes it has.

Worked example: 3 kept tokens [a b c], then a pass over a tree of nodes [r x y] where x and y are both children
of r (visible block ``[[1 0 0], [1 1 0], [1 0 1]]``, positions [3 4 4]). The pass is one forward over
[a b c r x y] at positions [0 1 2 3 4 4] with the mask (rows attend to columns)::

        a b c r x y
    a   1 0 0 0 0 0
    b   1 1 0 0 0 0
    c   1 1 1 0 0 0
    r   1 1 1 1 0 0
    x   1 1 1 1 1 0
    y   1 1 1 1 0 1

and its choices are the rows of r, x and y. ``keep(3, [0, 2])`` leaves [a b c r y].
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.target import LayerSkip, Target, TargetChoices, VerifyInputs
from specbench.errors import SpecbenchError
from specbench.targets.transformers import NonFiniteLogits, model_devices


class ReferenceTarget(Target):
    """A transformers causal LM (SDPA attention) behind the ``Target`` interface, one full forward per pass."""

    def __init__(self, model: torch.nn.Module):
        if getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "flash_attention_2"):
            # A boolean 4-D mask means "may attend" to SDPA; eager attention would add it as a bias.
            raise SpecbenchError("the target model must use SDPA attention for tree verification")
        text_config = model.config.get_text_config()
        self.model = model
        self.vocab_size = int(text_config.vocab_size)
        self.num_layers = int(text_config.num_hidden_layers)
        self.input_device, self.device, self.devices = model_devices(model)
        self._tokens: np.ndarray | None = None  # [length] int64: what a KV cache would hold
        self._hidden_layers: tuple[int, ...] = ()
        self._hidden: torch.Tensor | None = None  # [len(layers), rows of the last pass, hidden]
        self._draft_from: int | None = None  # where the skipping passes since the last cache edit began

    def start(self, capacity: int) -> None:
        self.release()
        self._tokens = np.zeros(0, dtype=np.int64)

    def release(self) -> None:
        self._tokens = None
        self._hidden = None
        self._draft_from = None

    @property
    def length(self) -> int:
        return 0 if self._tokens is None else int(self._tokens.size)

    def keep(self, start: int, nodes: list[int]) -> None:
        self._draft_from = None
        pass_tokens = self._tokens[start:]
        self._tokens = np.concatenate([self._tokens[:start], pass_tokens[np.asarray(nodes, dtype=np.int64)]])

    def truncate(self, length: int) -> None:
        self._tokens = self._tokens[:length]
        if self._draft_from is not None:
            if length <= self._draft_from:
                self._draft_from = None
            else:  # the passes cut off are forgotten with their rows
                kept = [(row, rows[: length - row]) for row, rows in self._draft_masks if row < length]
                self._draft_positions = [positions[: rows.shape[0]]
                                         for positions, (_, rows) in zip(self._draft_positions, kept)]
                self._draft_masks = kept

    def skipping_pass(self, tokens: np.ndarray, skip: LayerSkip, after: int | None = None) -> torch.Tensor:
        """The same pass without a cache: one full forward over the kept tokens and every token the skipping
        passes since the last cache edit wrote, whose rows (from ``_draft_from`` on) leave the sublayers of
        ``skip`` out while the kept rows compute them all, as a cache holding them would have; each of those rows
        sees what its pass let it see (``after``), as recorded here."""
        from specbench.targets.layer_skip import skipped_sublayers, skipping_mask

        tokens = np.asarray(tokens, dtype=np.int64)
        if self._draft_from is None:
            self._draft_from = self.length
            self._draft_masks, self._draft_positions = [], []
        start = self.length
        first = start if after is None else after
        self._draft_masks.append((start, skipping_mask(start, tokens.size, first)))
        self._draft_positions.append(np.arange(first, first + tokens.size, dtype=np.int64))
        self._tokens = np.concatenate([self._tokens, tokens])
        total = self._tokens.size
        mask = np.zeros((total, total), dtype=bool)
        mask[: self._draft_from, : self._draft_from] = np.tril(np.ones((self._draft_from,) * 2, dtype=bool))
        for row, rows in self._draft_masks:
            mask[row : row + rows.shape[0], : rows.shape[1]] = rows
        positions = np.concatenate([np.arange(self._draft_from, dtype=np.int64), *self._draft_positions])
        with skipped_sublayers(self.model, skip, skip_rows_from=self._draft_from):
            output = self.model(input_ids=self._on_inputs(self._tokens)[None],
                                position_ids=self._on_inputs(positions)[None],
                                attention_mask=self._on_inputs(mask)[None, None], use_cache=False)
        return output.logits[0, start:]

    def prefill(self, prompt_ids: np.ndarray, every_position: bool, top_k: int) -> TargetChoices:
        prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
        self._tokens = np.concatenate([self._tokens, prompt_ids])
        start = self._tokens.size - prompt_ids.size
        causal = np.tril(np.ones((prompt_ids.size, prompt_ids.size), dtype=bool))
        positions = np.arange(start, self._tokens.size, dtype=np.int64)
        logits = self._forward_over_everything(start, prompt_ids, positions, causal)
        return self._choices(logits if every_position else logits[-1:], top_k)

    def verify(self, inputs: VerifyInputs, n_nodes: int, top_k: int) -> TargetChoices:
        if self._draft_from is not None:
            raise SpecbenchError(f"a pass verified over a skipping draft's {self.length - self._draft_from} "
                                 "entries: the drafter must truncate them first")
        if inputs.start != self.length:
            raise SpecbenchError(f"a pass written from position {inputs.start} over a sequence of {self.length} "
                                 "tokens: the loop and the target disagree about the sequence")
        self._tokens = np.concatenate([self._tokens, inputs.tokens.astype(np.int64)])
        logits = self._forward_over_everything(inputs.start, inputs.tokens, inputs.positions, inputs.visible)
        return self._choices(logits[:n_nodes], top_k)

    def _forward_over_everything(self, start: int, tokens: np.ndarray, positions: np.ndarray,
                                 visible: np.ndarray) -> torch.Tensor:
        """[q, vocab] the logits of the pass's ``tokens`` ([q]), from one forward over the kept tokens before
        ``start`` and them (the kept ones at positions 0..start-1, causal; the pass's at ``positions``, each
        seeing every kept token and the pass's tokens ``visible`` [q, q] marks)."""
        size = tokens.size
        total = start + size
        mask = np.zeros((total, total), dtype=bool)
        mask[:start, :start] = np.tril(np.ones((start, start), dtype=bool))
        mask[start:, :start] = True
        mask[start:, start:] = visible
        all_positions = np.concatenate([np.arange(start, dtype=np.int64), positions.astype(np.int64)])
        output = self.model(input_ids=self._on_inputs(self._tokens[:total])[None],
                            position_ids=self._on_inputs(all_positions)[None],
                            attention_mask=self._on_inputs(mask)[None, None],
                            use_cache=False, output_hidden_states=bool(self._hidden_layers))
        if self._hidden_layers:
            self._hidden = torch.stack([output.hidden_states[layer][0, start:].to(self.device)
                                        for layer in self._hidden_layers])
        logits = output.logits[0, start:]
        if logits.device != self.device:
            raise SpecbenchError(f"the target's logits came back on {logits.device}, not {self.device}")
        return logits

    def _choices(self, logits: torch.Tensor, top_k: int) -> TargetChoices:
        if not torch.isfinite(logits).all():
            rows = int((~torch.isfinite(logits).all(dim=-1)).sum())
            dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
            raise NonFiniteLogits(dtype, rows, logits.shape[0])
        k = min(max(top_k, 1), logits.shape[-1])
        top_logits, top_ids = logits.topk(k, dim=-1)
        return TargetChoices(argmax=logits.argmax(dim=-1).cpu().numpy().astype(np.int64),
                             top_ids=top_ids.cpu().numpy().astype(np.int64),
                             top_logits=top_logits.float().cpu().numpy(), logits=logits)

    def _on_inputs(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(array), device=self.input_device)

    def synchronize(self) -> None:
        for device in self.devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

    def upload(self, array: np.ndarray, role: str = "upload") -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(array), device=self.device)

    def request_hidden_states(self, layers: tuple[int, ...]) -> None:
        self._hidden_layers = self.checked_hidden_layers(layers)
        self._hidden = None

    def hidden_states(self, rows: list[int] | None = None) -> torch.Tensor | None:
        if self._hidden is None:
            return None
        if rows is None:
            return self._hidden
        return self._hidden[:, torch.as_tensor(np.asarray(rows, dtype=np.int64), device=self._hidden.device)]
