import numpy as np
import pytest

from specbench.drafters.pld import PromptLookup, prompt_lookup
from specbench.errors import SpecbenchError


def lookup(tokens, max_ngram=3, min_ngram=1, num_draft=10, prefer="earliest"):
    return prompt_lookup(np.array(tokens, dtype=np.int64), max_ngram, min_ngram, num_draft, prefer)[0].tolist()


def test_the_matched_ngram_size_is_reported_and_labels_the_draft():
    context = np.array([3, 4, 0, 0, 0, 2, 3, 8, 2, 3])
    assert prompt_lookup(context, 3, 1, 2)[1] == 2
    assert prompt_lookup(np.array([4, 5, 6]), 3, 1, 2)[1] == 0
    draft = PromptLookup(max_ngram_size=2).propose(context)
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

    decoder = Decoder(tiny.model, frozenset(), max_draft_tokens=64)
    steps = [s for ids in prompt_ids for s in decoder.generate(ids, PromptLookup(), 64).steps]
    assert any(s.draft_tokens > 0 for s in steps)
    assert any(s.accepted_tokens > 1 for s in steps)
