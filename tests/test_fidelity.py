"""The published methods' settings and the rules that docs/fidelity.md traces to the original code: each test
fails when specbench's config or algorithm drifts from what the original ran."""

import numpy as np
import pytest

from specbench.config import compose
from specbench.datastores.suffix_array import TokenDatastore
from specbench.decoding.loop import Decoder
from specbench.drafters.draft_model import DraftModel
from specbench.drafters.rest import RetrievalDrafter, cut_to_choices, frequent_prefix_trie
from specbench.testing import greedy_reference

PUBLISHED = {  # config -> {key: value as the original ran it}, written out from the sources (commits: fidelity.md)
    # SB evaluation/inference_pld.py:22-24 (window 3, 10 tokens), model/pld/pld.py:22 (down to 1), :33-43, :93-94
    "pld": {"max_ngram_size": 3, "min_ngram_size": 1, "num_draft_tokens": 10, "prefer": "earliest",
            "full_continuation": True, "no_match_token": 100},
    # HD evaluation/inference_pld.py:19-28 (window 2, 4 tokens), HD model/pld/pld.py:15-47, 95-96
    "pld-hd": {"max_ngram_size": 2, "min_ngram_size": 1, "num_draft_tokens": 4, "full_continuation": True,
               "no_match_token": 100},
    # SB eval.sh:22 (--level 5 --window 7 --guess 7), model/lade/decoding.py:204, 212-213 (random.seed(10))
    "lookahead": {"ngram_size": 5, "window_size": 7, "guess_set_size": 7, "pool_from_prompt": False,
                  "pool_from_output": False, "merge_guesses": False, "accept_full_guess": False, "seed": 10},
    # SB evaluation/inference_rest.py:168-173, 206 (spans 16..2), :22 (num_draft=64); DraftRetriever lib.rs:285-303
    "rest": {"max_suffix_length": 16, "min_suffix_length": 2, "continuation_length": 10, "max_matches": 5000,
             "match_sampling": "first", "num_draft": 64, "cut_to_choices": True, "no_match_token": 100},
    # HD run_vicuna.sh:12, 25 (order WSL, 2 previous tokens), model/hierachy/decoding.py:54-73, 105-152, 714
    "hd": {"order": ["context", "model", "statistics"], "draft_length": 4, "num_candidates": 7, "per_key_capacity": 7,
           "context_from_prompt": True, "context_from_output": "code", "model_db_least_frequent_first": True,
           "statistics_key_tokens": 2, "statistics_choices": 64, "statistics_max_matches": 5000,
           "statistics_continuation_length": 10, "statistics_pad": True, "merge_candidates": False,
           "lookahead_branch": True, "window_size": 7, "fill_step_ngrams": True},
    "hd-chains": {"lookahead_branch": False, "merge_candidates": False, "num_candidates": 7},
    # transformers 4.37.1 generation/configuration_utils.py:320-321 (5 tokens, heuristic schedule)
    "sps": {"gamma": 5, "adaptive_gamma": True, "max_gamma": None},
    # SB evaluation/inference_recycling.py:19, 203-212, 232 (template 2.2.2, top-8, one matrix for the run)
    "recycling": {"template": "2.2.2", "top_k": 8, "hot_start": True, "learn_from_prompt": False,
                  "update_on_eos": False},
    # SB eval.sh:28 (--samd_n_predicts 40 --samd_len_threshold 5 --samd_len_bias 5), model/samd/samd_config.py:11-14
    "samd": {"n_predicts": 40, "len_threshold": 5, "len_bias": 5, "alpha": 4.0, "auxiliary": "recycling"},
    # SB evaluation/inference_eagle.py:178-182 (mc_sim_7b_63); inference_eagle2.py / inference_eagle3.py:65-82
    "eagle": {"kind": "eagle", "tree": "static", "static_tree": "mc_sim_7b_63"},
    "eagle2": {"kind": "eagle", "tree": "dynamic", "total_tokens": 60, "depth": 5, "top_k": 10},
    "eagle3": {"kind": "eagle3", "tree": "dynamic", "total_tokens": 60, "depth": 5, "top_k": 10},
    # SB evaluation/inference_medusa.py:172-177 (--medusa-choices mc_sim_7b_63), :200 (num_heads = 4)
    "medusa": {"tree": "mc_sim_7b_63", "heads": 4},
    # vLLM vllm/config/speculative.py @f19b16d (suffix_decoding_* defaults), arctic-inference 0.1.1 cache.py
    "suffix": {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_tokens": None, "max_spec_factor": 1.0,
               "max_spec_offset": 0.0, "min_token_prob": 0.1, "tree_spec": False},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_config_named_after_a_published_method_carries_its_settings(name):
    node = compose([f"drafter={name}"]).drafter
    assert node.name == name
    for key, value in PUBLISHED[name].items():
        assert node[key] == value, f"drafter={name}: {key}={node[key]!r}, the original ran {value!r}"


def test_hd_model_database_is_built_with_hds_length_count_and_final_ngram_rule():
    build = compose(["drafter=hd"]).drafter.model_db_build
    assert (build.max_new_tokens, build.max_ngrams, build.include_final_ngram) == (1024, 100000, False)


def test_tuning_is_off_by_default():
    run = compose([]).run
    assert (run.draft_budget, run.verify_padding) == ("off", "off")


def test_rest_cut_to_choices_drops_the_heaviest_paths_until_the_summed_distinct_tokens_fit():
    # a chain 1 -> 2 -> 3 (weights 1, 2, 3) and a leaf 4 (weight 1): total 7
    tokens, parents, counts = np.array([1, 4, 2, 3]), np.array([-1, -1, 0, 2]), np.array([3, 1, 2, 1])
    assert cut_to_choices(tokens, parents, counts, 7).tolist() == [0, 1, 2, 3]
    assert cut_to_choices(tokens, parents, counts, 4).tolist() == [0, 1, 2]  # 7 - 3 = 4
    assert cut_to_choices(tokens, parents, counts, 3).tolist() == [0, 1]  # 7 - 3 - 2 = 2
    # a repeated token weighs once: [5 5 5] weighs 1 at every depth, so the cut takes the leaf 6 (weight 2) first
    tokens, parents, counts = np.array([5, 5, 5, 6]), np.array([-1, 0, 1, 0]), np.array([4, 3, 3, 1])
    assert cut_to_choices(tokens, parents, counts, 3).tolist() == [0, 1, 2]


def test_rest_reads_the_first_matches_in_suffix_array_order_and_verifies_a_dummy_when_nothing_matches():
    # after [7 8]: continuations 1 (x1), 2 (x3), 9 (x1); with max_matches=2 REST reads only the first two rows
    # in suffix-array order, [1] and [2], so 9 never shows
    documents = [[7, 8, 1], [7, 8, 2], [7, 8, 2], [7, 8, 2], [7, 8, 9]]
    drafter = RetrievalDrafter(max_matches=2, num_draft=64)
    drafter.datastore = TokenDatastore.build(documents, {})
    assert sorted(drafter.propose(np.array([0, 7, 8])).token_ids.tolist()) == [1, 2]
    drafter.match_sampling = "even"
    assert sorted(drafter.propose(np.array([0, 7, 8])).token_ids.tolist()) == [1, 9]
    assert drafter.propose(np.array([0, 5, 6])).token_ids.tolist() == [100]
    drafter.no_match_token = None
    assert len(drafter.propose(np.array([0, 5, 6]))) == 0


def test_rest_tree_is_the_most_frequent_prefixes_then_cut():
    rows = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 4], [5, 6, 7]])
    tokens, parents, counts = frequent_prefix_trie(rows, 64)
    assert tokens.tolist() == [1, 5, 2, 6, 3, 4, 7] and counts.tolist() == [3, 1, 3, 1, 2, 1, 1]
    keep = cut_to_choices(tokens, parents, counts, 8)  # weights 1 1 2 2 3 3 3 = 15: drop 7 (3), 4 (3), 3 (3)
    assert tokens[keep].tolist() == [1, 5, 2, 6]


