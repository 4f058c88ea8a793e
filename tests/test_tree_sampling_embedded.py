"""Medusa's and Hydra's trees at temperature 1 on the embedded model (SmolLM2-135M, its 49,152-token vocabulary, the
63-node mc_sim_7b_63 tree), one decoding step at a time, where test_sampling.py enumerates a 6-token toy model:

1. every node's distribution from the tree's one verification pass is the one a plain forward of that node's path
   gives (the tree's attention and positions are right at this size);
2. the tokens a step emits, sampled 5,000 times through the loop's acceptance rule over that pass, follow the
   target's own distribution (Pearson's chi-squared over every outcome of probability >= 1/800 and the rest);
3. the same check rejects a biased rule (accept any draft token the target gives at least 0.15), so it can fail.

Each drafter's heads are the published initialisation (Medusa's copies the target's lm_head into every head, so its
drafts are plausible tokens; Hydra's are mostly not). Which tokens a deterministic draft holds does not change
whether the rule is lossless; test_sampling.py runs both drafters through whole decodes on the toy model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

import specbench.decoding.loop as loop_module
from specbench.config import compose
from specbench.decoding.loop import Decoder
from specbench.decoding.sampling import Sampling, sampled_accepted_path, target_distribution
from specbench.training.heads import recipe_of

pytestmark = pytest.mark.slow  # the embedded model, and 10,000 draws of the rule over its vocabulary

SAMPLING = Sampling(temperature=1.0, top_p=1.0, seed=0)
PROMPT = "Count from 1 to 30, separated by commas."
DRAWS = 5_000
FLOOR = 6.25 / DRAWS  # outcomes expected at least 6.25 times get their own bin
STEPS = 8  # decoding steps recorded; the check uses the one where a biased rule would show most (bias_exposure)
SIGNIFICANCE = 1e-4  # a lossless rule fails once in 10,000 seeds; its draws are seeded, so the result is fixed


@pytest.fixture(scope="module")
def embedded():
    return instantiate(compose(["model=smollm2-135m"]).model, device="cpu")


def medusa_drafter(model, directory):
    from specbench.drafters.medusa import Medusa
    from specbench.heads.medusa_heads import save_medusa_heads
    from specbench.training import medusa

    save_medusa_heads(medusa.new_head(model, "medusa", recipe_of("medusa", {"train_steps": 0}), None), directory)
    return Medusa(head={"path": str(directory)})


def hydra_drafter(model, directory):
    from specbench.drafters.hydra import Hydra
    from specbench.heads.hydra_heads import save_hydra_head
    from specbench.training import hydra

    save_hydra_head(hydra.new_head(model, "hydra", recipe_of("hydra", {"train_steps": 0}), None), directory)
    return Hydra(head={"path": str(directory)})


def recorded_steps(model, drafter, monkeypatch):
    """(context ending at the root, parents, node tokens, target probabilities, candidates) of each step's tree, as
    the loop handed them to its acceptance rule."""
    steps = []

    def recording(parents, node_tokens, target_probs, draft_probs, candidates, generator):
        assert draft_probs is None  # a deterministic draft at T = 1 too
        result = sampled_accepted_path(parents, node_tokens, target_probs, draft_probs, candidates, generator)
        steps.append((parents.copy(), node_tokens.copy(), target_probs.clone(), candidates, result))
        return result

    monkeypatch.setattr(loop_module, "sampled_accepted_path", recording)
    drafter.prepare(model, SAMPLING)
    prompt = model.encode_conversation([PROMPT], [])
    generation = Decoder(model.target, model.eos_token_ids, 64, sampling=SAMPLING).generate(prompt, drafter, 24)
    monkeypatch.undo()
    emitted, context, trees = generation.token_ids, list(prompt), []
    context.append(emitted[0])  # the prefill's token: the first tree's root
    for parents, node_tokens, target_probs, candidates, (path, final) in steps[:STEPS]:
        assert int(node_tokens[0]) == context[-1]
        trees.append((list(context), parents, node_tokens, target_probs, candidates))
        context += [int(node_tokens[node]) for node in path] + [final]
    assert context[len(prompt):] == emitted[:len(context) - len(prompt)]
    return trees


def node_paths(parents, node_tokens):
    paths = [()]
    for node in range(1, parents.size):
        paths.append(paths[int(parents[node])] + (int(node_tokens[node]),))
    return paths


def bias_exposure(tree):
    """How far the biased rule below would move this step's first token: 1 - p for the root's likeliest draft child
    whose target probability p is at least 0.15 (it is then always accepted where a lossless rule accepts it with
    probability p), 0 when no child is that likely."""
    _, parents, node_tokens, target_probs, _ = tree
    likely = [float(target_probs[0][int(node_tokens[node])]) for node in range(1, parents.size) if parents[node] == 0]
    return max((1 - p for p in likely if p >= 0.15), default=0.0)


def exact_outcomes(parents, node_tokens, target_probs, candidates, floor):
    """{emitted tokens: probability} of every outcome of a step of probability >= floor under lossless sampling:
    the first token from the root's distribution, and while it is a (candidate) child's token, the next from that
    child's."""
    children = {}
    for node in range(1, parents.size):
        if candidates is None or candidates[node]:
            children.setdefault(int(parents[node]), {})[int(node_tokens[node])] = node
    outcomes = {}

    def walk(node, prefix, mass):
        probs = target_probs[node].double() * mass
        for token in torch.nonzero(probs >= floor).flatten().tolist():
            if token in children.get(node, {}):
                walk(children[node][token], prefix + (token,), float(probs[token]))
            else:
                outcomes[prefix + (token,)] = float(probs[token])

    walk(0, (), 1.0)
    return outcomes


