"""Medusa-1 (Cai et al. 2024; FasterDecoding/Medusa), as Spec-Bench's leaderboard ran it.

K heads read the target's final, post-norm hidden state at the position that produced the last committed token (the
token the target itself chose there, which is Medusa's tree root) and each names candidates for one later
position: head k's top tokens for the position k + 1 after the root. The draft is a fixed tree of sibling ranks
(``mc_sim_7b_63``: 63 nodes, 4 deep); the node at rank path (r1, ..., rd) is head d-1's rd-th best token, whatever
its ancestors are (the heads do not see the path). Nothing is carried from step to step but that one state.

The draft is deterministic (``Draft.probs`` None) at every temperature, so specbench's lossless tree verifier
decides what is kept: greedy at T = 0, exactly as Medusa's own greedy acceptance; at T > 0 Medusa's typical
acceptance (posterior_threshold, posterior_alpha) would change the output distribution and is not run under this
name (docs/fidelity.md).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, SharedWeights, StepOutcome
from specbench.decoding.tree import TreeTemplate
from specbench.drafters.base import HeadSource, require_choice, require_positive
from specbench.drafters.draft_model import plain
from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)

# Medusa's sparse tree for Vicuna-7B as paths of sibling ranks, in the source's order (Spec-Bench
# model/medusa/medusa_choices.py:1 @fd2c1cd; the same list in FasterDecoding/Medusa medusa/model/medusa_choices.py:1).
CHOICE_TREES: dict[str, list[tuple[int, ...]]] = {
    "mc_sim_7b_63": [
        (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
        (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,),
        (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0),
        (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0),
        (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1),
        (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
    ],
}
# Candidates per head: Medusa takes each head's top 10 (Spec-Bench model/medusa/utils.py:3, TOPK=10) and the tree
# picks among them; a tree naming a rank >= 10 could not run there.
TOP_K = 10


class ChoiceTree:
    """A choice tree in Medusa's node order (by depth, then path: ``generate_medusa_buffers``' sort), with each
    node's head (its depth - 1) and rank, so that a draft is one gather from the heads' top tokens.

    Example: paths [(0,), (1,), (0, 0)]: nodes (0,), (1,), (0, 0) with parents [-1, -1, 0], heads [0, 0, 1],
    ranks [0, 1, 0]: head 0's best and second best tokens, and head 1's best under the first."""

    def __init__(self, paths: list[tuple[int, ...]]):
        ordered = sorted(paths, key=lambda path: (len(path), path))
        if max(max(path) for path in ordered) >= TOP_K:
            raise SpecbenchError(f"a Medusa choice tree ranks up to {TOP_K} candidates per head (TOPK); this one "
                                 f"names rank {max(max(path) for path in ordered)}")
        self.template = TreeTemplate(ordered)
        self.paths = ordered
        self.heads = np.array([len(path) - 1 for path in ordered], dtype=np.int64)
        self.ranks = self.template.ranks
        self.depth = len(self.template.levels)
        self.width = self.template.width  # the most siblings: the top-k a draft needs

    def __len__(self) -> int:
        return len(self.template)


class Medusa(Drafter):
    """Medusa-1's drafter (see the module docstring).

    tree:           the choice tree's name (mc_sim_7b_63)
    heads:          Medusa heads read, the first ones of the checkpoint (Spec-Bench: 4 of the published 5)
    head:           {hub_id, path, revision} of the heads; empty: ``heads_by_model[model.name]``
    heads_by_model: model name -> {hub_id|path: ...} (published heads) or {trained: {...}} (heads trained for the
                    target, built on first use if missing)
    cache_dir:      where trained heads are cached (null: $SPECBENCH_CACHE or ~/.cache/specbench)
    """

    queues_device_work = True  # the heads run on the target's device
    kind = "medusa"  # the trained head's kind (specbench.training.medusa)

    def __init__(self, name: str = "medusa", tree: str = "mc_sim_7b_63", heads: int = 4, head: dict | None = None,
                 heads_by_model: dict | None = None, cache_dir: str | None = None):
        require_choice("tree", tree, tuple(CHOICE_TREES))
        require_positive(heads=heads)
        self.tree = ChoiceTree(CHOICE_TREES[tree])
        if self.tree.depth > heads:
            raise SpecbenchError(f"drafter.tree={tree} is {self.tree.depth} deep and needs {self.tree.depth} heads; "
                                 f"drafter.heads={heads} reads fewer (choose drafter.heads >= {self.tree.depth})")
        self.name = name
        self.tree_name = tree
        self.num_heads = heads
        self.head_spec = plain(head) or {}
        self.heads_by_model = plain(heads_by_model) or {}
        self.cache_dir = cache_dir
        self.source = HeadSource(name, self.kind, "Medusa heads", self.head_spec, self.heads_by_model, cache_dir)
        self.head = None
        self.head_checkpoint: str | None = None
        self._sources: dict = {}

    # ---- loading ------------------------------------------------------------------------------------

    def artefacts(self, target) -> list:
        self._check_trained(target)
        return list(self.source.cached(target).values())

    def _check_trained(self, target) -> None:
        """Heads trained for ``target`` that would be fewer than the drafter reads are refused before they are
        built (built first, they would be refused after the training, by a hint rebuilding the same heads)."""
        recipe = self.source.trained_recipe(target)
        if recipe is not None and recipe.method["heads"] < self.num_heads:
            raise SpecbenchError(f"drafter={self.name} reads {self.num_heads} Medusa heads (drafter.heads); its "
                                 f"entry heads_by_model.{target.name} trains {recipe.method['heads']} (trained.heads): "
                                 f"train at least {self.num_heads}, or read fewer with drafter.heads (the tree "
                                 f"{self.tree_name} needs {self.tree.depth})")

    def prepare(self, target, sampling=None) -> None:
        from specbench.heads.medusa_heads import load_medusa_heads

        self._check_trained(target)
        heads, self._sources["head"], self.head_checkpoint = self.source.load(
            target, lambda source, revision: load_medusa_heads(target, source, revision=revision,
                                                               num_heads=self.num_heads))
        if "trained" in self._sources["head"]:  # a published checkpoint is cut to num_heads by its loader
            if heads.config.num_heads < self.num_heads:
                raise SpecbenchError(f"drafter={self.name} reads {self.num_heads} Medusa heads; the trained ones in "
                                     f"{self.head_checkpoint} are {heads.config.num_heads}")
            heads = heads.truncated(self.num_heads)
        self._sources["head"]["heads"] = self.num_heads
        self._install(heads, target.num_layers, target.device)

    def _install(self, heads, num_layers: int, device) -> None:
        """Draft with ``heads`` on ``device`` from the final state of a target of ``num_layers`` layers."""
        self.head = heads
        self.draft_tree = self.tree
        vocab = heads.config.vocab_size
        if self.tree.width > vocab:  # a toy vocabulary (the tests'): ranks past it name no token
            self.draft_tree = ChoiceTree([path for path in self.tree.paths if max(path) < vocab])
            log.info("drafter=%s: a vocabulary of %d tokens keeps %d of %s's %d nodes", self.name, vocab,
                     len(self.draft_tree), self.tree_name, len(self.tree))
        self.hidden_state_layers = (num_layers,)  # the final, post-norm state (Medusa's hidden_states)
        self.device = device
        self._heads_index = torch.from_numpy(self.draft_tree.heads).to(device)
        self._ranks_index = torch.from_numpy(self.draft_tree.ranks).to(device)
        self._parents = torch.from_numpy(self.draft_tree.template.parents)

    def sources(self) -> dict:
        return self._sources

    def shared_weights(self) -> SharedWeights | None:
        """The head's directory (or hub id), where another engine reads the same head."""
        return None if self.head_checkpoint is None else SharedWeights("head", self.head_checkpoint)

    def release_weights(self) -> None:
        self.head = None

    # ---- one question ---------------------------------------------------------------------------------

    def begin(self, prompt_ids: np.ndarray) -> None:
        if self.head is None:
            raise SpecbenchError(f"drafter={self.name}: prepare(target) must run before the first question")
        self._state: torch.Tensor | None = None  # [H] the target's state that produced the last committed token

    def release(self) -> None:
        self._state = None

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        """Keep the target's state at the position that produced the last committed token: the last prompt position
        after the prefill, else the last of the settled positions (the root and the accepted nodes), whose token is
        the one the target chose there (Medusa's ``update_inference_inputs`` keeps the same one)."""
        states = outcome.hidden_states
        if states is None:
            raise SpecbenchError(f"drafter={self.name} reads the target's hidden states; the loop gave none")
        if outcome.step == 0:
            self._state = states[0, -1]
        else:  # an EOS cut the tokens short: the decode ends here, and the state is never read
            self._state = states[0, min(len(accepted_ids), states.shape[1]) - 1]

    @torch.inference_mode()
    def propose(self, context_ids: np.ndarray) -> Draft:
        if self._state is None:
            return Draft.empty()
        logits = self.head(self._state.to(self.device))  # [K, vocab]
        top_ids = logits.topk(self.draft_tree.width, dim=-1).indices  # [K, width], best first
        tokens = top_ids[self._heads_index, self._ranks_index]
        return Draft(tokens.cpu(), parents=self._parents)
