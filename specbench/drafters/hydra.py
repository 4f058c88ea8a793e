"""Hydra (Ankner et al. 2024; zankner/Hydra @3f39fbd), as Spec-Bench's leaderboard ran it (evaluation/inference_hydra.py,
model/hydra/ @fd2c1cd): sequentially dependent draft heads on the target's last hidden state.

The head (``specbench.heads.hydra_heads``: Hydra++, prefix-mlp) keeps a prefix layer, one decoder layer with a KV
cache over the committed positions, fed the target's post-norm hidden states as they settle. A step's draft is the
static tree ``mc_sim_7b_63`` (63 nodes, 4 deep; Spec-Bench model/hydra/hydra_choices.py:1) of sibling ranks: a node
``(r_1, .., r_d)`` is the ``r_d``-th best token of head d - 1 fed the prefix output at the last committed position,
the root (the last committed token) and the tokens of the path above it; each depth is one batched pass of one head
over the nodes of the depth above that have children (Hydra's ``_grounded_proposal``, which fetches per parent the
top ``num_children`` tokens and feeds the first ``children_to_expand`` on: the same tokens, since in this tree every
parent's children are its best ranks and its expanded children its best ones; tests/test_hydra_drafter.py checks).

The draft is deterministic (``Draft.probs`` None): at T = 0 the target's greedy check, which Hydra's
``evaluate_posterior`` does too; at T > 0 specbench's lossless tree verifier. Hydra's own T > 0 path is typical
acceptance (posterior_threshold 0.09, posterior_alpha 0.3) with the root always the target's argmax, which does not
sample the target's distribution; it is lossy, so it is documented (docs/fidelity.md) and not run under this name.
"""

from __future__ import annotations


import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, SharedWeights, StepOutcome
from specbench.drafters.base import HeadSource, require_choice
from specbench.drafters.draft_model import plain
from specbench.drafters.eagle import StaticTreePlan
from specbench.drafters.medusa import CHOICE_TREES
from specbench.errors import SpecbenchError

KIND = "hydra"
# Hydra's trees as paths of sibling ranks (Spec-Bench model/hydra/hydra_choices.py:1 @fd2c1cd, the list
# inference_hydra.py's --hydra-choices default names): the same 63 paths as Medusa's tree of that name
# (model/medusa/medusa_choices.py:1); tests/test_hydra_drafter.py re-states them.
TREES: dict[str, list[tuple[int, ...]]] = {"mc_sim_7b_63": CHOICE_TREES["mc_sim_7b_63"]}


