
import numpy as np
import pytest

from specbench.datastores.model_db import (
    count_document_ngrams,
    load_model_db,
    save_model_db,
)
from specbench.datastores.ngram_pool import NGramPool, RankedNGrams
from specbench.datastores.suffix_array import SEPARATOR, TokenDatastore
from specbench.drafters.rest import frequent_prefix_trie
from specbench.errors import SpecbenchError

DOCS = [[1, 2, 3, 4, 5], [9, 2, 3, 4, 6], [2, 3, 7], [8, 1, 2]]


@pytest.fixture
def store():
    return TokenDatastore.build(DOCS, {"tokenizer": {"fingerprint": "fp", "name": "test"}})


def test_find_returns_every_occurrence(store):
    lo, hi = store.find(np.array([2, 3]))
    assert hi - lo == 3
    starts = sorted(store.suffixes[lo:hi].tolist())
    assert [store.tokens[s : s + 2].tolist() for s in starts] == [[2, 3]] * 3
    assert store.find(np.array([3, 2])) == store.find(np.array([3, 2]))  # empty range
    lo, hi = store.find(np.array([3, 2]))
    assert lo == hi


def test_matches_never_cross_documents(store):
    lo, hi = store.find(np.array([5, 9]))  # end of document 1 + start of document 2
    assert lo == hi
    assert store.manifest["documents"] == 4 and store.manifest["tokens"] == 16 + 4  # one separator each


def test_longest_suffix_wins(store):
    # [.., 9, 2, 3] occurs once as a 3-gram; its shorter suffix [2, 3] occurs three times
    assert store.longest_suffix_match(np.array([0, 9, 2, 3]), max_length=16, min_length=2)[0] == 3
    length, lo, hi = store.longest_suffix_match(np.array([0, 0, 2, 3]), max_length=16, min_length=2)
    assert (length, hi - lo) == (2, 3)
    assert store.longest_suffix_match(np.array([0, 0, 0, 3]), max_length=16, min_length=2)[0] == 0
    assert store.longest_suffix_match(np.array([9, 2, 3]), max_length=2, min_length=2)[0] == 2


def test_continuations_stop_at_document_end_and_come_in_suffix_array_order(store):
    lo, hi = store.find(np.array([2, 3]))
    matrix = store.continuation_matrix(lo, hi, 2, 3, max_matches=100)
    assert sorted(matrix.tolist()) == [[4, 5, SEPARATOR], [4, 6, SEPARATOR], [7, SEPARATOR, SEPARATOR]]
    # more matches than max_matches: the first ones in suffix-array order (REST), or thinned evenly
    assert store.continuation_matrix(lo, hi, 2, 3, max_matches=2, sample="first").tolist() == sorted(matrix.tolist())[:2]


def test_frequent_prefix_trie_example_from_the_docstring():
    rows = np.array([[1, 2], [1, 2], [1, 3], [4, 5]])
    tokens, parents, counts = frequent_prefix_trie(rows, 3)
    assert tokens.tolist() == [1, 4, 2] and parents.tolist() == [-1, -1, 0] and counts.tolist() == [3, 1, 2]
    tokens, parents, _ = frequent_prefix_trie(rows, 10)
    assert tokens.tolist() == [1, 4, 2, 3, 5] and parents.tolist() == [-1, -1, 0, 0, 1]


def test_frequent_prefix_trie_skips_ended_rows():
    rows = np.array([[1, SEPARATOR], [1, 2], [3, SEPARATOR]])
    tokens, parents, _ = frequent_prefix_trie(rows, 10)
    assert tokens.tolist() == [1, 3, 2] and parents.tolist() == [-1, -1, 0]


def test_save_load_and_the_errors_that_name_the_file(store, tmp_path):
    store.save(tmp_path / "ds")
    loaded = TokenDatastore.load(tmp_path / "ds", "fp")
    assert loaded.find(np.array([2, 3]))[1] - loaded.find(np.array([2, 3]))[0] == 3
    with pytest.raises(SpecbenchError, match="another tokenizer.*build_datastore.py"):
        TokenDatastore.load(tmp_path / "ds", "other")
    with pytest.raises(SpecbenchError, match="no datastore here.*build_datastore.py"):
        TokenDatastore.load(tmp_path / "nothing", "fp")
    (tmp_path / "ds" / "suffixes.npy").write_bytes(b"garbage")
    with pytest.raises(SpecbenchError, match="damaged datastore"):
        TokenDatastore.load(tmp_path / "ds", "fp")
    with pytest.raises(SpecbenchError, match="holds no text"):
        TokenDatastore.build([[], []], {})


