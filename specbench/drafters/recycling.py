"""Token Recycling (Luo et al., 2024, "Turning Trash into Treasure", arXiv 2408.08696).

Every forward pass of the target scores tokens that are then thrown away: the rejected draft nodes, and the
alternatives to the tokens it kept. Token Recycling keeps them in an adjacency matrix: row ``t`` holds the
target's top-k next tokens the last time it read ``t``. A draft is a fixed tree template expanded from the
last committed token, each node's token read from its parent token's row at the node's rank among siblings.

As the authors' code runs it on Spec-Bench (evaluation/inference_recycling.py @fd2c1cd):
- the matrix starts as zeros (an unseen token proposes token 0 at every rank) and is never reset: it carries
  over from one question to the next and through the warm-up ("hot start");
- after every pass, every verified node (the root and all draft nodes, accepted or not) writes the target's
  top-8 at its position into its token's row (lines 131-132); when a token appears at several nodes the
  last node's row is kept here (on a GPU the original's scatter leaves that order unspecified);
- the pass that accepts an EOS does not update (the loop breaks first, line 128);
- the template is "2.2.2" (tree_template_.py), 80 nodes, 6 deep.

SAM-Decoding uses the same matrix as its auxiliary drafter (model/samd/tree_model/token_recycle), with a
smaller 60-node template, updated on every pass including the last, and from the prompt's positions too.

Because the matrix outlives a question, results depend on the order questions run in; a run directory
keeps the matrix after every question (``state``/``restore``), so a resumed run continues exactly where the
interrupted one stopped.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.tree import TreeTemplate
from specbench.drafters.base import require_flag, require_positive
from specbench.errors import SpecbenchError

# Draft trees as each node's path of sibling ranks from the root ([2, 0]: the first child of the root's third
# child), parents before children.
TEMPLATES: dict[str, list[tuple[int, ...]]] = {
    # Token Recycling's "2.2.2" (Spec-Bench model/recycling/tree_template_.py:3-11): 8, 21, 25, 15, 8 and 3
    # nodes at depths 1 to 6.
    "2.2.2": [
        (0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,),
        (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (1, 0), (1, 1), (1, 2), (1, 3),
        (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (4, 0), (5, 0), (6, 0), (7, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 0, 4), (0, 0, 5), (0, 0, 6), (0, 0, 7), (0, 1, 0),
        (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1), (0, 3, 0), (0, 4, 0), (0, 5, 0), (0, 6, 0), (0, 7, 0),
        (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0), (3, 0, 0), (4, 0, 0), (5, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 0, 4), (0, 0, 1, 0), (0, 0, 1, 1),
        (0, 0, 2, 0), (0, 0, 3, 0), (0, 0, 4, 0), (0, 1, 0, 0), (0, 2, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0),
        (3, 0, 0, 0),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 2, 0), (0, 0, 1, 0, 0),
        (0, 1, 0, 0, 0), (1, 0, 0, 0, 0),
        (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 1, 0, 0),
    ],
    # SAM-Decoding's Token Recycling tree (model/samd/config/token_recycle.json, node ids 1-60 in order): 7, 20,
    # 21, 8 and 4 nodes at depths 1 to 5.
    "samd": [
        (0,), (1,), (2,), (3,), (4,), (5,), (6,),
        (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (2, 1),
        (2, 2), (3, 0), (3, 1), (4, 0), (4, 1), (5, 0), (6, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (0, 3, 0), (0, 4, 0),
        (1, 0, 0), (1, 0, 1), (1, 0, 2), (1, 1, 0), (1, 1, 1), (1, 2, 0), (1, 3, 0), (2, 0, 0), (2, 1, 0),
        (3, 0, 0), (4, 0, 0), (5, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0), (1, 0, 0, 1), (1, 1, 0, 0),
        (2, 0, 0, 0),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 1, 0, 0), (1, 0, 0, 0, 0),
    ],
}


def recycle(successors: np.ndarray, tokens: np.ndarray, top_ids: np.ndarray) -> None:
    """Write each token's row of the target's top-k (``top_ids`` [n, >=k], best first) into ``successors``
    [vocab, k], in place. Rows of -1 (nodes the step did not verify) are skipped; a token met twice keeps its
    last row."""
    k = min(successors.shape[1], top_ids.shape[1])  # a vocabulary smaller than k gives fewer columns
    verified = top_ids[:, 0] >= 0
    tokens, top_ids = tokens[verified], top_ids[verified, :k]
    # np.unique on the reversed tokens finds each token's last occurrence.
    _, last_from_end = np.unique(tokens[::-1], return_index=True)
    last = tokens.size - 1 - last_from_end
    successors[tokens[last], :k] = top_ids[last]


class TokenRecycling(Drafter):
    """Token Recycling's drafter (see the module docstring).

    template:          "2.2.2" (Token Recycling, 80 nodes) or "samd" (SAM-Decoding's, 60 nodes)
    top_k:             successors kept per token (the matrix's width; the authors': 8)
    hot_start:         keep the matrix across questions (the authors'); false: start every question from zeros
    learn_from_prompt: also learn from the target's choices at every prompt position in the prefill
                       (SAM-Decoding's variant; Token Recycling learns from decoding passes only)
    update_on_eos:     also learn from the pass that accepts an EOS (SAM-Decoding's variant)
    first_draft_from_prompt: the prefill reads the prompt but its last token, and the first pass drafts the
                       template from that token and learns its row and the 80 nodes' (the authors'; false: the
                       prefill settles the first token and learns the last prompt token's row alone)
    """

    def __init__(self, name: str = "recycling", template: str = "2.2.2", top_k: int = 8, hot_start: bool = True,
                 learn_from_prompt: bool = False, update_on_eos: bool = False, first_draft_from_prompt: bool = True):
        if template not in TEMPLATES:
            raise SpecbenchError(f"drafter.template={template!r} is not a known tree template; "
                                 f"choose one of: {', '.join(TEMPLATES)}")
        require_positive(top_k=top_k)
        require_flag(hot_start=hot_start, learn_from_prompt=learn_from_prompt, update_on_eos=update_on_eos,
                     first_draft_from_prompt=first_draft_from_prompt)
        self.name = name
        self.template = TreeTemplate(TEMPLATES[template])
        if self.template.width > top_k:
            raise SpecbenchError(f"drafter.top_k={top_k} is smaller than template {template!r} needs "
                                 f"({self.template.width} children under one node)")
        self.top_k = top_k
        self.target_top_k = top_k  # the loop hands this drafter the target's top-k per verified node
        self.reads_prompt_choices = bool(learn_from_prompt)
        self.hot_start = bool(hot_start)
        self.update_on_eos = bool(update_on_eos)
        self.first_draft_from_prompt = bool(first_draft_from_prompt)
        if self.reads_prompt_choices and self.first_draft_from_prompt:
            raise SpecbenchError("drafter.learn_from_prompt=true needs a prefill that reads every prompt position "
                                 "and settles the first token: set drafter.first_draft_from_prompt=false with it")
        self.successors: np.ndarray | None = None  # [vocab, top_k]
        self.eos_token_ids: frozenset[int] = frozenset()
        self._root = -1

    def prepare(self, target, sampling=None) -> None:
        vocab = target.vocab_size
        self.successors = np.zeros((vocab, self.top_k), dtype=np.int64)
        self.eos_token_ids = frozenset(int(t) for t in target.eos_token_ids)

    def begin(self, prompt_ids: np.ndarray) -> None:
        if self.successors is None:
            raise SpecbenchError("TokenRecycling.prepare(target) must run before the first question")
        if not self.hot_start:
            self.successors[:] = 0
        self._prompt = prompt_ids

    def propose(self, context_ids: np.ndarray) -> Draft:
        self._root = int(context_ids[-1])
        tokens = self.template.expand(self._root, self.successors)
        return Draft(torch.from_numpy(tokens), parents=torch.from_numpy(self.template.parents))

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        self.learn_step(self._root, accepted_ids, outcome)

    def learn_step(self, root: int, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        """Learn what one step's pass said after ``root`` and the draft it verified, whichever drafter
        proposed it (SAM-Decoding and the hybrid feed their own drafts to the matrix this way)."""
        top = outcome.target_top_ids
        if top is None:
            raise SpecbenchError("Token Recycling needs the target's top-k per verified node; the loop gave none")
        if outcome.step == 0:
            # The prefill's rows: one per prompt position when learning from the prompt, else the last one.
            self.learn(self._prompt[-top.shape[0]:], top)
            return
        accepted_draft = accepted_ids[: len(outcome.accepted_nodes)]
        if not self.update_on_eos and any(int(t) in self.eos_token_ids for t in accepted_draft):
            return
        self.learn(np.concatenate(([root], outcome.draft.token_ids.numpy())), top)

    def learn(self, tokens: np.ndarray, top_ids: np.ndarray) -> None:
        """Recycle the target's top-k at the positions of ``tokens`` (the inputs of one forward pass)."""
        recycle(self.successors, np.asarray(tokens, dtype=np.int64), top_ids)

    # ---- state carried across questions -----------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray] | None:
        return {"successors": self.successors} if self.hot_start else None

    def restore(self, state: dict[str, np.ndarray]) -> None:
        saved = state["successors"]
        if saved.shape != self.successors.shape:
            raise SpecbenchError(f"the saved Token Recycling matrix has shape {saved.shape}, this target and "
                                 f"top_k need {self.successors.shape}")
        self.successors[:] = saved