class Hydra(Drafter):
    """Hydra's drafter (see the module docstring).

    tree:           the static tree's name (mc_sim_7b_63)
    head:           {hub_id, path, revision} of the head; empty: ``heads_by_model[model.name]``
    heads_by_model: model name -> {hub_id|path: ...} (a published head) or {trained: {...}} (a head trained for
                    the target, built on first use if missing)
    cache_dir:      where trained heads are cached (null: $SPECBENCH_CACHE or ~/.cache/specbench)
    """

    queues_device_work = True  # the head runs on the target's device

    def __init__(self, name: str = "hydra", tree: str = "mc_sim_7b_63", head: dict | None = None,
                 heads_by_model: dict | None = None, cache_dir: str | None = None):
        require_choice("tree", tree, tuple(TREES))
        self.name = name
        self.tree_name = tree
        self.plan = StaticTreePlan(list(TREES[tree]))
        self.depth = max(len(path) for path in TREES[tree])
        self.head_spec = plain(head) or {}
        self.heads_by_model = plain(heads_by_model) or {}
        self.cache_dir = cache_dir
        self.source = HeadSource(name, KIND, "Hydra head", self.head_spec, self.heads_by_model, cache_dir)
        self.head = None
        self.head_checkpoint: str | None = None
        self._sources: dict = {}

    # ---- loading ------------------------------------------------------------------------------------

    def artefacts(self, target) -> list:
        self._check_trained(target)
        return list(self.source.cached(target).values())

    def _check_trained(self, target) -> None:
        """A head trained for ``target`` with fewer heads than the tree is deep is refused before it is built."""
        recipe = self.source.trained_recipe(target)
        if recipe is not None and recipe.method["num_heads"] < self.depth:
            raise SpecbenchError(f"drafter={self.name}: tree {self.tree_name} is {self.depth} deep, but its entry "
                                 f"heads_by_model.{target.name} trains {recipe.method['num_heads']} heads "
                                 f"(trained.num_heads, one per depth); train at least {self.depth}")

    def prepare(self, target, sampling=None) -> None:
        from specbench.heads.hydra_heads import load_hydra_head

        self._check_trained(target)
        self.head, self._sources["head"], self.head_checkpoint = self.source.load(
            target, lambda source, revision: load_hydra_head(target, source, revision=revision))
        heads = self.head.config.num_heads
        if heads < self.depth:
            raise SpecbenchError(f"drafter={self.name}: tree {self.tree_name} is {self.depth} deep, but the head has "
                                 f"{heads} heads (one per depth); use a head of at least {self.depth}")
        # A node of rank r needs r + 1 tokens to choose from: a vocabulary smaller than the tree is wide (a test
        # model's) drafts the paths it can name; the paths kept are closed under prefixes, so still a tree.
        paths = [path for path in TREES[self.tree_name] if max(path) < self.head.config.vocab_size]
        self.plan = StaticTreePlan(paths)
        self.hidden_state_layers = (self.head.feature_layer(target.num_layers),)
        self._sources["head"]["feature_layers"] = list(self.hidden_state_layers)
        self.device = target.device
        self._plan = self.plan.on(self.device)

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
        self.cache = self.head.new_cache(2 * prompt_ids.size + 64)
        self._pending: torch.Tensor | None = None  # the target's states at the positions settled since last read

    def release(self) -> None:
        self.cache = None  # the prefix layer's KV cache belongs to the decode that ended
        self._pending = None

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        """Keep the target's states at the positions that settled this step (every prompt position in the prefill;
        then the root and each accepted node), for the prefix layer: Hydra feeds it exactly these, the accepted
        path's states, at the next proposal."""
        states = outcome.hidden_states
        if states is None:
            raise SpecbenchError(f"drafter={self.name} reads the target's hidden states; the loop gave none")
        self._pending = states[0]  # [n, hidden]: one layer

    @torch.inference_mode()
    def propose(self, context_ids: np.ndarray) -> Draft:
        if self._pending is None or self._pending.shape[0] == 0:
            return Draft.empty()
        head, cache, plan = self.head, self.cache, self._plan
        start = cache.length
        count = self._pending.shape[0]
        prefix = head.prefix_states(self._pending, torch.arange(start, start + count, device=self.device), cache)
        self._pending = None
        root = torch.tensor([int(context_ids[-1])], device=self.device)
        # inputs of head d: one row per fed node of depth d (the root's for d = 0), cat(prefix, embed(root), ...)
        inputs = torch.cat((prefix[-1:], head.embed(root)), dim=-1)
        tokens = torch.empty(len(self.plan), dtype=torch.long, device=self.device)
        top = head.head_logits(0, inputs).topk(self.plan.width, dim=-1).indices
        tokens[plan["first"]] = top[0, plan["first_ranks"]]
        for depth in range(len(plan["fed"])):
            fed = plan["fed"][depth]
            inputs = torch.cat((inputs[plan["rows"][depth]], head.embed(tokens[fed])), dim=-1)
            top = head.head_logits(depth + 1, inputs).topk(self.plan.width, dim=-1).indices
            tokens[plan["children"][depth]] = top[plan["child_rows"][depth], plan["child_ranks"][depth]]
        return Draft(tokens.cpu(), parents=plan["parents"])