def test_pool_evicts_the_least_recently_added_continuation():
    pool = NGramPool(key_tokens=1, continuation_length=1, capacity=2)
    pool.add((5,), (1,))
    pool.add((5,), (2,))
    pool.add((5,), (1,))  # refreshed: now the most recent
    pool.add((5,), (3,))  # evicts (2,), the least recently added
    assert pool.lookup(np.array([5]), 10) == [(3,), (1,)]


def test_pool_tries_longer_keys_first_and_deduplicates():
    pool = NGramPool(key_tokens=2, continuation_length=2, capacity=7)
    pool.add_sequence(np.array([7, 8, 9, 10, 4, 8, 9, 11]))
    assert pool.lookup(np.array([4, 8]), 10) == [(9, 11), (9, 10)]
    assert pool.lookup(np.array([7, 8]), 10) == [(9, 10), (9, 11)]
    assert pool.lookup(np.array([7, 8]), 1) == [(9, 10)]
    assert pool.lookup(np.array([42]), 10) == []


def test_incremental_pool_updates_equal_one_pass():
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3, 5])
    whole, parts = NGramPool(2, 2, 7), NGramPool(2, 2, 7)
    whole.add_sequence(tokens)
    parts.add_sequence(tokens[:4])
    parts.add_sequence(tokens, first_end=4)
    assert {k: list(v) for k, v in whole.table.items()} == {k: list(v) for k, v in parts.table.items()}


def test_model_db_counts_documents_not_occurrences(tmp_path):
    documents = [[1, 2, 1, 2, 1, 2], [1, 2, 3], [5, 1, 3]]
    tables = count_document_ngrams(documents, key_tokens=1, continuation_length=1, max_ngrams=10)
    ngrams, counts = tables[1]
    frequency = {tuple(row): int(c) for row, c in zip(ngrams.tolist(), counts)}
    assert frequency[(1, 2)] == 2  # three times in the first answer, once in the second: two documents
    assert frequency[(1, 3)] == 1 and frequency[(2, 1)] == 1
    save_model_db(tmp_path / "db", tables, {"tokenizer": {"fingerprint": "fp"}, "key_tokens": 1,
                                            "continuation_length": 1})
    db = load_model_db(tmp_path / "db", "fp", key_tokens=1, continuation_length=1, capacity=7)
    assert db.lookup(np.array([9, 1]), 10) == [(2,), (3,)]
    with pytest.raises(SpecbenchError, match="another tokenizer"):
        load_model_db(tmp_path / "db", "other", 1, 1, 7)
    with pytest.raises(SpecbenchError, match="keys of up to 1 tokens"):
        load_model_db(tmp_path / "db", "fp", 2, 1, 7)


def test_model_db_serves_shorter_continuations_with_merged_counts(tmp_path):
    documents = [[1, 2, 3], [1, 2, 4], [1, 2, 4], [1, 5, 6]]
    tables = count_document_ngrams(documents, key_tokens=1, continuation_length=2, max_ngrams=10)
    save_model_db(tmp_path / "db", tables, {"tokenizer": {"fingerprint": "fp"}, "key_tokens": 1,
                                            "continuation_length": 2})
    assert load_model_db(tmp_path / "db", "fp", 1, 2, 7).lookup(np.array([1]), 10) == [(2, 4), (2, 3), (5, 6)]
    assert load_model_db(tmp_path / "db", "fp", 1, 1, 7).lookup(np.array([1]), 10) == [(2,), (5,)]
    assert load_model_db(tmp_path / "db", "fp", 1, 3, 7).lookup(np.array([1]), 10) == [(2, 4), (2, 3), (5, 6)]


def test_ranked_ngrams_keep_the_best_per_key():
    table = RankedNGrams.from_counts(np.array([[1, 5], [1, 6], [1, 7]]), np.array([1, 9, 5]), 1, capacity=2)
    assert table == {(1,): [(6,), (7,)]}
