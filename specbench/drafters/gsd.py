"""Graph-Structured Speculative Decoding (Gong et al., Findings of ACL 2024; gzhch/gsd): a draft model's hypotheses
grown as a tree, merged where they repeat into a graph, and unfolded back into a tree for the target to verify.
docs/fidelity.md traces every setting to the original's file and line (``utils/graph_decoding.py``'s
``graph_speculative_generation_dev``, which gsd.py runs).

Per step, from the last committed token (the root), for up to ``max_step_draft`` draft passes: every node added by the
previous pass is fed to the draft model at once (each seeing the committed text and its own ancestors), and each
offers its ``tree_decoding`` most likely next tokens (plain softmax), of which those at least ``sibling_threshold``
times the likeliest are kept. A kept token that repeats a node elsewhere in the graph (the same token after the same
``repeat_threshold`` tokens, off its own path; -1: never) is not added: its parent points at that node instead (its
one "pseudo child", the last such merge winning), so that node's subtree is reused. A node less likely than
``prob_threshold`` under its parent, or under a leaf, is a leaf; drafting stops after a pass that adds only leaves or
nothing, or at ``max_nodes`` nodes. The graph is unfolded breadth-first from the root (children in the order they
were made, then the pseudo child) until ``max_tree_tokens`` nodes, a node reached twice appearing twice.

The target verifies the tree in one pass (greedy: the longest path of its own choices, which GSD's exact-match walk
finds). Under sampling the tree is verified by specbench's lossless tree sampler with one-hot nodes; the original's
sampled mode (a depth-first search accepting with min(1, p/q), no residual) does not keep the target's distribution,
and its grid runs greedy only.

The draft model is the one ``sps`` uses for the target's family (``drafts_by_family``), with its own KV cache: the
accepted path's nodes keep their entries when they were fed along real (unmerged) edges; the rest is fed again with
the next step's root, as the original rebuilds its draft cache along a merged path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from specbench.decoding.contract import Draft, StepOutcome
from specbench.drafters.base import require_non_negative, require_number, require_positive
from specbench.drafters.draft_model import DraftModel
from specbench.errors import SpecbenchError
from specbench.targets.kv_cache import TreeKVCache
from specbench.targets.transformers import forward_with_cache


@dataclass
class GraphNode:
    token: int
    parent: int  # -1 for the root
    depth: int
    leaf: bool
    children: list[int] = field(default_factory=list)
    pseudo_child: int | None = None
    slot: int | None = None  # where its keys and values are in the draft's cache (from the round's start): fed


class TokenGraph:
    """The draft's graph of one step (graph_decoding.py TokenGraph): node 0 the root."""

    def __init__(self, root_token: int):
        self.nodes = [GraphNode(root_token, -1, 0, False, slot=-1)]

    def path(self, index: int) -> set[int]:
        """``index`` and its ancestors."""
        path = set()
        while index != -1:
            path.add(index)
            index = self.nodes[index].parent
        return path

    def repeated(self, token: int, parent: int, repeat_threshold: int) -> int | None:
        """The first node, off the path to ``parent``, holding ``token`` after the same ``repeat_threshold`` tokens as
        a child of ``parent`` would (graph_decoding.py check_repetition); None: no such node, or merging is off (-1)."""
        if repeat_threshold < 0:
            return None
        own_path = self.path(parent)
        for index, node in enumerate(self.nodes):
            if index in own_path or node.token != token:
                continue
            mine, theirs = parent, node.parent
            for _ in range(repeat_threshold):
                if mine == -1 or theirs == -1 or self.nodes[mine].token != self.nodes[theirs].token:
                    break
                mine, theirs = self.nodes[mine].parent, self.nodes[theirs].parent
            else:
                return index
        return None

    def add(self, token: int, parent: int, leaf: bool) -> int:
        self.nodes.append(GraphNode(token, parent, self.nodes[parent].depth + 1, leaf))
        self.nodes[parent].children.append(len(self.nodes) - 1)
        return len(self.nodes) - 1

    def unfold(self, max_tokens: int) -> tuple[list[int], list[int]]:
        """(graph node of each tree node, tree parent of each): breadth-first from the root, a node's children in
        the order they were made and then its pseudo child, while fewer than ``max_tokens`` nodes are out
        (checked before each node is expanded, so the last expansion may pass it; graph_decoding.py:1058-1090).
        Tree node 0 is the root."""
        order, parents = [0], [-1]
        start = 0
        while start < len(order) and len(order) < max_tokens:
            node = self.nodes[order[start]]
            for child in node.children + ([node.pseudo_child] if node.pseudo_child is not None else []):
                order.append(child)
                parents.append(start)
            start += 1
        return order, parents


