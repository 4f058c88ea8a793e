"""Medusa's drafting, pinned against a plain re-statement of Medusa-1's: the tree of sibling ranks, each node its
depth's head's ranked token (the heads never see the path), read from the target's state that produced the root;
lossless through the loop at T = 0 and T = 1; the settings the leaderboard ran."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import refusal

from specbench.config import compose
from specbench.decoding.contract import Draft, StepOutcome
from specbench.decoding.loop import Decoder
from specbench.drafters.medusa import CHOICE_TREES, TOP_K, ChoiceTree, Medusa
from specbench.heads.medusa_heads import MedusaConfig, MedusaHeads, save_medusa_heads
from specbench.testing import greedy_reference

# Medusa's tree restated from its source, not from specbench's copy, in the source's order: Spec-Bench
# model/medusa/medusa_choices.py:1 @fd2c1cd (the same list as FasterDecoding/Medusa medusa/model/medusa_choices.py:1).
MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
                [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
                [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
                [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
                [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1],
                [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]
HIDDEN, VOCAB = 8, 40


class ScriptedHeads(torch.nn.Module):
    """logits of head k = state @ W[k]; records the states it read."""

    def __init__(self, heads=4, vocab=VOCAB, seed=0):
        super().__init__()
        self.W = torch.randn(heads, HIDDEN, vocab, generator=torch.Generator().manual_seed(seed))
        self.config = MedusaConfig(heads, 1, HIDDEN, vocab)
        self.read = []

    def forward(self, state):
        self.read.append(state.clone())
        return torch.einsum("h,khv->kv", state, self.W)


def scripted_drafter(heads=None, **settings):
    drafter = Medusa(name="test", head={"path": "unused"}, **settings)
    drafter._install(heads or ScriptedHeads(), num_layers=2, device=torch.device("cpu"))
    return drafter


def token_paths(draft):
    """The draft's token paths from the root, checking that parents precede children."""
    paths = []
    for node, parent in enumerate(draft.parents.tolist()):
        assert parent < node
        paths.append((paths[parent] if parent >= 0 else ()) + (int(draft.token_ids[node]),))
    return paths


def reference_tree(head_logits, rank_paths):
    """Medusa-1: the node at ranks (r1, ..., rd) holds head d-1's rd-th best token, and its path is its ancestors'
    (generate_candidates: tree_indices = rank + TOPK * depth + 1 into the heads' flattened top-10s)."""
    ranked = torch.argsort(head_logits, dim=-1, descending=True, stable=True)
    return {tuple(int(ranked[depth, rank]) for depth, rank in enumerate(path)) for path in rank_paths}


def settle(drafter, step, states, accepted):
    drafter.accept(np.array(accepted), StepOutcome(step=step, draft=Draft.empty(), target_tokens=np.zeros(1, int),
                                                    accepted_nodes=tuple(range(len(accepted) - 1)),
                                                    hidden_states=states))


def test_mc_sim_7b_63_is_the_published_tree_path_by_path():
    assert CHOICE_TREES["mc_sim_7b_63"] == [tuple(path) for path in MC_SIM_7B_63]
    tree = ChoiceTree(CHOICE_TREES["mc_sim_7b_63"])
    assert len(tree) == 63 and tree.depth == 4  # 63 candidates + the root: 64 tokens per verify
    assert [level.size for level in tree.template.levels] == [10, 28, 23, 2]
    assert tree.width == TOP_K == 10  # Medusa's TOPK (Spec-Bench model/medusa/utils.py:3)
    assert tree.paths == sorted(tree.paths, key=lambda path: (len(path), path))  # generate_medusa_buffers' order


def test_each_node_is_its_depths_heads_ranked_token_read_from_the_roots_state():
    heads = ScriptedHeads()
    drafter = scripted_drafter(heads)
    drafter.begin(np.array([1, 2, 3]))
    prompt_states = torch.randn(1, 3, HIDDEN)
    settle(drafter, 0, prompt_states, [9])  # after the prefill: the last prompt position produced the root
    draft = drafter.propose(np.array([1, 2, 3, 9]))
    assert draft.probs is None and len(draft) == 63
    torch.testing.assert_close(heads.read[-1], prompt_states[0, -1])
    logits = torch.einsum("h,khv->kv", prompt_states[0, -1], heads.W)
    assert set(token_paths(draft)) == reference_tree(logits, MC_SIM_7B_63)
    # After a step that settled the root and two accepted nodes, the last of them produced the new root.
    step_states = torch.randn(1, 3, HIDDEN)
    settle(drafter, 1, step_states, [11, 12, 13])
    draft = drafter.propose(np.array([1, 2, 3, 9, 11, 12, 13]))
    torch.testing.assert_close(heads.read[-1], step_states[0, 2])
    logits = torch.einsum("h,khv->kv", step_states[0, 2], heads.W)
    assert set(token_paths(draft)) == reference_tree(logits, MC_SIM_7B_63)


