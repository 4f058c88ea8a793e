"""LongSpec (Yang et al. 2025; sail-sg/LongSpec @15e4998, ``longspec/test/llama_glide.py``): a one-layer drafter
for long contexts, drafting a beam tree.

The drafter (``heads.longspec_heads``) embeds each token with the target's embedding, self-attends over its own
cache within a window of 512 positions, cross-attends to the target's last-layer keys and values (every entry the
target has cached: the drafter's memory does not grow with the context beyond the window), and reads out through
the target's lm_head. The target's entries are recomputed from the hidden state entering its last layer
(``targets.layer_keys``), which the loop hands over for the positions each step settles.

A step (``tree_spec_generate``, llama_glide.py:900-1126):
- the tokens settled since the last step (the accepted drafts and the target's bonus token; at the first step the
  prompt and the first token) enter the drafter's cache; the last of them, the root, is read out;
- depth 1: the root's ``tree_shape[0]`` (4) most likely tokens;
- depth d >= 2: every (node of depth d - 1, token) pair is scored by the node's cumulative log-probability plus the
  token's log-probability under that node, and the ``tree_shape[d - 1]`` (16) best pairs over the whole depth
  become its nodes (a beam, not a per-parent top-k: :1063-1067); the last depth is not fed to the drafter;
- the tree, [4, 16, 16, 16, 16] = 68 drafted tokens, is verified in one target pass.

Tree nodes sit at position root + depth and self-attend to the drafter's cache within the window, to their
ancestors and to themselves; every query reads every target entry cached (the target has not seen the root yet).

Under sampling the tree is deterministic (``Draft.probs`` None) and specbench's sampling verifier for such
drafts keeps the output the target's distribution; LongSpec's ``verify_stochastic`` differs (docs/fidelity.md).
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, SharedWeights, StepOutcome
from specbench.drafters.base import HeadSource
from specbench.drafters.draft_model import plain
from specbench.errors import SpecbenchError
from specbench.heads.eagle_heads import HeadCache

TREE_SHAPE = (4, 16, 16, 16, 16)  # llama_glide.py:929 cand_num_per_step; inference_long-bench.py:76 --tree_shape


def checked_tree_shape(tree_shape) -> tuple[int, ...]:
    """``tree_shape`` as a tuple of positive ints, or a one-line error naming the value."""
    shape = plain(tree_shape)
    if (not isinstance(shape, (list, tuple)) or not shape
            or not all(isinstance(width, int) and not isinstance(width, bool) and width >= 1 for width in shape)):
        raise SpecbenchError(f"drafter.tree_shape must be a non-empty list of positive integers (nodes kept per "
                             f"depth; LongSpec's: {list(TREE_SHAPE)}), got {tree_shape!r}")
    return tuple(shape)


class SelfCache:
    """The drafter's own keys/values [1, kv_heads, length, head_dim] and their positions (a tree's entries share
    one position a depth), growing by doubling."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int, device, dtype):
        self.keys = torch.empty((1, kv_heads, capacity, head_dim), device=device, dtype=dtype)
        self.values = torch.empty_like(self.keys)
        self.positions = torch.empty(capacity, dtype=torch.long, device=device)
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.LongTensor) -> None:
        end = self.length + keys.shape[2]
        if end > self.keys.shape[2]:
            capacity = max(end, 2 * self.keys.shape[2])
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, :self.length] = old[:, :, :self.length]
                setattr(self, name, new)
            grown = self.positions.new_empty(capacity)
            grown[:self.length] = self.positions[:self.length]
            self.positions = grown
        self.keys[:, :, self.length:end] = keys
        self.values[:, :, self.length:end] = values
        self.positions[self.length:end] = positions
        self.length = end

    def truncate(self, length: int) -> None:
        self.length = length

    def held(self) -> tuple[torch.Tensor, torch.Tensor, torch.LongTensor]:
        return (self.keys[:, :, :self.length], self.values[:, :, :self.length], self.positions[:self.length])