def test_sps_follows_transformers_schedule_and_restarts_every_turn(tiny, prompt_ids):
    # an exact copy of the target as draft: every draft is accepted, so the draft grows 5, 7, 9, ...
    copy = {"tiny-random": {"pruned": {"layers": 2, "selection": "first", "distill_tokens": 0, "corpus": "python-docs"}}}
    drafter = DraftModel(name="sps", drafts_by_family=copy, gamma=5, adaptive_gamma=True, max_gamma=None)
    drafter.prepare(tiny)
    decoder = Decoder(tiny.target, frozenset(), 64)
    for ids in prompt_ids[:2]:  # two turns: the schedule restarts at 5 each time
        generation = decoder.generate(ids, drafter, 60)
        assert generation.token_ids == greedy_reference(tiny.weights.module, ids, 60)
        assert [step.draft_tokens for step in generation.steps[1:4]] == [5, 7, 9]


def test_sps_shrinks_by_one_after_a_miss_down_to_one(tiny, prompt_ids):
    # a one-layer draft misses almost always: 5, 4, 3, 2, 1, 1, ... (+2 whenever a draft is fully accepted)
    shallow = {"tiny-random": {"pruned": {"layers": 1, "selection": "first", "distill_tokens": 0, "corpus": "python-docs"}}}
    drafter = DraftModel(name="sps", drafts_by_family=shallow, gamma=5, adaptive_gamma=True, max_gamma=None)
    drafter.prepare(tiny)
    generation = Decoder(tiny.target, frozenset(), 64).generate(prompt_ids[0], drafter, 40)
    drafts = [step.draft_tokens for step in generation.steps[1:]]
    accepted = [step.accepted_tokens - 1 for step in generation.steps[1:]]
    assert drafts[0] == 5
    assert any(hits < size for size, hits in zip(drafts, accepted)) and 1 in drafts[:-3]
    steps = list(zip(drafts, accepted, drafts[1:]))
    for size, hits, following in steps[:-3]:  # the last steps' drafts are cut to the tokens still wanted
        assert following == (size + 2 if hits == size else max(1, size - 1))


def test_every_test_docs_fidelity_names_exists():
    """docs/fidelity.md says which test pins each setting; a renamed or deleted test would leave it lying."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent
    named = set(re.findall(r"\b(test_\w+)\b", (root.parent / "docs" / "fidelity.md").read_text()))
    defined = {name for file in root.glob("test_*.py") for name in re.findall(r"^def (test_\w+)", file.read_text(), re.M)}
    files = {file.stem for file in root.glob("test_*.py")}
    assert named - defined - files == set()