class GraphDrafter(DraftModel):
    """GSD: the family's draft model's hypotheses merged into a graph and verified as a tree."""

    def __init__(self, name: str = "gsd", model: dict | None = None, drafts_by_family: dict | None = None,
                 tree_decoding: int = 4, repeat_threshold: int = 0, prob_threshold: float = 0.3,
                 sibling_threshold: float = 0.1, max_step_draft: int = 12, max_tree_tokens: int = 100,
                 max_nodes: int = 10_000, cache_dir: str | None = None):
        require_positive(tree_decoding=tree_decoding, max_step_draft=max_step_draft, max_tree_tokens=max_tree_tokens,
                         max_nodes=max_nodes)
        super().__init__(name=name, model=model, drafts_by_family=drafts_by_family, gamma=max_step_draft,
                         cache_dir=cache_dir, first_draft_from_prompt=False)
        if isinstance(repeat_threshold, bool) or not isinstance(repeat_threshold, int) or repeat_threshold < -1:
            raise SpecbenchError(f"drafter.repeat_threshold must be -1 (no merging) or a number of tokens >= 0, got "
                                 f"{repeat_threshold!r}")
        require_non_negative(repeat_threshold=max(repeat_threshold, 0))  # and at most MAX_COUNT
        self.tree_decoding, self.repeat_threshold = tree_decoding, repeat_threshold
        self.prob_threshold = require_number("prob_threshold", prob_threshold, 0.0, 1.0)
        self.sibling_threshold = require_number("sibling_threshold", sibling_threshold, 0.0, 1.0)
        self.max_step_draft, self.max_tree_tokens, self.max_nodes = max_step_draft, max_tree_tokens, max_nodes

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.cache = TreeKVCache(self.num_layers, 2 * prompt_ids.size + 256)
        self.processed = 0
        self._last_draft = None

    def _pass(self, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray) -> torch.Tensor:
        """[q, vocab] the draft's logits over ``tokens`` written at the cache's end, ``mask`` [q, cache + q]."""
        device = self.device
        output = forward_with_cache(self.draft, self.cache, self._cache_keyword,
                                    input_ids=torch.from_numpy(tokens).to(device)[None],
                                    position_ids=torch.from_numpy(positions).to(device)[None],
                                    attention_mask=torch.from_numpy(mask).to(device)[None, None])
        logits = output.logits[0]
        if logits.shape[-1] < self.vocab_size:  # embedding tables are often padded to different sizes
            logits = torch.nn.functional.pad(logits, (0, self.vocab_size - logits.shape[-1]), value=float("-inf"))
        return logits[:, : self.vocab_size]

    @torch.inference_mode()
    def propose(self, context_ids: np.ndarray) -> Draft:
        pending = np.ascontiguousarray(context_ids[self.processed :])
        start = int(context_ids.size)  # the round's nodes are written from here
        root_position = start - 1
        size = pending.size
        causal = np.ones((size, self.processed + size), dtype=bool)
        causal[:, self.processed :] = np.tril(np.ones((size, size), dtype=bool))
        logits = self._pass(pending, np.arange(self.processed, start, dtype=np.int64), causal)[-1:]
        self.processed = start
        graph = TokenGraph(int(context_ids[-1]))
        frontier = [0]
        for step in range(self.max_step_draft):
            if step > 0:
                logits = self._feed(graph, frontier, start, root_position)
            added, all_leaves = self._grow(graph, frontier, logits)
            if not added or all_leaves or len(graph.nodes) >= self.max_nodes:
                break
            frontier = added
        self._graph, self._start = graph, start
        order, parents = graph.unfold(self.max_tree_tokens)
        self._order = order
        tokens = [graph.nodes[node].token for node in order[1:]]
        tree_parents = [parent - 1 for parent in parents[1:]]  # the draft's numbering: tree node i + 1 is draft i
        self._last_draft = Draft(torch.tensor(tokens, dtype=torch.long),
                                 parents=torch.tensor(tree_parents, dtype=torch.long))
        return self._last_draft

    def _feed(self, graph: TokenGraph, frontier: list[int], start: int, root_position: int) -> torch.Tensor:
        """The draft's logits after each frontier node, fed together: each sees the committed text and its own
        ancestors among the nodes fed before (graph_decoding.py:973-984)."""
        fed = self.cache.length - start  # the round's nodes already in the cache
        size = len(frontier)
        mask = np.zeros((size, start + fed + size), dtype=bool)
        mask[:, :start] = True
        for row, node in enumerate(frontier):
            for ancestor in graph.path(graph.nodes[node].parent) - {0}:
                mask[row, start + graph.nodes[ancestor].slot] = True
            mask[row, start + fed + row] = True
            graph.nodes[node].slot = fed + row
        tokens = np.asarray([graph.nodes[node].token for node in frontier], dtype=np.int64)
        positions = np.asarray([root_position + graph.nodes[node].depth for node in frontier], dtype=np.int64)
        return self._pass(tokens, positions, mask)

    def _grow(self, graph: TokenGraph, frontier: list[int], logits: torch.Tensor) -> tuple[list[int], bool]:
        """Each frontier node's kept next tokens added to the graph or merged (graph_decoding.py:998-1024): the new
        nodes, and whether every one of them is a leaf."""
        probs, ids = torch.softmax(logits.float(), dim=-1).topk(min(self.tree_decoding, logits.shape[-1]), dim=-1)
        probs, ids = probs.cpu().numpy(), ids.cpu().numpy()
        added, all_leaves = [], True
        for row, parent in enumerate(frontier):
            if len(graph.nodes) >= self.max_nodes:
                break
            for probability, token in zip(probs[row], ids[row]):
                if probability < self.sibling_threshold * probs[row, 0]:
                    continue
                same = graph.repeated(int(token), parent, self.repeat_threshold)
                if same is not None:
                    graph.nodes[parent].pseudo_child = same
                    continue
                leaf = graph.nodes[parent].leaf or probability < self.prob_threshold
                added.append(graph.add(int(token), parent, leaf))
                all_leaves = all_leaves and leaf
        return added, all_leaves

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        if outcome.draft is not self._last_draft:
            return
        graph, order = self._graph, self._order
        # The accepted path's nodes keep their entries while each was fed and reached along a real edge (its graph
        # parent is the path's previous node); from the first that was not, the next round feeds the tokens again.
        slots, previous = [], 0
        for draft_index in outcome.accepted_nodes:
            node = order[draft_index + 1]
            if graph.nodes[node].parent != previous or graph.nodes[node].slot is None:
                break
            slots.append(graph.nodes[node].slot)
            previous = node
        if slots:
            self.cache.keep_nodes(self._start, slots)
        else:
            self.cache.truncate(self._start)
        self.processed = self._start + len(slots)
