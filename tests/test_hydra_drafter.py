"""Hydra's drafting, pinned against plain re-statements of Spec-Bench's (model/hydra/ @fd2c1cd): the tree path by
path, each node the rank-th best token of its depth's head fed the prefix, the root and the path's tokens; the
prefix layer fed the states of the positions as they settle; lossless through the loop at T = 0 and T = 1."""

import numpy as np
import pytest
import torch
from conftest import refusal
from hydra.utils import instantiate
from test_hydra_heads import hydra_state, write_hydra_dir
from test_sampling import JOINT_BOUND, MARGINAL_BOUND, PROMPT, SAMPLING, distributions, exact_distribution, \
    total_variation

from specbench.config import compose
from specbench.decoding.contract import Draft, StepOutcome
from specbench.decoding.loop import Decoder
from specbench.drafters.hydra import TREES
from specbench.testing import configured_drafter, greedy_reference

# Spec-Bench model/hydra/hydra_choices.py:1 @fd2c1cd (the same list as zankner/Hydra hydra/model/hydra_choices.py),
# re-stated from the source, not from specbench's copy.
MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
                [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
                [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
                [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
                [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1],
                [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]


@pytest.fixture(scope="module")
def head_dir(tiny, tmp_path_factory):
    return str(write_hydra_dir(tmp_path_factory.mktemp("hydra") / "head", hydra_state(tiny)))


def drafter_for(target, head_dir):
    return configured_drafter("hydra", target, overrides=[f"drafter.head.path={head_dir}"])


def test_the_settings_are_the_leaderboards():
    drafter = compose(["drafter=hydra"]).drafter
    assert drafter.tree == "mc_sim_7b_63"  # inference_hydra.py --hydra-choices default; eval.sh passes none
    assert drafter.heads_by_model["vicuna-7b"] == {"hub_id": "ankner/hydra-vicuna-7b-v1.3"}  # eval.sh:5 Hydra_PATH
    assert drafter.heads_by_model["vicuna-13b"] == {"hub_id": "ankner/hydra-vicuna-13b-v1.3"}
    assert drafter.heads_by_model["vicuna-33b"] == {"hub_id": "ankner/hydra-vicuna-33b-v1.3"}
    assert drafter.heads_by_model["smollm2-135m"] == {"trained": {}}
    assert drafter.heads_by_model["tiny-random"] == {"trained": {"train_steps": 0}}
    assert sorted(TREES["mc_sim_7b_63"]) == sorted(tuple(path) for path in MC_SIM_7B_63)
    assert len(MC_SIM_7B_63) == 63 and max(len(path) for path in MC_SIM_7B_63) == 4


def test_hydras_children_scheme_is_the_rank_tree():
    """Hydra fetches each parent's top num_children tokens and feeds on its first children_to_expand: that is the
    rank tree only if every parent's children are ranks 0..c-1 and those with children ranks 0..e-1. They are."""
    paths = {tuple(path) for path in MC_SIM_7B_63}
    parents = {path[:-1] for path in paths}
    for parent in parents:
        ranks = sorted(path[-1] for path in paths if path[:-1] == parent)
        assert ranks == list(range(len(ranks))), parent
        expanded = sorted(path[-1] for path in paths if path[:-1] == parent and path in parents)
        assert expanded == list(range(len(expanded))), parent


def expected_tree(head, prefix_last, root):
    """Each path's token, one path at a time: the rank-th best of head d - 1 over cat(prefix, E[root], E[path's
    tokens above])."""
    tokens = {}
    embed = head.target_embedding

    def token(path):
        if path not in tokens:
            above = [token(path[:depth]) for depth in range(1, len(path))]
            inputs = torch.cat((prefix_last, embed[root], *(embed[t] for t in above)))[None]
            tokens[path] = int(head.head_logits(len(path) - 1, inputs)[0].topk(path[-1] + 1).indices[path[-1]])
        return tokens[path]

    ordered = sorted((tuple(path) for path in MC_SIM_7B_63), key=lambda path: (len(path), path))
    return [token(path) for path in ordered], [ordered.index(path[:-1]) if len(path) > 1 else -1 for path in ordered]


def test_the_tree_path_by_path_and_the_prefix_fed_as_positions_settle(tiny, head_dir):
    drafter = drafter_for(tiny, head_dir)
    head = drafter.head
    assert drafter.hidden_state_layers == (tiny.num_layers,)
    h = head.config.hidden_size
    generator = torch.Generator().manual_seed(5)
    prompt = np.array([3, 14, 15, 92, 65], dtype=np.int64)
    prefill_states = torch.randn(1, prompt.size, h, generator=generator)
    step_states = torch.randn(1, 3, h, generator=generator)  # the root and two accepted nodes
    drafter.begin(prompt)
    drafter.accept(np.array([35]), StepOutcome(0, Draft.empty(), np.array([35]), (), hidden_states=prefill_states))
    with torch.inference_mode():
        first = drafter.propose(np.append(prompt, 35))
    tokens, parents = expected_tree(head, head.prefix_sequences(prefill_states)[0, -1], 35)
    assert first.token_ids.tolist() == tokens and first.parents.tolist() == parents and first.probs is None
    drafter.accept(np.array([first.token_ids[0].item(), 7, 8]),
                   StepOutcome(1, first, np.zeros(64, dtype=np.int64), (0, 1), hidden_states=step_states))
    context = np.concatenate((prompt, [35, int(first.token_ids[0]), 7, 8]))
    with torch.inference_mode():
        second = drafter.propose(context)
    every = torch.cat((prefill_states, step_states), dim=1)  # positions 0..7, in the order they settled
    tokens, _ = expected_tree(head, head.prefix_sequences(every)[0, -1], 8)
    assert second.token_ids.tolist() == tokens
    assert drafter.cache.length == context.size - 1  # every committed position but the root


def test_a_head_shallower_than_the_tree_is_refused(tiny, tmp_path):
    directory = write_hydra_dir(tmp_path / "head", hydra_state(tiny, heads=3),
                                {"hydra_head_arch": "prefix-mlp", "grounded_heads": True, "hydra_num_heads": 3,
                                 "hydra_num_layers": 4})
    assert "tree mc_sim_7b_63 is 4 deep, but the head has 3 heads" in refusal(drafter_for, tiny, str(directory))


def test_lossless_against_greedy(tiny, each_target, head_dir, prompt_ids):
    drafter = drafter_for(tiny, head_dir)
    for ids in prompt_ids[:2]:  # tests/test_contract.py decodes every prompt, at four lengths
        expected = greedy_reference(tiny.weights.module, ids, 16)
        generation = Decoder(each_target, frozenset(), max_draft_tokens=64).generate(ids, drafter, 16)
        assert generation.token_ids == expected
        assert sum(step.accepted_tokens for step in generation.steps) == len(expected)


SAMPLED_DECODES = 400  # test_sampling's bounds hold with room at this count for 3 tokens (6 outcomes each)


@pytest.mark.slow  # 400 decodes: half a minute on 2 cores
def test_sampling_keeps_the_target_distribution(tmp_path):
    """At T = 1 the deterministic tree goes through specbench's lossless verifier: the first tokens' distribution
    is the target's, measured over seeded decodes of the 6-token model (test_sampling.py's)."""
    small = instantiate(compose(["model=tiny-random", "model.alphabet=abcd", "model.initializer_range=0.1"]).model,
                        device="cpu", linear_backend="auto")
    directory = write_hydra_dir(tmp_path / "head", hydra_state(small))
    drafter = instantiate(compose(["drafter=hydra", "model=tiny-random", f"drafter.head.path={directory}"]).drafter)
    drafter.prepare(small, SAMPLING)
    assert len(drafter.plan) < 63  # ranks beyond the 6-token vocabulary are left out
    prompt_ids = small.encode_conversation([PROMPT], [])
    eos = small.tokenizer.eos_token_id
    exact_marginal, exact_joint = distributions(exact_distribution(small.weights.module, prompt_ids, eos, 3))
    decoder = Decoder(small.target, small.eos_token_ids, 64, sampling=SAMPLING)
    counts, drafted = {}, 0
    for seed in range(SAMPLED_DECODES):
        generation = decoder.generate(prompt_ids, drafter, 3, seed=seed)
        counts[tuple(generation.token_ids)] = counts.get(tuple(generation.token_ids), 0) + 1
        drafted += any(step.accepted_tokens > 1 for step in generation.steps)
    marginal, joint = distributions({key: count / SAMPLED_DECODES for key, count in counts.items()})
    assert drafted > SAMPLED_DECODES // 10, drafted  # the draft was accepted often: not a test of AR alone
    assert max(total_variation(m, e) for m, e in zip(marginal, exact_marginal)) < 2 * MARGINAL_BOUND
    assert total_variation(joint, exact_joint) < 2 * JOINT_BOUND


def test_a_trained_head_shallower_than_the_tree_is_refused_before_it_is_built(tiny, monkeypatch):
    # The trained entry's num_heads is checked where the drafter names its artefacts, not after the build.
    import specbench.artefacts.trained_head as trained_heads

    monkeypatch.setattr(trained_heads, "build_trained_head", lambda *args, **kwargs: pytest.fail("built"))
    drafter = instantiate(compose(["drafter=hydra", "model=tiny-random",
                                   "+drafter.heads_by_model.tiny-random.trained.num_heads=3"]).drafter)
    for call in (drafter.artefacts, drafter.prepare):
        assert refusal(call, tiny) == ("drafter=hydra: tree mc_sim_7b_63 is 4 deep, but its entry "
                                       "heads_by_model.tiny-random trains 3 heads (trained.num_heads, one per depth); "
                                       "train at least 4")
    drafter = instantiate(compose(["drafter=hydra", "model=tiny-random",
                                   "+drafter.heads_by_model.tiny-random.trained.num_heads=0"]).drafter)
    assert refusal(drafter.artefacts, tiny) == "hydra training num_heads must be an integer >= 1, got 0"
