"""The cache-less reference target, the oracle of the Target contract: every pass one full forward over the whole
sequence. The contract tests (test_contract.py, test_target.py, test_verify_inputs.py) run over it and the
transformers target alike (conftest.each_target); these pin that the two agree pass by pass and step by step."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import refusal, target_of
from test_contract import DRAFTERS
from specbench.testing import configured_drafter

from specbench.decoding.contract import Draft
from specbench.decoding.loop import Decoder
from specbench.decoding.plan import plan_verification, verification_inputs
from specbench.targets.reference import ReferenceTarget


def _tree_pass(target, ids):
    """Prefill ``ids`` minus its last token, then verify a two-branch tree rooted at it: the choices."""
    target.start(len(ids) + 16)
    target.prefill(np.asarray(ids[:-1], dtype=np.int64), False, 4)
    draft = Draft(torch.tensor([10, 11, 12, 20, 21]), parents=torch.tensor([-1, 0, 1, -1, 3]))
    plan = plan_verification(draft, ids[-1], max_depth=10, max_nodes=64)
    return target.verify(verification_inputs(plan, target.length, plan.n_nodes + 3), plan.n_nodes, 4)


@torch.inference_mode()
def test_a_tree_pass_gives_the_same_choices_through_both_targets(tiny, prompt_ids):
    cached, oracle = (_tree_pass(target_of(kind, tiny), prompt_ids[1]) for kind in ("transformers", "reference"))
    assert oracle.argmax.tolist() == cached.argmax.tolist() and oracle.argmax.shape == (6,)
    assert oracle.top_ids.tolist() == cached.top_ids.tolist()
    np.testing.assert_allclose(oracle.top_logits, cached.top_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(oracle.logits, cached.logits, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_keep_and_truncate_edit_the_sequence_a_cache_would_hold(tiny, prompt_ids):
    target = ReferenceTarget(tiny.weights.module)
    ids = prompt_ids[0]
    _tree_pass(target, ids)
    start = len(ids) - 1
    assert target.length == start + 9  # the pass's 6 nodes and 3 padding tokens, until keep
    target.keep(start, [0, 4, 5])
    assert target._tokens[start:].tolist() == [ids[-1], 20, 21] and target.length == start + 3
    target.truncate(start + 1)
    assert target._tokens.tolist() == ids
    target.release()
    assert target.length == 0


@torch.inference_mode()
def test_a_pass_from_another_position_than_the_sequence_end_is_refused(tiny, prompt_ids):
    target = ReferenceTarget(tiny.weights.module)
    ids = np.asarray(prompt_ids[0], dtype=np.int64)
    target.start(ids.size + 8)
    target.prefill(ids, False, 2)
    plan = plan_verification(Draft.chain([5, 6]), int(ids[-1]), 4, 4)
    message = refusal(target.verify, verification_inputs(plan, target.length - 1, plan.n_nodes), plan.n_nodes, 2)
    assert "disagree about the sequence" in message


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
@pytest.mark.parametrize("name", DRAFTERS)
def test_every_drafter_takes_the_same_steps_through_both_targets(name, tiny, prompt_ids):
    """Not only the same tokens: the same drafts, acceptances and step count, so the reference target could
    stand in for the cached one in any record."""
    runs = {}
    for kind in ("transformers", "reference"):
        drafter = configured_drafter(name, tiny)  # a fresh one each: some learn across questions (Token Recycling's matrix)
        generation = Decoder(target_of(kind, tiny), frozenset(), 64).generate(prompt_ids[2], drafter, 24)
        runs[kind] = (generation.token_ids,
                      [(step.draft_tokens, step.accepted_tokens, step.verify_tokens) for step in generation.steps])
    assert runs["reference"] == runs["transformers"]
    assert len(runs["reference"][0]) == 24


def test_the_reference_target_refuses_eager_attention():
    """A boolean mask means "may attend" to SDPA only; eager attention would add it to the scores."""
    eager = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    assert "SDPA" in refusal(ReferenceTarget, eager)


def test_the_default_suite_keeps_every_drafter_over_the_reference_target_and_sends_the_long_variants_to_slow():
    from types import SimpleNamespace

    from conftest import over_the_reference_only_with_slow

    def item(test, **params):
        return SimpleNamespace(originalname=test, callspec=SimpleNamespace(params=params))

    main = "test_every_configured_drafter_matches_greedy_decoding"
    assert not over_the_reference_only_with_slow(item(main, name="pld", max_new_tokens=64, each_target="reference"))
    assert over_the_reference_only_with_slow(item(main, name="pld", max_new_tokens=7, each_target="reference"))
    assert not over_the_reference_only_with_slow(item(main, name="pld", max_new_tokens=7, each_target="transformers"))
    assert over_the_reference_only_with_slow(item("test_padding_verify_shapes_changes_nothing", name="hd",
                                                  each_target="reference"))
    assert over_the_reference_only_with_slow(item(main + "_on_the_other_architectures", name="hd", kind="reference"))
    assert not over_the_reference_only_with_slow(item("test_always_right_drafter_has_every_token_accepted",
                                                      each_target="reference"))
