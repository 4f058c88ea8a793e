import numpy as np
import pytest

from specbench.drafters.pld import PromptLookup, prompt_lookup
from specbench.errors import SpecbenchError


def lookup(tokens, max_ngram=3, min_ngram=1, num_draft=10, prefer="earliest", full=False):
    return prompt_lookup(np.array(tokens, dtype=np.int64), max_ngram, min_ngram, num_draft, prefer, full)[0].tolist()


def spec_bench_lookup(tokens, max_ngram, num_draft):
    """Spec-Bench's rule (model/pld/pld.py @fd2c1cd, lines 22-47), restated as a plain loop: n from max down
    to 1, occurrences in ascending order, the first whose whole continuation fits and starts before the final
    n-gram."""
    length = len(tokens)
    for n in range(max_ngram, 0, -1):
        final = tokens[length - n:]
        for index in range(length - n + 1):
            if tokens[index:index + n] == final:
                start, end = index + n, index + n + num_draft
                if end <= length and start < length - n:
                    return tokens[start:end]
    return []


def test_the_default_rule_is_spec_benchs_on_random_contexts():
    rng = np.random.default_rng(0)
    for trial in range(3000):
        tokens = rng.integers(0, 4, size=int(rng.integers(2, 40))).tolist()
        max_ngram, num_draft = int(rng.integers(1, 4)), int(rng.choice([2, 4, 10]))
        expected = spec_bench_lookup(tokens, max_ngram, num_draft)
        assert lookup(tokens, max_ngram=max_ngram, num_draft=num_draft, full=True) == expected, (tokens, max_ngram, num_draft)


def test_an_occurrence_without_a_full_continuation_falls_back_to_a_shorter_ngram_not_a_later_occurrence():
    # [1 2] occurs at 1 (followed by 7, 1, 2: three tokens, not four) and [2] at 2 (same); nothing usable
    assert lookup([5, 1, 2, 7, 1, 2], max_ngram=2, num_draft=4, full=True) == []
    assert lookup([5, 1, 2, 7, 1, 2], max_ngram=2, num_draft=4) == [7, 1, 2]  # transformers' rule: cut short
    # [3 1 2] occurs at 3 with 7 tokens after it; [1 2] occurs at 0 with 11 after it
    context = [1, 2, 5, 3, 1, 2, 6, 6, 6, 6, 3, 1, 2]
    assert lookup(context, num_draft=7, full=True) == [6, 6, 6, 6, 3, 1, 2]
    assert lookup(context, num_draft=8, full=True) == [5, 3, 1, 2, 6, 6, 6, 6]  # a 2-gram match
    assert lookup(context, num_draft=8) == [6, 6, 6, 6, 3, 1, 2]  # transformers' rule keeps the 3-gram, cut short


def test_no_match_verifies_spec_benchs_dummy_token_unless_disabled():
    draft = PromptLookup().propose(np.array([4, 5, 6, 7]))
    assert draft.token_ids.tolist() == [100] and draft.sources == ("no-match",)
    assert len(PromptLookup(no_match_token=None).propose(np.array([4, 5, 6, 7]))) == 0
    with pytest.raises(SpecbenchError, match="drafter.no_match_token"):
        PromptLookup(no_match_token=-1)


def test_pld_and_pld_hd_configs_carry_the_published_settings():
    from specbench.config import compose

    pld = compose(["drafter=pld"]).drafter
    assert (pld.max_ngram_size, pld.min_ngram_size, pld.num_draft_tokens, pld.prefer, pld.full_continuation,
            pld.no_match_token) == (3, 1, 10, "earliest", True, 100)
    hd_baseline = compose(["drafter=pld-hd"]).drafter
    assert (hd_baseline.name, hd_baseline.max_ngram_size, hd_baseline.num_draft_tokens) == ("pld-hd", 2, 4)


def test_the_matched_ngram_size_is_reported_and_labels_the_draft():
    context = np.array([3, 4, 0, 0, 0, 2, 3, 8, 2, 3])
    assert prompt_lookup(context, 3, 1, 2)[1] == 2
    assert prompt_lookup(np.array([4, 5, 6]), 3, 1, 2)[1] == 0
    draft = PromptLookup(max_ngram_size=2, full_continuation=False).propose(context)
    assert draft.sources == ("2-gram",) * 3 and draft.token_ids.tolist() == [8, 2, 3]


def test_earliest_and_latest_occurrence():
    context = [5, 1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    assert lookup(context, num_draft=4) == [9, 1, 2, 3]
    assert lookup(context, num_draft=4, prefer="latest") == [7, 1, 2, 3]


def test_longer_ngram_wins_over_earlier_shorter_match():
    # [3] alone occurs at 0 (followed by 4); [2 3] occurs at 5 (followed by 8)
    context = [3, 4, 0, 0, 0, 2, 3, 8, 2, 3]
    assert lookup(context, max_ngram=2, num_draft=1) == [8]
    assert lookup(context, max_ngram=1, num_draft=1) == [4]


def test_final_ngram_never_matches_itself():
    assert lookup([4, 5, 6, 7]) == []
    # the only other occurrence of [6 7] is the suffix; the 1-gram [7] occurs nowhere else either
    assert lookup([6, 7, 6, 7], max_ngram=2, num_draft=3) == [6, 7]


def test_continuation_stops_at_end_of_context():
    assert lookup([1, 2, 9, 1, 2], max_ngram=2, num_draft=10) == [9, 1, 2]


def test_min_ngram_size_excludes_short_matches():
    context = [7, 8, 1, 2, 7]
    assert lookup(context, max_ngram=3, min_ngram=1) == [8, 1, 2, 7]
    assert lookup(context, max_ngram=3, min_ngram=2) == []


def test_short_contexts():
    assert lookup([]) == []
    assert lookup([3]) == []
    assert lookup([3, 3], num_draft=5) == [3]


@pytest.mark.parametrize("kwargs", [
    {"max_ngram_size": 0}, {"num_draft_tokens": -1}, {"min_ngram_size": 4, "max_ngram_size": 3},
    {"prefer": "middle"},
])
def test_bad_settings_are_rejected_with_the_key_name(kwargs):
    with pytest.raises(SpecbenchError, match="drafter\\."):
        PromptLookup(**kwargs)


def test_pld_drafts_and_gets_tokens_accepted_on_repetitive_output(tiny, prompt_ids):
    from specbench.decoding.loop import Decoder

    decoder = Decoder(tiny.target, frozenset(), max_draft_tokens=64)
    steps = [s for ids in prompt_ids for s in decoder.generate(ids, PromptLookup(), 64).steps]
    assert any(s.draft_tokens > 0 for s in steps)
    assert any(s.accepted_tokens > 1 for s in steps)
