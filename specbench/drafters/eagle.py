"""EAGLE, EAGLE-2 and EAGLE-3 (Li et al. 2024, 2024, 2025; SafeAILab/EAGLE), as Spec-Bench's leaderboard ran them.

A small trained *head* drafts from the target's own features: for every committed token it reads the target's
hidden state at the position before it (EAGLE: the last layer's, after the final norm; EAGLE-3: three layers
fused, low, middle and high) paired with the token itself, and predicts the next token; fed its own output it
drafts further. The head keeps a KV cache of its own over the positions the target has settled ("stable"); a
step's tree expansion is appended to it and forgotten afterwards, as the authors' ``stable_kv`` does.

Trees (docs/fidelity.md has every line):
- static (EAGLE-1): a fixed tree of sibling ranks, ``mc_sim_7b_63`` (25 nodes despite its name), each node the
  ``rank``-th best token of its parent's draft distribution; only nodes with children are fed to the head, one
  pass per depth.
- dynamic (EAGLE-2, EAGLE-3): from the root, take the head's ``top_k`` tokens; for ``depth`` passes expand the
  ``top_k`` frontier nodes of highest joint log-probability (the sum along their path), recording all their
  ``top_k`` children as candidates; then keep the ``total_tokens - 1`` candidates of highest joint
  log-probability (the root is the 60th token), in candidate order so parents precede children.

The draft is deterministic (``Draft.probs`` None) at every temperature, as EAGLE-2's and EAGLE-3's own
verification treats it (a draft token is accepted with the target's probability, rejected siblings zeroed):
that is specbench's sampling verifier for deterministic drafts. EAGLE-1's original samples its top-k at T > 0;
the difference is named in docs/fidelity.md.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, SharedWeights, StepOutcome
from specbench.decoding.tree import TreeTemplate
from specbench.drafters.base import HeadSource, require_choice, require_non_negative, require_positive
from specbench.drafters.draft_model import plain
from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)

# EAGLE-1's static trees as paths of sibling ranks (Spec-Bench model/eagle/choices.py:1-3 @fd2c1cd).
STATIC_TREES: dict[str, list[tuple[int, ...]]] = {
    "mc_sim_7b_63": [
        (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
    ],
}
TREES = ("static", "dynamic")
HEAD_KINDS = ("eagle", "eagle3")


class StaticTreePlan:
    """What a static tree needs per step, computed once: the nodes in EAGLE's order (by depth, then path), and
    per depth the nodes that have children (the only ones fed to the head), each with the row of its parent's
    output among the previous depth's, and the block of the head's attention mask among the tree's entries.

    Example: paths [(0,), (1,), (0, 0)]: nodes 0, 1, 2 with parents [-1, -1, 0]; depth 1 feeds node 0 alone
    (node 1 has no child), and node 2 is the best child of node 0's output.
    """

    def __init__(self, paths: list[tuple[int, ...]]):
        ordered = sorted(paths, key=lambda path: (len(path), path))  # generate_tree_buffers' order
        self.template = TreeTemplate(ordered)
        parents = self.template.parents
        has_children = np.zeros(len(ordered), dtype=bool)
        has_children[parents[parents >= 0]] = True
        self.fed: list[np.ndarray] = []  # per depth d = 1..: nodes of depth d with children, in node order
        self.parent_rows: list[np.ndarray] = []  # per fed depth: the row of each fed node's parent's output
        self.masks: list[np.ndarray] = []  # per fed depth: [fed, tree entries so far + fed] bool (ancestors, self)
        slot = {}  # node -> its entry in the head's cache, counted from the first tree entry
        for level in self.template.levels:
            fed = level[has_children[level]]
            if fed.size == 0:
                break
            previous = self.fed[-1] if self.fed else np.empty(0, dtype=np.int64)
            rows = [0 if parents[node] < 0 else int(np.flatnonzero(previous == parents[node])[0]) for node in fed]
            before = len(slot)
            mask = np.zeros((fed.size, before + fed.size), dtype=bool)
            for row, node in enumerate(fed):
                ancestor = parents[node]
                while ancestor >= 0:
                    mask[row, slot[ancestor]] = True
                    ancestor = parents[ancestor]
                mask[row, before + row] = True
            for row, node in enumerate(fed):
                slot[int(node)] = before + row
            self.fed.append(fed)
            self.parent_rows.append(np.array(rows, dtype=np.int64))
            self.masks.append(mask)
        self.width = self.template.width  # the most children one node has: the top-k needed

    def __len__(self) -> int:
        return len(self.template)

    def on(self, device) -> dict:
        """The index tensors a draft uses, on ``device`` once rather than every step."""
        template = self.template

        def put(array):
            return torch.from_numpy(np.ascontiguousarray(array)).to(device)

        levels = template.levels
        return {
            "first": put(levels[0]), "first_ranks": put(template.ranks[levels[0]]),
            "fed": [put(fed) for fed in self.fed], "rows": [put(rows) for rows in self.parent_rows],
            "masks": [put(mask) for mask in self.masks],
            # per fed depth: the next level's nodes, the row of each one's parent among the fed, its rank
            "children": [put(levels[depth]) for depth in range(1, len(self.fed) + 1)],
            "child_rows": [put(np.searchsorted(fed, template.parents[levels[depth]]))  # fed is ascending
                           for depth, fed in enumerate(self.fed, start=1)],
            "child_ranks": [put(template.ranks[levels[depth]]) for depth in range(1, len(self.fed) + 1)],
            "parents": torch.from_numpy(template.parents),
        }


def select_dynamic_tree(scores: torch.Tensor, parents: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's re-ranking: the ``count`` candidates of highest joint log-probability, in candidate order, and
    their parents renumbered among them (-1: a child of the root).

    ``scores`` [c] joint log-probabilities, ``parents`` [c] each candidate's parent candidate (-1: the root);
    parents precede children. A child's score is at most its parent's, and the stable sort puts the parent first
    when they tie, so the kept set holds every kept node's parent (EAGLE's ``torch.topk`` leaves ties unordered).

    Example: scores [-0.1, -2.0, -0.5, -3.0], parents [-1, -1, 0, 2], count 2: kept candidates [0, 2], parents
    [-1, 0].
    """
    order = torch.sort(scores, descending=True, stable=True).indices[:count]
    kept = torch.sort(order).values
    position = torch.full_like(parents, -1)
    position[kept] = torch.arange(kept.numel(), device=kept.device)
    kept_parents = parents[kept]
    renumbered = torch.where(kept_parents < 0, kept_parents, position[kept_parents.clamp(min=0)])
    return kept, renumbered