class LongSpec(Drafter):
    """LongSpec's drafter and tree (see the module docstring).

    tree_shape:     nodes kept per depth, a global beam over (node, token) pairs (LongSpec: [4, 16, 16, 16, 16])
    head:           {hub_id, path, revision} of the drafter layer; empty: ``heads_by_model[model.name]``
    heads_by_model: model name -> {hub_id|path: ...} (a published drafter) or {trained: {...}} (one trained for the
                    target by the one trainer, kind longspec, built on first use if missing)
    cache_dir:      where trained drafters are cached (null: $SPECBENCH_CACHE or ~/.cache/specbench)
    """

    queues_device_work = True  # the layer runs on the target's device

    def __init__(self, name: str = "longspec", tree_shape=TREE_SHAPE, head: dict | None = None,
                 heads_by_model: dict | None = None, cache_dir: str | None = None):
        self.name = name
        self.tree_shape = checked_tree_shape(tree_shape)
        self.head_spec = plain(head) or {}
        self.heads_by_model = plain(heads_by_model) or {}
        self.cache_dir = cache_dir
        self.source = HeadSource(name, "longspec", "LongSpec drafter", self.head_spec, self.heads_by_model, cache_dir)
        self.head = None
        self.checkpoint: str | None = None
        self._sources: dict = {}

    # ---- loading ------------------------------------------------------------------------------------

    def artefacts(self, target) -> list:
        return list(self.source.cached(target).values())

    def prepare(self, target, sampling=None) -> None:
        from specbench.heads.longspec_heads import load_longspec_head

        self.head, self._sources["head"], self.checkpoint = self.source.load(
            target, lambda source, revision: load_longspec_head(target, source, revision))
        self.hidden_state_layers = (target.num_layers - 1,)  # the last layer's input: its cache entries
        self.device = target.device

    def sources(self) -> dict:
        return self._sources

    def shared_weights(self) -> SharedWeights | None:
        return None  # no other engine runs LongSpec's drafter

    def release_weights(self) -> None:
        self.head = None

    # ---- one question ---------------------------------------------------------------------------------

    def begin(self, prompt_ids: np.ndarray) -> None:
        if self.head is None:
            raise SpecbenchError(f"drafter={self.name}: prepare(target) must run before the first question")
        config, dtype = self.head.config, self.head.input_layernorm.weight.dtype
        capacity = 2 * prompt_ids.size + 256
        self.cache = SelfCache(config.num_key_value_heads, config.head_dim, capacity, self.device, dtype)
        self.target_cache = HeadCache(config, capacity, self.device, dtype)  # the target's entries, [kv, n, d]
        self._prompt = prompt_ids
        self._pending: np.ndarray | None = None  # tokens settled since the drafter last read them

    def release(self) -> None:
        self.cache = self.target_cache = None
        self._pending = None

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        """Add the target's last-layer entries of the positions this step settled (every prompt position at the
        prefill; the root and each accepted node after) and keep the settled tokens for the next draft."""
        states = outcome.hidden_states
        if states is None:
            raise SpecbenchError(f"drafter={self.name} reads the target's hidden states; the loop gave none")
        start = self.target_cache.length
        count = states.shape[1]
        positions = torch.arange(start, start + count, device=self.device)
        keys, values = self.head.target_entries(states[0], positions)
        self.target_cache.append(keys, values)
        settled = np.asarray(accepted_ids)
        pending = np.concatenate((self._prompt, settled)) if outcome.step == 0 else settled
        self._pending = pending if self._pending is None else np.concatenate((self._pending, pending))

    @torch.inference_mode()
    def propose(self, context_ids: np.ndarray) -> Draft:
        if self._pending is None or self._pending.size == 0:
            return Draft.empty()
        root_out = self._read(self._pending)
        self._pending = None
        stable = self.cache.length
        try:
            tokens, parents = self._beam_tree(root_out, stable)
        finally:
            self.cache.truncate(stable)  # the tree's entries are forgotten; the next step re-reads settled tokens
        return Draft(tokens.cpu(), parents=parents.cpu())

    def _read(self, tokens: np.ndarray) -> torch.Tensor:
        """Write ``tokens`` (the next positions) into the drafter's cache and return the layer's output [1, hidden]
        at the last of them. The others' outputs are never read, and a one-layer model's cache does not depend on
        them, so only the last row runs the whole layer."""
        head, cache = self.head, self.cache
        start = cache.length
        positions = torch.arange(start, start + tokens.size, device=self.device)
        ids = torch.from_numpy(np.ascontiguousarray(tokens)).to(self.device)
        embeddings = head.embed(ids)[None]
        cos, sin = head.rotary(positions[None])
        keys, values = head.self_entries(embeddings, cos, sin)
        cache.append(keys, values, positions)
        return self._layer(embeddings[:, -1:], positions[-1:], cos[:, -1:], sin[:, -1:], None)

    def _layer(self, embeddings, positions, cos, sin, tree_visible) -> torch.Tensor:
        """The layer at queries ``embeddings`` [1, n, hidden] whose own entries are in the cache already, each seeing
        the cache's settled entries within the window and, among the tree's entries (the cache's last m),
        ``tree_visible`` [n, m] (None: no tree; the last settled token, which sees every settled entry in the
        window)."""
        from specbench.heads.longspec_heads import WINDOW

        keys, values, held = self.cache.held()
        n = embeddings.shape[1]
        distance = positions[:, None] - held[None, :]
        visible = (distance >= 0) & (distance <= WINDOW)
        if tree_visible is not None:
            visible[:, -tree_visible.shape[1]:] = tree_visible
        length = self.target_cache.length
        target_keys = self.target_cache.keys[None, :, :length]
        target_values = self.target_cache.values[None, :, :length]
        every = torch.ones(1, n, length, dtype=torch.bool, device=self.device)
        return self.head(embeddings, cos, sin, keys, values, visible[None], target_keys, target_values, every)[0]

    def _log_probs(self, out: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head.logits(out).float(), dim=-1)

    def _beam_tree(self, root_out: torch.Tensor, stable: int) -> tuple[torch.Tensor, torch.Tensor]:
        """LongSpec's beam tree after the root (see the module docstring): tokens and parents (-1: the root), depth
        by depth, parents before children."""
        head, device = self.head, self.device
        root_position = stable - 1  # settled entries sit at positions 0.. in order (no read back from the device)
        root = self._log_probs(root_out)[0]
        scores, ids = root.topk(min(self.tree_shape[0], root.numel()))
        all_ids, all_parents = [ids], [torch.full_like(ids, -1)]
        # tree_visible among the tree's entries so far: row i = node i sees its ancestors and itself
        ancestry = torch.eye(ids.numel(), dtype=torch.bool, device=device)
        level_start, count = 0, ids.numel()
        for depth, width in enumerate(self.tree_shape[1:], start=1):
            level = torch.arange(level_start, count, device=device)
            positions = torch.full((level.numel(),), root_position + depth, dtype=torch.long, device=device)
            embeddings = head.embed(all_ids[-1])[None]
            cos, sin = head.rotary(positions[None])
            keys, values = head.self_entries(embeddings, cos, sin)
            self.cache.append(keys, values, positions)
            out = self._layer(embeddings, positions, cos, sin, ancestry[level])
            joint = self._log_probs(out) + scores[:, None]  # [level, vocab]: the path's log-probability
            vocab = joint.shape[1]
            scores, flat = joint.reshape(-1).topk(min(width, joint.numel()))
            parents, ids = level[flat // vocab], flat % vocab
            all_ids.append(ids)
            all_parents.append(parents)
            grown = torch.zeros(count + ids.numel(), count + ids.numel(), dtype=torch.bool, device=device)
            grown[:count, :count] = ancestry
            grown[count:, :count] = ancestry[parents]
            grown[count:, count:] = torch.eye(ids.numel(), dtype=torch.bool, device=device)
            ancestry = grown
            level_start, count = count, count + ids.numel()
        return torch.cat(all_ids), torch.cat(all_parents)
