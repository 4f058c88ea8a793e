"""The lossless contract: every drafter in conf/drafter/ gives exactly plain greedy decoding's tokens.

The reference is transformers' own generate(); the extremes (a drafter that is always right and one that is
always wrong) pin the acceptance counts, not only the text.
"""

import functools

import numpy as np
import pytest
import torch
from conftest import TARGET_KINDS, ScriptedDrafter, target_of
from hydra.utils import instantiate

from specbench.config import compose, group_options
from specbench.decoding.loop import Decoder, VerifyShapes
from specbench.decoding.contract import Draft, Drafter
from specbench.testing import configured_drafter, greedy_reference

DRAFTERS = group_options("drafter")
# tiny-random's other architectures (model.architecture), the Qwen2.5 and Qwen3 targets'; the tests above run its Llama.
OTHER_ARCHITECTURES = ("qwen2", "qwen3")


@functools.cache
def tiny_of(architecture: str):
    """tiny-random as ``model=tiny-random model.architecture=...`` builds it (once per session)."""
    return instantiate(compose(["model=tiny-random", f"model.architecture={architecture}"]).model, device="cpu",
                       linear_backend="auto")


def check_records(generation, drafter):
    assert sum(step.accepted_tokens for step in generation.steps) == len(generation.token_ids)
    # A drafter whose first draft comes from the prompt has a prefill that settles nothing.
    first = 0 if drafter.first_draft_from_prompt else 1
    assert generation.steps[0].step == 0 and generation.steps[0].accepted_tokens == first


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 64])
def test_every_configured_drafter_matches_greedy_decoding(name, max_new_tokens, each_target, tiny, prompt_ids):
    drafter = configured_drafter(name, tiny)
    decoder = Decoder(each_target, frozenset(), max_draft_tokens=64)
    for ids in prompt_ids:
        expected = greedy_reference(tiny.weights.module, ids, max_new_tokens)
        generation = decoder.generate(ids, drafter, max_new_tokens)
        assert generation.token_ids == expected
        assert generation.finish_reason == "length"
        check_records(generation, drafter)


@pytest.mark.parametrize("name", DRAFTERS)
def test_eos_inside_the_output_ends_decoding_exactly_like_greedy(name, each_target, tiny, prompt_ids):
    drafter = configured_drafter(name, tiny)
    for ids in prompt_ids:
        free_run = greedy_reference(tiny.weights.module, ids, 48)
        for eos_position in (0, 5, 23):
            eos = free_run[eos_position]
            expected = greedy_reference(tiny.weights.module, ids, 48, [eos])
            assert expected[-1] == eos and eos not in expected[:-1]
            generation = Decoder(each_target, frozenset([eos]), 64).generate(ids, drafter, 48)
            assert generation.token_ids == expected
            assert generation.finish_reason == "eos"
            check_records(generation, drafter)


@pytest.mark.floor  # scripts/floor_env.sh runs it under the oldest transformers all the same
@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
@pytest.mark.parametrize("kind", TARGET_KINDS)
@pytest.mark.parametrize("architecture", OTHER_ARCHITECTURES)
@pytest.mark.parametrize("name", DRAFTERS)
def test_every_configured_drafter_matches_greedy_decoding_on_the_other_architectures(name, architecture, kind,
                                                                                     prompt_ids):
    """The Qwen2 and Qwen3 models (biased projections, per-head norms) under every drafter: short runs to a length
    and one to an EOS inside the output."""
    target = tiny_of(architecture)
    drafter = configured_drafter(name, target)
    decoder = Decoder(target_of(kind, target), frozenset(), max_draft_tokens=64)
    for ids in prompt_ids:
        expected = greedy_reference(target.weights.module, ids, 24)
        generation = decoder.generate(ids, drafter, 24)
        assert generation.token_ids == expected
        assert generation.finish_reason == "length"
        check_records(generation, drafter)
    ids = prompt_ids[0]
    eos = greedy_reference(target.weights.module, ids, 24)[9]
    expected = greedy_reference(target.weights.module, ids, 24, [eos])
    generation = Decoder(target_of(kind, target), frozenset([eos]), 64).generate(ids, drafter, 24)
    assert generation.token_ids == expected and expected[-1] == eos
    assert generation.finish_reason == "eos"
    check_records(generation, drafter)


@pytest.mark.floor  # scripts/floor_env.sh runs it under the oldest transformers all the same
@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
@pytest.mark.parametrize("name", DRAFTERS)
def test_padding_verify_shapes_changes_nothing(name, each_target, tiny, prompt_ids):
    drafter = configured_drafter(name, tiny)
    padded = Decoder(each_target, frozenset(), 64, VerifyShapes([0, 1, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16]))
    for ids in prompt_ids:
        assert padded.generate(ids, drafter, 40).token_ids == greedy_reference(tiny.weights.module, ids, 40)


def test_always_right_drafter_has_every_token_accepted(each_target, tiny, prompt_ids):
    decoder = Decoder(each_target, frozenset(), 64)
    for ids in prompt_ids:
        expected = greedy_reference(tiny.weights.module, ids, 40)
        generation = decoder.generate(ids, ScriptedDrafter(expected, length=5), 40)
        assert generation.token_ids == expected
        verify_steps = generation.steps[1:]
        # 39 tokens after the prefill's first token: steps of 5 drafts + 1 bonus, the last one cut short
        assert [s.draft_tokens for s in verify_steps] == [5] * 6 + [2]
        assert [s.accepted_tokens for s in verify_steps] == [6] * 6 + [3]


