"""Speculative sampling keeps the target's distribution, for every drafter config.

On a tiny model over a 4-letter alphabet (vocabulary 6 with BOS and EOS), the exact distribution of the
first three sampled tokens is computed by enumeration; 2000 seeded decodes per drafter must match it within
total-variation bounds that sampling noise stays well inside, and that a deliberately biased acceptance
rule exceeds.
"""


import pytest
import torch
from hydra.utils import instantiate

import specbench.decoding.loop as loop_module
from specbench.config import compose, group_options
from specbench.decoding.loop import Decoder
from specbench.decoding.sampling import Sampling, target_distribution
from specbench.testing import SMALL_MODEL_DB


SAMPLES = 2000
LENGTH = 3
SAMPLING = Sampling(temperature=1.0, top_p=1.0, seed=0)
PROMPT = "abcabcabdabcab"
MARGINAL_BOUND = 0.05   # 6 outcomes: sampling noise gives a TV of about 0.02 at 2000 samples
JOINT_BOUND = 0.10      # 36 outcomes: about 0.05


@pytest.fixture(scope="module")
def small():
    return instantiate(compose(["model=tiny-random", "model.alphabet=abcd", "model.initializer_range=0.1"]).model,
                       device="cpu", linear_backend="auto")


def exact_distribution(model, prompt_ids, eos, length):
    """Probability of every token sequence of up to ``length`` tokens (shorter ones end with EOS)."""
    outcomes = {}

    def extend(prefix, probability):
        if len(prefix) == length or (prefix and prefix[-1] == eos):
            outcomes[tuple(prefix)] = outcomes.get(tuple(prefix), 0.0) + probability
            return
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt_ids + prefix])).logits[0, -1:]
        for token, p in enumerate(target_distribution(logits, SAMPLING)[0].tolist()):
            if p > 0:
                extend(prefix + [token], probability * p)

    extend([], 1.0)
    return outcomes


def distributions(outcomes):
    """Per-position marginals and the joint of positions 2 and 3 from {sequence: probability}."""
    marginal = [dict() for _ in range(LENGTH)]
    joint = {}
    for sequence, p in outcomes.items():
        padded = list(sequence) + [-1] * (LENGTH - len(sequence))
        for position, token in enumerate(padded):
            marginal[position][token] = marginal[position].get(token, 0.0) + p
        joint[tuple(padded[1:3])] = joint.get(tuple(padded[1:3]), 0.0) + p
    return marginal, joint