class Eagle(Drafter):
    """The EAGLE family's drafter (see the module docstring).

    kind:          the head it drafts with: eagle (EAGLE-1's head, also EAGLE-2's) or eagle3
    tree:          static (EAGLE-1) or dynamic (EAGLE-2, EAGLE-3)
    static_tree:   the static tree's name (mc_sim_7b_63)
    total_tokens:  dynamic tree: tokens verified per step, the root included (Spec-Bench: 60)
    depth:         dynamic tree: expansion passes after the root's (Spec-Bench: 5; paths reach depth + 1)
    top_k:         dynamic tree: children per expanded node and frontier width (Spec-Bench: 10)
    head:          {hub_id, path, revision} of the head; empty: ``heads_by_model[model.name]``
    heads_by_model: model name -> {hub_id|path: ...} (a published head) or {trained: {...}} (a head trained for
                   the target by scripts/train_head.py, built on first use if missing)
    feature_layers: the target layers an EAGLE-3 head reads (null: the checkpoint's, else EAGLE-3's 2, N/2, N-3)
    cache_dir:     where trained heads are cached (null: $SPECBENCH_CACHE or ~/.cache/specbench)
    """

    queues_device_work = True  # the head runs on the target's device

    def __init__(self, name: str = "eagle", kind: str = "eagle", tree: str = "static",
                 static_tree: str = "mc_sim_7b_63", total_tokens: int = 60, depth: int = 5, top_k: int = 10,
                 head: dict | None = None, heads_by_model: dict | None = None, feature_layers=None,
                 cache_dir: str | None = None):
        require_choice("kind", kind, HEAD_KINDS)
        require_choice("tree", tree, TREES)
        require_choice("static_tree", static_tree, tuple(STATIC_TREES))
        require_positive(total_tokens=total_tokens, depth=depth, top_k=top_k)
        if feature_layers is not None:
            layers = plain(feature_layers)
            if not isinstance(layers, (list, tuple)) or not layers:
                raise SpecbenchError(f"drafter.feature_layers must be null or a non-empty list of target layer "
                                     f"numbers, got {layers!r}")
            for layer in layers:  # int() would take 2.7 as layer 2, "3" as 3, and fail on inf in a traceback
                require_non_negative(feature_layers=layer)
        if tree == "dynamic":
            candidates = top_k + depth * top_k * top_k
            if not 2 <= total_tokens <= candidates + 1:
                raise SpecbenchError(f"drafter.total_tokens={total_tokens} must be between 2 and {candidates + 1} "
                                     f"(the root and the {candidates} candidates of top_k={top_k}, depth={depth})")
        self.name = name
        self.kind = kind
        self.tree = tree
        self.static_tree_name = static_tree
        self.static = StaticTreePlan(STATIC_TREES[static_tree]) if tree == "static" else None
        self.total_tokens = total_tokens
        self.depth = depth
        self.top_k = top_k
        self.head_spec = plain(head) or {}
        self.heads_by_model = plain(heads_by_model) or {}
        self.feature_layers = None if feature_layers is None else tuple(int(layer) for layer in plain(feature_layers))
        self.cache_dir = cache_dir
        self.source = HeadSource(name, kind, f"{kind} head", self.head_spec, self.heads_by_model, cache_dir)
        self.head = None
        self.head_checkpoint: str | None = None  # the head's directory or hub id, once prepared
        self._sources: dict = {}

    # ---- loading ------------------------------------------------------------------------------------

    def artefacts(self, target) -> list:
        return list(self.source.cached(target).values())

    def prepare(self, target, sampling=None) -> None:
        from specbench.heads.eagle_head_files import load_eagle_head

        self.head, self._sources["head"], self.head_checkpoint = self.source.load(
            target, lambda source, revision: load_eagle_head(target, source, self.kind, revision=revision,
                                                             feature_layers=self.feature_layers))
        if self.head.config.kind != self.kind:
            raise SpecbenchError(f"drafter={self.name} drafts with an {self.kind} head; the head it got is an "
                                 f"{self.head.config.kind} head")
        layers = self.feature_layers or self.head.resolve_feature_layers(target.num_layers)
        self.hidden_state_layers = tuple(int(layer) for layer in layers)
        self._sources["head"]["feature_layers"] = list(self.hidden_state_layers)
        self.device = target.device
        if self.static is not None:
            self._static = self.static.on(self.device)

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
        self._prompt = prompt_ids
        self._pending_tokens: np.ndarray | None = None  # the tokens settled since the head last read the target
        self._pending_features: torch.Tensor | None = None  # the target's features at the positions before them

    def release(self) -> None:
        self.cache = None  # the head's KV cache and the features it holds belong to the decode that ended
        self._pending_features = None
        self._pending_tokens = None

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        """Keep the new (feature, token) pairs: the target's features at the positions that settled this step's
        tokens (the root and each accepted node; every prompt position in the prefill), each paired with the token
        that follows it (EAGLE's ``input_ids[:, 1:]``)."""
        states = outcome.hidden_states
        if states is None:
            raise SpecbenchError(f"drafter={self.name} reads the target's hidden states; the loop gave none")
        if outcome.step == 0:
            tokens = np.concatenate((self._prompt[1:], accepted_ids))
        else:
            tokens = np.asarray(accepted_ids)
        count = min(tokens.size, states.shape[1])  # an EOS cut the tokens short: the decode ends here
        # [layers, n, hidden] -> [n, layers * hidden]: EAGLE-3 concatenates low, middle, high.
        self._pending_features = states[:, :count].permute(1, 0, 2).reshape(count, -1)
        self._pending_tokens = tokens[:count]

    @torch.inference_mode()
    def propose(self, context_ids: np.ndarray) -> Draft:
        if self._pending_tokens is None or self._pending_tokens.size == 0:
            return Draft.empty()
        head, cache = self.head, self.cache
        start = cache.length
        count = self._pending_tokens.size
        out = head(torch.from_numpy(np.ascontiguousarray(self._pending_tokens)).to(self.device),
                   self._pending_features, torch.arange(start, start + count, device=self.device), cache, None,
                   from_target=True)
        self._pending_tokens = None
        stable = cache.length
        try:
            if self.static is not None:
                tokens, parents = self._static_draft(out[-1:], stable)
            else:
                tokens, parents = self._dynamic_draft(out[-1:], stable)
        finally:
            cache.truncate(stable)  # the tree's entries are forgotten; the next step re-reads the target's
        return Draft(tokens.cpu(), parents=parents.cpu())

    def _feed(self, tokens: torch.Tensor, hidden: torch.Tensor, position: int, stable: int,
              tree_mask: torch.Tensor) -> torch.Tensor:
        """One expansion pass: ``tokens`` [n] fed with their parents' outputs ``hidden`` [n, h], all at
        ``position``, each seeing the stable entries and ``tree_mask``'s among the tree's."""
        count = tokens.numel()
        visible = torch.cat((torch.ones(count, stable, dtype=torch.bool, device=self.device), tree_mask), dim=1)
        positions = torch.full((count,), position, dtype=torch.long, device=self.device)
        return self.head(tokens, hidden, positions, self.cache, visible, from_target=False)

    def _top(self, out: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's k best next tokens after each row of ``out``: their log-probabilities and target ids."""
        log_probs = torch.log_softmax(self.head.draft_logits(out).float(), dim=-1)
        values, draft_ids = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)
        return values, self.head.to_target_ids(draft_ids)

    def _static_draft(self, root_out: torch.Tensor, stable: int) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self._static
        tokens = torch.empty(len(self.static), dtype=torch.long, device=self.device)
        _, top_ids = self._top(root_out, self.static.width)  # greedy EAGLE-1 ranks by the raw logits: the same order
        tokens[plan["first"]] = top_ids[0, plan["first_ranks"]]
        previous_out = root_out
        for depth in range(len(plan["fed"])):
            out = self._feed(tokens[plan["fed"][depth]], previous_out[plan["rows"][depth]], stable + depth, stable,
                             plan["masks"][depth])
            _, top_ids = self._top(out, self.static.width)
            tokens[plan["children"][depth]] = top_ids[plan["child_rows"][depth], plan["child_ranks"][depth]]
            previous_out = out
        return tokens, plan["parents"]

    def _dynamic_draft(self, root_out: torch.Tensor, stable: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, device = self.top_k, self.device
        scores, ids = self._top(root_out, k)
        scores, ids = scores[0], ids[0]
        width = scores.numel()  # k, or less for a draft vocabulary smaller than k
        all_scores, all_ids = [scores], [ids]
        all_parents = [torch.full((width,), -1, dtype=torch.long, device=device)]
        frontier = torch.arange(width, device=device)  # candidate index of each frontier node
        frontier_ids, frontier_scores = ids, scores
        frontier_hidden = root_out.expand(width, -1)
        tree_mask = torch.eye(width, dtype=torch.bool, device=device)
        count = width
        for level in range(self.depth):
            out = self._feed(frontier_ids, frontier_hidden, stable + level, stable, tree_mask)
            child_scores, child_ids = self._top(out, k)
            joint = (child_scores + frontier_scores[:, None]).reshape(-1)  # sum of log-probabilities on the path
            all_scores.append(joint)
            all_ids.append(child_ids.reshape(-1))
            all_parents.append(frontier.repeat_interleave(child_scores.shape[1]))
            if level + 1 < self.depth:  # the last level's children are candidates only, never expanded
                best = torch.sort(joint, descending=True, stable=True).indices[:k]
                rows = best // child_scores.shape[1]
                frontier = count + best
                frontier_ids, frontier_scores = child_ids.reshape(-1)[best], joint[best]
                frontier_hidden = out[rows]
                tree_mask = torch.cat((tree_mask[rows], torch.eye(best.numel(), dtype=torch.bool, device=device)), 1)
            count += joint.numel()
        kept, parents = select_dynamic_tree(torch.cat(all_scores), torch.cat(all_parents), self.total_tokens - 1)
        return torch.cat(all_ids)[kept], parents