def test_a_vocabulary_smaller_than_the_top_k_keeps_the_ranks_it_has():
    drafter = scripted_drafter(ScriptedHeads(vocab=6))
    drafter.begin(np.array([1]))
    settle(drafter, 0, torch.randn(1, 1, HIDDEN), [2])
    draft = drafter.propose(np.array([1, 2]))
    kept = [path for path in MC_SIM_7B_63 if max(path) < 6]
    assert len(draft) == len(kept) == 44


class OracleHeads(MedusaHeads):
    """Heads that know the greedy answer: head k names the token k + 1 after the root (the loop's context end)."""

    def __init__(self, target, answer, prompt_length):
        super().__init__(MedusaConfig(4, 1, target.weights.hidden_size, target.vocab_size))
        self.answer, self.prompt_length, self.context_length = answer, prompt_length, 0

    def forward(self, state):
        logits = torch.zeros(self.config.num_heads, self.config.vocab_size)
        done = self.context_length - self.prompt_length  # answer tokens committed, the root included
        for k in range(self.config.num_heads):
            if done + k < len(self.answer):
                logits[k, self.answer[done + k]] = 1.0
        return logits


class OracleMedusa(Medusa):
    def propose(self, context_ids):
        self.head.context_length = context_ids.size
        return super().propose(context_ids)


def test_heads_that_are_right_get_every_depth_accepted(tiny, prompt_ids):
    ids = prompt_ids[0]
    expected = greedy_reference(tiny.weights.module, ids, 21)
    drafter = OracleMedusa(name="oracle", head={"path": "unused"})
    drafter._install(OracleHeads(tiny, expected, len(ids)), tiny.num_layers, tiny.device)
    generation = Decoder(tiny.target, frozenset(), max_draft_tokens=64).generate(ids, drafter, 21)
    assert generation.token_ids == expected
    # the prefill settles 1 token, then each step 4 drafted (one per head: depth d is head d-1) and the bonus
    assert [step.accepted_tokens for step in generation.steps] == [1] + [5] * 4


@pytest.fixture(scope="module")
def random_heads_path(tiny, tmp_path_factory):
    """Random Medusa heads for tiny-random in Medusa's format: lossless whatever they draft."""
    directory = tmp_path_factory.mktemp("medusa-heads")
    torch.manual_seed(0)
    save_medusa_heads(MedusaHeads(MedusaConfig(5, 1, tiny.weights.hidden_size, tiny.vocab_size)), directory)
    return str(directory)


def test_lossless_against_greedy_through_the_loop(tiny, prompt_ids, random_heads_path):
    drafter = Medusa(head={"path": random_heads_path})
    drafter.prepare(tiny)
    assert drafter.hidden_state_layers == (tiny.num_layers,) and drafter.head.config.num_heads == 4
    decoder = Decoder(tiny.target, frozenset(), max_draft_tokens=64)
    for ids in prompt_ids:
        generation = decoder.generate(ids, drafter, 24)
        assert generation.token_ids == greedy_reference(tiny.weights.module, ids, 24)
        first = generation.steps[1]  # the whole tree, far from the token budget's cut
        assert (first.draft_depth, first.candidate_tokens) == (4, 63)


def test_a_prepared_head_drafter_shares_its_heads_directory_and_frees_them(tiny, random_heads_path):
    """The drafter contract's word to another engine (vLLM): where the same heads load from, and their release."""
    from specbench.decoding.contract import SharedWeights

    drafter = Medusa(head={"path": random_heads_path})
    assert drafter.shared_weights() is None  # not prepared: nothing loaded yet
    drafter.prepare(tiny)
    assert drafter.shared_weights() == SharedWeights("head", random_heads_path)
    assert drafter.draft_weights_fingerprint() is None  # a head, not a draft model: run.json records none
    drafter.release_weights()
    assert drafter.head is None


@pytest.mark.slow  # 2000 seeded decodes, 90 s on 2 cores; test_sampling.py samples eagle3's deterministic tree by default
def test_lossless_at_temperature_one(tmp_path):
    """The sampled output keeps the target's distribution (test_sampling's enumeration and bounds): the draft is
    deterministic at T = 1 too, and specbench's tree verifier, not Medusa's typical acceptance, decides."""
    from hydra.utils import instantiate
    from test_sampling import JOINT_BOUND, MARGINAL_BOUND, SAMPLING, deviations

    small = instantiate(compose(["model=tiny-random", "model.alphabet=abcd", "model.initializer_range=0.1"]).model,
                        device="cpu", linear_backend="auto")
    torch.manual_seed(0)
    save_medusa_heads(MedusaHeads(MedusaConfig(4, 1, small.weights.hidden_size, small.vocab_size)), tmp_path)
    drafter = Medusa(head={"path": str(tmp_path)})
    drafter.prepare(small, SAMPLING)
    drafter.begin(np.array([1]))
    settle(drafter, 0, torch.randn(1, 1, small.weights.hidden_size), [2])
    assert drafter.propose(np.array([1, 2])).probs is None
    marginals, joint, drafted = deviations(small, drafter)
    assert max(marginals) < MARGINAL_BOUND, marginals
    assert joint < JOINT_BOUND, joint
    assert drafted > 0  # some samples went through accepted drafts


