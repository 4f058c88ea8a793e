"""Token Recycling: the templates, the matrix's expansion and update, the hot start and its persistence."""


import numpy as np
import pytest
import torch

from specbench.decoding.contract import Draft, StepOutcome
from specbench.decoding.loop import Decoder
from specbench.decoding.tree import TreeTemplate
from specbench.drafters.recycling import TEMPLATES, TokenRecycling, recycle
from specbench.errors import SpecbenchError


class FakeTarget:
    """Just what the drafter reads from a target: the vocabulary size and the EOS ids."""

    def __init__(self, vocab=20, eos=(19,)):
        self.eos_token_ids = frozenset(eos)
        self.vocab_size = vocab


def level_sizes(template):
    return [len(level) for level in template.levels]


def test_templates_have_the_published_shapes():
    # Token Recycling's 2.2.2 (tree_template_.py) and SAM-Decoding's token_recycle.json.
    assert len(TreeTemplate(TEMPLATES["2.2.2"])) == 80
    assert level_sizes(TreeTemplate(TEMPLATES["2.2.2"])) == [8, 21, 25, 15, 8, 3]
    assert len(TreeTemplate(TEMPLATES["samd"])) == 60
    assert level_sizes(TreeTemplate(TEMPLATES["samd"])) == [7, 20, 21, 8, 4]


def test_a_template_node_before_its_parent_is_refused():
    with pytest.raises(ValueError, match="before its parent"):
        TreeTemplate([(0, 0), (0,)])


def test_expansion_reads_each_node_from_its_parent_tokens_row_at_its_rank():
    successors = np.zeros((10, 2), dtype=np.int64)
    successors[5] = [7, 8]
    successors[7] = [9, 3]
    successors[8] = [4, 6]
    template = TreeTemplate([(0,), (1,), (0, 0), (0, 1), (1, 1)])
    assert template.expand(5, successors).tolist() == [7, 8, 9, 3, 6]
    assert template.parents.tolist() == [-1, -1, 0, 0, 1]
    # An unseen token's row is zeros: its children are token 0, as in the authors' zero-initialised matrix.
    assert template.expand(2, successors).tolist() == [0, 0, 0, 0, 0]


def test_recycle_writes_every_verified_row_and_keeps_a_repeated_tokens_last():
    successors = np.zeros((10, 2), dtype=np.int64)
    tokens = np.array([3, 4, 3, 5])
    top = np.array([[1, 2], [5, 6], [7, 8], [-1, -1]])  # token 5's node was not verified
    recycle(successors, tokens, top)
    assert successors[3].tolist() == [7, 8]
    assert successors[4].tolist() == [5, 6]
    assert successors[5].tolist() == [0, 0]


def make(**settings):
    drafter = TokenRecycling(template="2.2.2", **settings)
    drafter.prepare(FakeTarget())
    return drafter


def outcome_for(drafter, draft, step, accepted_nodes, top):
    return StepOutcome(step=step, draft=draft, target_tokens=top[:, 0], accepted_nodes=accepted_nodes,
                       target_top_ids=top)


def test_the_prefill_teaches_the_last_prompt_token_and_every_pass_teaches_all_its_nodes():
    drafter = make(first_draft_from_prompt=False)
    prompt = np.array([1, 2, 3])
    drafter.begin(prompt)
    first_row = np.arange(8)[None, :] + 10
    drafter.accept(np.array([4]), StepOutcome(step=0, draft=Draft.empty(), target_tokens=first_row[:, 0],
                                               accepted_nodes=(), target_top_ids=first_row))
    assert drafter.successors[3].tolist() == list(range(10, 18))  # the last prompt token's row
    assert not drafter.successors[1].any()

    draft = drafter.propose(np.array([1, 2, 3, 3]))
    assert draft.token_ids.tolist()[:8] == list(range(10, 18))  # the root 3's row, rank by rank
    top = np.tile(np.arange(8), (81, 1)) + 1
    top[:, 0] = np.arange(81) % 20
    drafter.accept(np.array([10, 5]), outcome_for(drafter, draft, 1, (0,), top))
    # The root and every draft node, rejected ones included, wrote their rows.
    for node, token in enumerate([3, *draft.token_ids.tolist()]):
        last = max(i for i, t in enumerate([3, *draft.token_ids.tolist()]) if t == token)
        assert drafter.successors[token].tolist() == top[last].tolist(), node


def test_the_pass_that_accepts_an_eos_teaches_nothing_unless_asked():
    for update_on_eos, changed in ((False, False), (True, True)):
        drafter = make(update_on_eos=update_on_eos)
        drafter.begin(np.array([1, 2]))
        drafter.successors[2] = [19, 1, 1, 1, 1, 1, 1, 1]
        draft = drafter.propose(np.array([1, 2]))
        assert draft.token_ids[0] == 19
        top = np.full((81, 8), 6)
        drafter.accept(np.array([19]), outcome_for(drafter, draft, 1, (0,), top))
        assert (drafter.successors[2].tolist() == [6] * 8) is changed


def test_the_matrix_carries_over_questions_only_with_a_hot_start():
    for hot_start in (True, False):
        drafter = make(hot_start=hot_start)
        drafter.begin(np.array([1]))
        drafter.successors[1] = 5
        drafter.begin(np.array([2]))
        assert bool(drafter.successors[1].any()) is hot_start
        assert (drafter.state() is not None) is hot_start


def test_state_round_trip_and_a_wrong_shape_is_refused():
    drafter = make()
    drafter.successors[4] = 9
    other = make()
    other.restore({k: v.copy() for k, v in drafter.state().items()})
    assert np.array_equal(other.successors, drafter.successors)
    with pytest.raises(SpecbenchError, match="shape"):
        other.restore({"successors": np.zeros((3, 8), dtype=np.int64)})


def test_bad_settings_name_the_key():
    with pytest.raises(SpecbenchError, match="template='x'.*2.2.2, samd"):
        TokenRecycling(template="x")
    with pytest.raises(SpecbenchError, match="top_k=4 is smaller"):
        TokenRecycling(top_k=4)


def test_the_loop_hands_the_drafter_the_targets_top_k_of_every_prompt_position(tiny, prompt_ids):
    ids = prompt_ids[0]
    for learn_from_prompt, rows in ((False, 1), (True, len(ids))):
        drafter = TokenRecycling(learn_from_prompt=learn_from_prompt, first_draft_from_prompt=False)
        drafter.prepare(tiny)
        seen = []
        original = drafter.learn

        def spy(tokens, top):
            seen.append((np.asarray(tokens).copy(), top.copy()))
            original(tokens, top)

        drafter.learn = spy
        Decoder(tiny.target, frozenset(), 80).generate(ids, drafter, 3)
        tokens, top = seen[0]
        assert tokens.tolist() == ids[-rows:] and top.shape == (rows, 8)
        logits = tiny.weights.module(input_ids=torch.tensor([ids])).logits[0]
        assert top[:, 0].tolist() == logits.argmax(-1)[-rows:].tolist()


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_a_resumed_run_continues_from_the_saved_matrix(tmp_path):
    from test_cli import assert_a_resumed_run_continues_the_state

    assert_a_resumed_run_continues_the_state(tmp_path, "recycling", "successors")
