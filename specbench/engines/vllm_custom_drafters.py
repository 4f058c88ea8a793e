"""Which drafter configs ``engine=vllm-custom`` runs inside vLLM through its custom proposer, what each becomes there,
and the one-line refusal for the others. Pure: imports neither vLLM nor torch, so the checks run before anything
loads, in any environment.

vLLM 0.32's ``custom_class`` proposer (vllm/v1/spec_decode/custom_class_proposer.py) is asked, every step, for one
list of token ids per request, given each request's tokens and nothing of the target's pass; vLLM verifies the list
as a chain. So a drafter runs there when its drafting needs only the context's tokens:

    drafter class              runs as                    longest chain (vLLM's num_speculative_tokens)
    PromptLookup (pld, pld-hd) its chain                  num_draft_tokens
    SuffixDecoding (suffix)    its path (tree_spec false) max_spec_tokens, else max_tree_depth; concurrent requests
                               share the finished responses (``SuffixDecoding.fork``)
    HierarchyDrafting          its best chain: the first  draft_length; only without Lookahead's window
      (hd-chains)              candidate in HD's order    (lookahead_branch false)
    RetrievalDrafter (rest)    its best chain: the most   continuation_length
                               frequent continuation
    SuffixAutomatonDrafter     its chain, or the corpus   n_predicts - 1; only without an auxiliary
      (samd-automata)          tree's most probable path  (auxiliary none)

A drafter whose drafts can be trees is cut to its best chain (``decoding.tree.best_chain``) under a name that says
so: ``rest+chain@vllm-custom``, never ``rest@vllm-custom``.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.config import group_options, option_values
from specbench.errors import SpecbenchError

PLD = "specbench.drafters.pld.PromptLookup"
SUFFIX = "specbench.drafters.suffix.SuffixDecoding"
HD = "specbench.drafters.hd.HierarchyDrafting"
REST = "specbench.drafters.rest.RetrievalDrafter"
SAMD = "specbench.drafters.samd.SuffixAutomatonDrafter"

# The classes whose drafts can be trees: cut to their best chain, "+chain" in the name.
TREE_DRAFTERS = (HD, REST, SAMD)
CHAIN_SUFFIX = "+chain"

# Why a drafter class cannot draft inside vLLM's proposer call, by class.
NEEDS_THE_TARGET = {
    "specbench.drafters.recycling.TokenRecycling": "it reads the target's top-k tokens at every verified position, "
                                                   "which vLLM's proposer call does not hand over",
    "specbench.drafters.lookahead.Lookahead": "it drafts inside Lookahead's Jacobi window, which runs in the target's "
                                              "own pass",
    "specbench.drafters.hybrid.HybridDrafter": "it drafts inside Lookahead's Jacobi window, which runs in the "
                                               "target's own pass",
    "specbench.drafters.ar.NoDraft": "it drafts nothing (the baseline both vLLM engines run)",
}


@dataclass(frozen=True)
class CustomDrafter:
    """What a drafter config becomes inside vLLM: its label (the drafter's name, ``+chain`` when its trees are cut
    to a chain), the longest chain it proposes (vLLM's ``num_speculative_tokens``) and whether it is cut."""

    label: str
    max_chain: int
    cut_to_chain: bool


def custom_drafters() -> list[str]:
    """The drafter configs (conf/drafter/) engine=vllm-custom runs as they are, in order."""
    return [name for name in group_options("drafter")
            if isinstance(_shape(option_values("drafter", name)), CustomDrafter)]


def custom_drafter(drafter: dict) -> CustomDrafter:
    """What ``drafter`` (the resolved drafter group) runs as inside vLLM, or a one-line refusal naming why and the
    drafters that run there."""
    shape = _shape(drafter)
    if isinstance(shape, CustomDrafter):
        return shape
    name = drafter.get("name", drafter.get("_target_"))
    raise SpecbenchError(f"drafter={name} cannot draft inside vLLM (engine=vllm-custom): {shape}; engine=vllm-custom "
                         f"runs drafter={', '.join(custom_drafters())}")


def _shape(drafter: dict) -> CustomDrafter | str:
    """``custom_drafter``'s answer, or why not."""
    target, name = drafter.get("_target_"), drafter.get("name", drafter.get("_target_"))
    if target in NEEDS_THE_TARGET:
        return NEEDS_THE_TARGET[target]
    if target == PLD:
        return CustomDrafter(name, int(drafter["num_draft_tokens"]), False)
    if target == SUFFIX:
        if drafter.get("tree_spec"):
            return ("tree_spec=true drafts a tree, and vLLM verifies a chain; use drafter.tree_spec=false (its path, "
                    "as vLLM's suffix drafts)")
        spec_tokens = drafter.get("max_spec_tokens")
        return CustomDrafter(name, int(spec_tokens) if spec_tokens else int(drafter["max_tree_depth"]), False)
    if target == HD:
        if drafter.get("lookahead_branch", True):
            return ("it drafts inside Lookahead's Jacobi window, which runs in the target's own pass; drafter=hd-chains "
                    "is HD's databases without the window")
        return CustomDrafter(name + CHAIN_SUFFIX, int(drafter["draft_length"]), True)
    if target == REST:
        return CustomDrafter(name + CHAIN_SUFFIX, int(drafter["continuation_length"]), True)
    if target == SAMD:
        if drafter.get("auxiliary", "recycling") != "none":
            return ("its Token Recycling auxiliary reads the target's top-k tokens at every verified position, which "
                    "vLLM's proposer call does not hand over; drafter=samd-automata is SAM-Decoding's automata alone")
        return CustomDrafter(name + CHAIN_SUFFIX, int(drafter["n_predicts"]) - 1, True)
    return ("it drafts with weights or passes of its own (a draft model, a head, the target's layers), which vLLM's "
            "proposer call has no place for; engine=vllm runs the drafters vLLM has a method for")