def sampled_outcomes(rule, parents, node_tokens, target_probs, candidates):
    counts = {}
    generator = torch.Generator().manual_seed(0)
    for _ in range(DRAWS):
        path, final = rule(parents, node_tokens, target_probs, None, candidates, generator)
        key = tuple(int(node_tokens[node]) for node in path) + (final,)
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_squared_p(counts, exact):
    observed = [counts.get(key, 0) for key in exact]
    expected = [DRAWS * p for p in exact.values()]
    rest = DRAWS * (1 - sum(exact.values()))
    if rest >= 5:
        observed.append(DRAWS - sum(observed))
        expected.append(rest)
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return chi_squared_survival(statistic, len(observed) - 1)


def chi_squared_survival(statistic, degrees):
    """P(X >= statistic) for X chi-squared with ``degrees`` degrees of freedom: the regularized upper incomplete
    gamma function Q(degrees / 2, statistic / 2), from torch, since the test extra has no scipy."""
    half = torch.tensor([degrees / 2, statistic / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(half[0], half[1]))


def biased_rule(parents, node_tokens, target_probs, draft_probs, candidates, generator):
    """A wrong rule: accept the first child the target gives at least 0.15, else draw from the target."""
    path, node = [], 0
    while True:
        children = [c for c in range(1, parents.size) if parents[c] == node and (candidates is None or candidates[c])]
        chosen = next((c for c in children if float(target_probs[node][int(node_tokens[c])]) >= 0.15), None)
        if chosen is None:
            return path, int(torch.multinomial(target_probs[node], 1, generator=generator))
        path.append(chosen)
        node = chosen


@pytest.mark.parametrize("make", [medusa_drafter, hydra_drafter], ids=["medusa", "hydra"])
def test_a_tree_step_samples_the_targets_distribution_on_the_embedded_model(embedded, make, tmp_path, monkeypatch):
    trees = recorded_steps(embedded, make(embedded, tmp_path), monkeypatch)
    assert trees and all(tree[1].size == 64 for tree in trees)  # the root and mc_sim_7b_63's 63 nodes
    context, parents, node_tokens, target_probs, candidates = max(trees, key=bias_exposure)

    # 1. the verification pass's distributions are the plain forwards' of each node's path
    paths = node_paths(parents, node_tokens)
    with torch.no_grad():
        for node in range(parents.size):
            ids = torch.tensor([context + list(paths[node])])
            plain = target_distribution(embedded.weights.module(input_ids=ids).logits[0, -1:], SAMPLING)[0]
            assert torch.allclose(target_probs[node], plain, atol=1e-4), (node, paths[node])

    # 2. the loop's rule keeps the target's distribution over what a step emits
    exact = exact_outcomes(parents, node_tokens, target_probs, candidates, FLOOR)
    assert sum(exact.values()) > 0.5, sum(exact.values())  # the bins cover most of the mass
    honest = sampled_outcomes(sampled_accepted_path, parents, node_tokens, target_probs, candidates)
    assert chi_squared_p(honest, exact) > SIGNIFICANCE

    # 3. and the same check catches a biased rule on a step where it would move the first token by a tenth or more
    exposure = bias_exposure((context, parents, node_tokens, target_probs, candidates))
    if make is medusa_drafter:  # its initial heads draft the target's own likely tokens, so such a step comes
        assert exposure >= 0.1, exposure
    if exposure > 0:  # a root child the target gives >= 0.15: some of the draws went through accepted drafts
        assert any(len(outcome) > 1 for outcome in honest)
    if exposure >= 0.1:
        biased = sampled_outcomes(biased_rule, parents, node_tokens, target_probs, candidates)
        assert chi_squared_p(biased, exact) < SIGNIFICANCE