def test_always_wrong_drafter_has_nothing_accepted(each_target, tiny, prompt_ids):
    decoder = Decoder(each_target, frozenset(), 64)
    for ids in prompt_ids:
        expected = greedy_reference(tiny.weights.module, ids, 30)
        generation = decoder.generate(ids, ScriptedDrafter(expected, length=4, mode="wrong"), 30)
        assert generation.token_ids == expected
        verify_steps = generation.steps[1:]
        assert len(verify_steps) == 29
        assert all(s.accepted_tokens == 1 for s in verify_steps)
        # budget before verify step i: 29 - i tokens, one of them the bonus
        assert [s.draft_tokens for s in verify_steps] == [min(4, 28 - i) for i in range(29)]


def test_drafts_longer_than_the_budget_are_cut(each_target, tiny, prompt_ids):
    ids = prompt_ids[0]
    expected = greedy_reference(tiny.weights.module, ids, 7)
    generation = Decoder(each_target, frozenset(), 64).generate(ids, ScriptedDrafter(expected + [1] * 20, 15), 7)
    assert generation.token_ids == expected
    assert [s.draft_tokens for s in generation.steps] == [0, 5]
    assert [s.accepted_tokens for s in generation.steps] == [1, 6]


def test_empty_drafts_between_full_ones(each_target, tiny, prompt_ids):
    ids = prompt_ids[1]
    expected = greedy_reference(tiny.weights.module, ids, 30)
    generation = Decoder(each_target, frozenset(), 64).generate(
        ids, ScriptedDrafter(expected, 3, empty_every=2), 30)
    assert generation.token_ids == expected
    assert 0 in [s.draft_tokens for s in generation.steps[1:]]
    assert [s.accepted_tokens for s in generation.steps[1:] if s.draft_tokens == 0] == [1] * sum(
        1 for s in generation.steps[1:] if s.draft_tokens == 0)


def test_max_draft_tokens_caps_a_step(each_target, tiny, prompt_ids):
    ids = prompt_ids[2]
    expected = greedy_reference(tiny.weights.module, ids, 20)
    generation = Decoder(each_target, frozenset(), max_draft_tokens=3).generate(ids, ScriptedDrafter(expected, 10), 20)
    assert generation.token_ids == expected
    assert max(s.draft_tokens for s in generation.steps) == 3


class TreeOracle(Drafter):
    """Drafts a tree whose first branch is wrong and whose second branch is the true continuation, so the
    accepted path is never a prefix of the node order and the KV cache must be compacted."""

    name = "tree-oracle"

    def __init__(self, continuation, depth):
        self.continuation = continuation
        self.depth = depth

    def begin(self, prompt_ids):
        self.prompt_length = prompt_ids.size

    def propose(self, context_ids):
        done = context_ids.size - self.prompt_length
        right = self.continuation[done: done + self.depth]
        if not right:
            return Draft.empty()
        wrong = [(t + 1) % 258 for t in right]
        tokens = wrong + right
        parents = list(range(-1, len(wrong) - 1)) + [-1] + list(range(len(wrong), len(tokens) - 1))
        return Draft(torch.tensor(tokens), torch.tensor(parents))


def test_tree_drafts_keep_the_right_branch_and_stay_lossless(each_target, tiny, prompt_ids):
    decoder = Decoder(each_target, frozenset(), 64)
    for ids in prompt_ids:
        expected = greedy_reference(tiny.weights.module, ids, 33)
        generation = decoder.generate(ids, TreeOracle(expected, 4), 33)
        assert generation.token_ids == expected
        assert [s.accepted_tokens for s in generation.steps[1:]] == [5] * 6 + [2]


def test_tree_forward_scores_each_branch_like_a_plain_chain(each_target, tiny, prompt_ids):
    """One forward pass over a two-branch tree gives the logits of each branch decoded on its own."""
    from specbench.decoding.plan import plan_verification, verification_inputs

    target = each_target
    ids = prompt_ids[0]
    branch_a, branch_b = [10, 11, 12], [20, 21]
    with torch.inference_mode():
        target.start(128)
        target.prefill(np.array(ids[:-1]), False, 2)
        draft = Draft(torch.tensor([*branch_a, *branch_b]), parents=torch.tensor([-1, 0, 1, -1, 3]))
        plan = plan_verification(draft, ids[-1], max_depth=10, max_nodes=64)
        tree_logits = target.verify(verification_inputs(plan, target.length, plan.n_nodes), plan.n_nodes, 2).logits
        for branch, rows in ((branch_a, [0, 1, 2, 3]), (branch_b, [0, 4, 5])):
            chain = tiny.weights.module(input_ids=torch.tensor([ids + branch])).logits[0, len(ids) - 1:]
            torch.testing.assert_close(tree_logits[rows], chain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_drafters_sources_are_records_the_summary_can_hold(name, tiny):
    """summary.json's drafter_sources: each entry a JSON object (the runner logs its prompt_set), also for a drafter
    with two models (hsddw)."""
    import json

    sources = configured_drafter(name, tiny).sources()
    assert isinstance(sources, dict) and all(isinstance(entry, dict) for entry in sources.values()), sources
    json.dumps(sources)