def total_variation(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def sample_sequences(decoder, drafter, prompt_ids):
    counts, drafted = {}, 0
    for seed in range(SAMPLES):
        generation = decoder.generate(prompt_ids, drafter, LENGTH, seed=seed)
        key = tuple(generation.token_ids)
        counts[key] = counts.get(key, 0) + 1
        drafted += sum(step.accepted_tokens > 1 for step in generation.steps)
    return {k: v / SAMPLES for k, v in counts.items()}, drafted


def deviations(small, drafter):
    prompt_ids = small.encode_conversation([PROMPT], [])
    eos = small.tokenizer.eos_token_id
    exact_marginal, exact_joint = distributions(exact_distribution(small.weights.module, prompt_ids, eos, LENGTH))
    decoder = Decoder(small.target, small.eos_token_ids, 64, sampling=SAMPLING)
    empirical, drafted = sample_sequences(decoder, drafter, prompt_ids)
    marginal, joint = distributions(empirical)
    return [total_variation(m, e) for m, e in zip(marginal, exact_marginal)], total_variation(joint, exact_joint), drafted


def make(name, small):
    # HD's model database from a few short answers (conftest.SMALL_MODEL_DB): its configured 96 answers of 1,024
    # tokens cost half a minute here and change which drafts come, not how they are verified.
    overrides = SMALL_MODEL_DB if "model_db_build" in compose([f"drafter={name}"]).drafter else []
    node = compose([f"drafter={name}", "model=tiny-random", *overrides]).drafter
    if node.get("no_match_token") is not None:
        node.no_match_token = 3  # PLD's dummy id 100 is outside this 6-token vocabulary
    drafter = instantiate(node)
    drafter.prepare(small, SAMPLING)
    return drafter


# The default run samples through one drafter of each kind of draft the acceptance rule meets, and the slow run
# through every config (the contract test covers every config greedy in the default run):
#   a draft model's tokens with their probabilities (sps; draft_model, opt-small, qwen-0.5b and wide-pruned are
#   the same DraftModel with, on tiny-random, the same pruned draft), a chain (pld; pld-hd is its setting), a
#   drafter fed the sampled output inside Lookahead's window (hd, the window and its databases; hd-chains and
#   lookahead are its parts), a static tree learning from the target's top-k (recycling; samd and hybrid add
#   SAM's chain to it, samd-automata SAM's chains and corpus trees alone, rest builds one tree per step from its
#   datastore), a state kept across questions (suffix),
#   a trained head's dynamic tree (eagle3; eagle and eagle2 use EAGLE-1's head, medusa's heads a static tree, hydra's static tree of
#   heads, all deterministic drafts), and no draft (ar).
SAME_AS_DRAFT_MODEL = ("draft_model", "opt-small", "qwen-0.5b", "wide-pruned", "hd-chains", "pld-hd", "eagle2",
                       "eagle", "lookahead", "samd", "samd-automata", "hybrid", "rest", "medusa", "hydra")
# Of the kinds above, the default run keeps the four the rule treats differently (a draft model's probabilities,
# a chain, a static tree, a trained head's tree over its own vocabulary); no draft (ar), Lookahead's window (hd)
# and the kept state (suffix), 35 s together, run with -m slow, to keep the default run under 8 minutes.
SLOW_KINDS = ("ar", "hd", "suffix")
# The HD paper's neighbours meet the same two rules (a chain with its probabilities: self-spec from the target's
# skipping passes, hsddw from its middle model, multilingual-draft from its tuned draft model; a deterministic tree:
# swift's chain with siblings, gsd's unfolded graph, longspec's beam tree) and run with -m slow (90 s together on 2
# cores).
NEIGHBOURS = ("self-spec", "hsddw", "multilingual-draft", "swift", "gsd", "longspec")
# Drafters whose drafts the target accepts often on this model: their samples must have gone through accepted
# drafts (more than a tenth of the decodes), or a check of the distribution would only have tested AR.
ACCEPTED_OFTEN = ("pld", "sps", "draft_model")


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SAME_AS_DRAFT_MODEL + SLOW_KINDS + NEIGHBOURS
                                  else name
                                  for name in group_options("drafter")])
def test_sampling_through_every_drafter_keeps_the_target_distribution(name, small):
    marginals, joint, drafted = deviations(small, make(name, small))
    assert max(marginals) < MARGINAL_BOUND, marginals
    assert joint < JOINT_BOUND, joint
    if name in ACCEPTED_OFTEN:
        assert drafted > SAMPLES // 10, drafted


def biased_accepted_path(parents, node_tokens, target_probs, draft_probs, candidates, generator):
    """A wrong rule: accept any draft token the target gives at least 15% probability."""
    path, node = [], 0
    while True:
        children = [c for c in range(1, parents.size) if parents[c] == node]
        chosen = next((c for c in children if float(target_probs[node][int(node_tokens[c])]) >= 0.15), None)
        if chosen is None:
            return path, int(torch.multinomial(target_probs[node], 1, generator=generator))
        path.append(chosen)
        node = chosen


def test_a_biased_acceptance_rule_is_caught(small, monkeypatch):
    monkeypatch.setattr(loop_module, "sampled_accepted_path", biased_accepted_path)
    marginals, joint, drafted = deviations(small, make("pld", small))
    assert drafted > 0
    assert max(marginals) > MARGINAL_BOUND or joint > JOINT_BOUND, (marginals, joint)


def test_top_p_keeps_the_smallest_nucleus():
    probs = target_distribution(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), Sampling(1.0, 0.8))
    assert probs[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    probs = target_distribution(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), Sampling(1.0, 0.3))
    assert probs[0].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
