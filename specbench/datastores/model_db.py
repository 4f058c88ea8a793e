"""HD's model database: n-grams that the target model itself tends to generate.

Built once per model from its greedy answers to a prompt set that is disjoint from the evaluation
questions (``scripts/build_model_db.py``): every n-gram is counted once per answer it occurs in (document
frequency), and each key keeps its most frequent continuations. On disk:

    manifest.json   tokenizer fingerprint, model, prompt set, key_tokens, continuation_length, counts
    ngrams.npz      per key length k: ngrams_k [m, k + continuation_length] int32 and counts_k [m] int64
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from specbench.datastores.ngram_pool import RankedNGrams
from specbench.datastores.storage import replace_directory
from specbench.errors import SpecbenchError

FORMAT_VERSION = 1


def count_document_ngrams(documents, key_tokens: int, continuation_length: int, max_ngrams: int,
                          include_final: bool = True) -> dict:
    """{k: (ngrams [m, k + continuation_length], counts [m])} for k = 1..key_tokens: the ``max_ngrams``
    n-grams of each length that occur in the most documents (ties: first seen first).
    ``include_final=False`` skips each document's last n-gram, as HD's construct_model_DB.py does
    (``range(0, len(tokens) - LEVEL)``)."""
    tables = {}
    for key_length in range(1, key_tokens + 1):
        size = key_length + continuation_length
        frequency: Counter = Counter()
        for document in documents:
            values = list(document)
            last = len(values) - size + (1 if include_final else 0)
            frequency.update(list(dict.fromkeys(tuple(values[i : i + size]) for i in range(last))))
        common = frequency.most_common(max_ngrams)
        ngrams = np.array([ngram for ngram, _ in common], dtype=np.int32).reshape(len(common), size)
        counts = np.array([count for _, count in common], dtype=np.int64)
        tables[key_length] = (ngrams, counts)
    return tables


def merge_truncated(ngrams: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum the counts of rows that became equal (after the caller cut them to fewer columns)."""
    if ngrams.shape[0] == 0:
        return ngrams, counts
    unique, inverse = np.unique(ngrams, axis=0, return_inverse=True)
    return unique, np.bincount(inverse.ravel(), weights=counts).astype(np.int64)


def save_model_db(directory: str | Path, tables: dict, manifest: dict) -> None:
    arrays = {}
    for key_length, (ngrams, counts) in tables.items():
        arrays[f"ngrams_{key_length}"] = ngrams
        arrays[f"counts_{key_length}"] = counts
    manifest = {**manifest, "format_version": FORMAT_VERSION,
                "ngrams": {str(k): len(c) for k, (_, c) in tables.items()}}
    replace_directory(directory, lambda staging: np.savez(staging / "ngrams.npz", **arrays), manifest)


def load_model_db(directory: str | Path, tokenizer_fingerprint: str, key_tokens: int, continuation_length: int,
                  capacity: int, least_frequent_first: bool = False) -> RankedNGrams:
    """The model database for lookups with keys of up to ``key_tokens`` tokens and continuations of (at most)
    ``continuation_length`` tokens, checked against the target's tokenizer. A database built with longer
    continuations serves shorter ones (truncated, counts merged); one built with shorter continuations
    serves them as they are. Each key keeps its ``capacity`` most frequent continuations, listed most
    frequent first, or least frequent first (HD's code inserts them in ascending frequency into lists that
    keep the last ``capacity``)."""
    directory = Path(directory)
    rebuild = "build one with scripts/build_model_db.py"
    manifest_file = directory / "manifest.json"
    if not manifest_file.is_file():
        raise SpecbenchError(f"{directory}: no model database here (manifest.json missing); {rebuild}")
    try:
        manifest = json.loads(manifest_file.read_text())
        arrays = np.load(directory / "ngrams.npz")
    except (OSError, ValueError) as error:
        raise SpecbenchError(f"{directory}: damaged model database ({error}); {rebuild}") from None
    if manifest.get("key_tokens", 0) < key_tokens:
        raise SpecbenchError(f"{directory} holds keys of up to {manifest.get('key_tokens')} tokens; the drafter "
                             f"uses {key_tokens}: {rebuild}")
    try:
        tables = {k: (arrays[f"ngrams_{k}"], arrays[f"counts_{k}"]) for k in range(1, key_tokens + 1)}
    except (KeyError, ValueError) as error:
        raise SpecbenchError(f"{directory}: damaged model database ({error}); {rebuild}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SpecbenchError(f"{directory}: model database format {manifest.get('format_version')}; {rebuild}")
    if manifest.get("tokenizer", {}).get("fingerprint") != tokenizer_fingerprint:
        raise SpecbenchError(f"{directory} was built for another tokenizer than the target's; {rebuild} for this model")
    table: dict = {}
    for key_length in range(key_tokens, 0, -1):
        ngrams, counts = tables[key_length]
        ngrams, counts = merge_truncated(ngrams[:, : key_length + continuation_length], counts)
        RankedNGrams.from_counts(ngrams, counts, key_length, capacity, table)
    if least_frequent_first:
        table = {key: entries[::-1] for key, entries in table.items()}
    return RankedNGrams(table, key_tokens)