def test_the_leaderboards_settings_are_the_configs():
    medusa = compose(["drafter=medusa"]).drafter
    # Spec-Bench evaluation/inference_medusa.py:173-177 (--medusa-choices mc_sim_7b_63), :200 (num_heads = 4)
    assert (medusa.tree, medusa.heads) == ("mc_sim_7b_63", 4)
    # eval.sh:4, 18: Medusa_PATH=medusa-vicuna-7b-v1.3 with Vicuna_PATH=vicuna-7b-v1.3
    assert medusa.heads_by_model["vicuna-7b"] == {"hub_id": "FasterDecoding/medusa-vicuna-7b-v1.3"}
    assert medusa.heads_by_model["vicuna-13b"] == {"hub_id": "FasterDecoding/medusa-vicuna-13b-v1.3"}
    assert medusa.heads_by_model["vicuna-33b"] == {"hub_id": "FasterDecoding/medusa-vicuna-33b-v1.3"}
    assert medusa.heads_by_model["tiny-random"] == {"trained": {"train_steps": 0}}
    assert medusa.heads_by_model["smollm2-135m"] == {"trained": {}}
    assert set(medusa) == {"_target_", "name", "tree", "heads", "head", "heads_by_model", "cache_dir"}  # no
    # posterior_threshold / posterior_alpha: typical acceptance is lossy and not run under this name


def test_bad_settings_and_unknown_targets_are_one_line_errors(tiny, random_heads_path):
    assert "drafter.tree='mc_sim_7b_64' is not known; choose one of: mc_sim_7b_63" in refusal(
        Medusa, tree="mc_sim_7b_64")
    assert "4 deep and needs 4 heads; drafter.heads=3" in refusal(Medusa, heads=3)
    assert "drafter.heads must be a positive integer" in refusal(Medusa, heads=0)
    text = refusal(Medusa(heads_by_model={"vicuna-7b": {"hub_id": "x"}}).prepare, tiny)
    assert "knows no Medusa heads for model tiny-random (it knows vicuna-7b)" in text
    assert "holds 5 heads; drafter.heads=6" in refusal(Medusa(heads=6, head={"path": random_heads_path}).prepare,
                                                        tiny)
    assert "prepare(target) must run" in refusal(Medusa().begin, np.array([1]))


def test_heads_trained_fewer_than_the_drafter_reads_are_refused_before_they_are_built(tiny, monkeypatch, capsys):
    # heads_by_model's {trained: {heads: 0}} once published an empty head, which a run then refused with a hint
    # rebuilding the same thing: a recipe's count is checked where the drafter names its artefacts (the run and
    # prepare's plan alike), and one that trains fewer heads than the drafter reads too, before any build.
    import specbench.artefacts.trained_head as trained_heads
    from specbench import prepare

    monkeypatch.setattr(trained_heads, "build_trained_head", lambda *args, **kwargs: pytest.fail("built"))
    for heads, message in ((0, "medusa training heads must be an integer >= 1, got 0"),
                           (2, "drafter=medusa reads 4 Medusa heads (drafter.heads); its entry "
                               "heads_by_model.tiny-random trains 2 (trained.heads): train at least 4")):
        drafter = Medusa(heads_by_model={"tiny-random": {"trained": {"train_steps": 0, "heads": heads}}})
        assert refusal(drafter.artefacts, tiny).startswith(message)
        assert refusal(drafter.prepare, tiny).startswith(message)
    assert refusal(Medusa(heads_by_model={"tiny-random": {"trained": {"layers": 0}}}).artefacts, tiny) == (
        "medusa training layers must be an integer >= 1, got 0")
    # prepare's plan: one line, exit 2, nothing planned
    with pytest.raises(SystemExit) as status:
        prepare.main(["--model", "tiny-random", "--drafters", "medusa", "--dry-run",
                      "+drafter.heads_by_model.tiny-random.trained.heads=0"])
    out, err = capsys.readouterr()
    assert status.value.code == 2 and "what the runs" not in out
    assert err.strip().splitlines() == ["prepare: error: medusa training heads must be an integer >= 1, got 0"]
