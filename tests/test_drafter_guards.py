"""The drafters' guards that no other test reached: each case here fails when its guard is removed (checked by
removing it). Guards whose removal changes nothing need no case: REST's early return on an empty suffix-array
range and its cut skipped for an empty tree (rest.py retrieved_tree) give what the general code gives anyway."""

import numpy as np
from test_samd import propose, samd
from test_window_drafters import make_hd

from specbench.datastores.suffix_array import TokenDatastore
from specbench.drafters.hd import generated_ngrams, statistics_candidates
from specbench.drafters.recycling import recycle
from specbench.drafters.suffix import TokenSequences, match_ends, speculate


def test_recycling_learns_from_fewer_top_k_columns_than_its_matrix_has():
    # A vocabulary smaller than top_k gives the target's top-k fewer columns than the matrix: those columns are
    # written, the rest of each row keeps what it held (recycle's k = min(...)).
    successors = np.full((5, 8), 9, dtype=np.int64)
    recycle(successors, np.array([1, 2]), np.array([[4, 3, 2, 1, 0], [0, 1, 2, 3, 4]]))
    assert successors[1].tolist() == [4, 3, 2, 1, 0, 9, 9, 9]
    assert successors[2].tolist() == [0, 1, 2, 3, 4, 9, 9, 9]
    assert successors[[0, 3, 4]].tolist() == [[9] * 8] * 3


def test_hd_searches_no_longer_key_than_the_context_holds():
    # A one-token context with key_tokens=2: one search, with that token. Searching "2 tokens" would query the
    # same single token but read its continuations from 2 positions on, a token too late: (2, 3) beside (1, 2, 3).
    store = TokenDatastore.build([[7, 1, 2, 3]], {})
    assert statistics_candidates(store, np.array([7]), key_tokens=2, draft_length=4, limit=7, choices=64,
                                 max_matches=5000, continuation_length=10) == [(1, 2, 3)]


def test_hd_adds_no_ngram_that_would_start_before_the_context():
    # Three tokens, n-grams of 3 ending 1 and 2 tokens before the end: both would start before the first token,
    # and slicing from a negative index would add empty n-grams instead.
    assert generated_ngrams(np.array([1, 2, 3]), 3, 3) == []
    assert generated_ngrams(np.array([1, 2, 3, 4]), 3, 3) == [(1, 2, 3)]


def test_samd_with_an_auxiliary_drafts_from_the_context_when_the_matches_tie():
    # SB model/samd/draft.py:57-62 @fd2c1cd: the corpus match less len_bias against the context's, the context on a tie
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5]  # the context matches its last 5 tokens earlier on
    tie = propose(samd(corpus_documents=[context[-10:] + [50, 51, 52]]), context)  # corpus 10 - 5 = 5
    assert set(tie.sources) == {"context"} and tie.token_ids.tolist()[:7] == [6, 7, 8, 1, 2, 3, 4]
    longer = propose(samd(corpus_documents=[context[-11:] + [50, 51, 52]]), context)  # corpus 11 - 5 = 6
    assert set(longer.sources) == {"corpus"} and longer.token_ids.tolist()[:3] == [50, 51, 52]


def test_suffix_speculation_on_an_empty_pattern_drafts_nothing():
    # speculate reads the pattern's last token: an empty pattern (nothing to match) is an empty draft, not an
    # IndexError; a one-token pattern has no match length below its own either.
    sequences = TokenSequences.of([np.array([1, 2, 3, 1, 2, 3])])
    for pattern in ([], [3]):
        draft = speculate(sequences, np.array(pattern, dtype=np.int64), max_depth=24, max_spec_tokens=24,
                          max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1)
        assert draft.token_ids == [] and draft.score == 0


def test_a_suffix_match_never_wraps_around_the_buffers_start():
    # [7 3 8 7]: "7 7" does not occur, though the 7 at position 0 has the buffer's last token, 7, "before" it
    # when the position one back is read from a negative index. Only the 1-token match drafts (3, half the time).
    sequences = TokenSequences.of([np.array([7, 3, 8, 7])])
    assert match_ends(sequences, np.array([7, 7]), 2).tolist() == []
    draft = speculate(sequences, np.array([7, 7]), max_depth=24, max_spec_tokens=24, max_spec_factor=1.0,
                      max_spec_offset=0.0, min_token_prob=0.1)
    assert (draft.token_ids, draft.match_len, draft.score) == ([3], 1, 0.5)


def test_hd_asks_no_later_database_once_it_has_num_candidates():
    # HD model/hierachy/decoding.py:127-152: after each database, 7 (num_candidates) or more candidates end the
    # search. The draft alone cannot show it (the list is cut to num_candidates anyway), but a database asked
    # does work, and the statistics one draws pad tokens from HD's random stream.
    prompt = np.array([9, 5, 6, 9, 7, 8, 9])
    drafter = make_hd(["model", "context"])  # the model database gives 3 = num_candidates
    asked = []
    lookup = drafter.lookup
    drafter.lookup = lambda database, context_ids, limit: asked.append(database) or lookup(database, context_ids,
                                                                                           limit)
    drafter.begin(prompt)
    drafter.propose(prompt)
    assert asked == ["model"]
