"""HD's model database: n-grams that the target model itself tends to generate.

Built once per model from its greedy answers to a prompt set that is disjoint from the evaluation
questions (``scripts/build_model_db.py``): every n-gram is counted once per answer it occurs in (document
frequency), and each key keeps its most frequent continuations. On disk:

    manifest.json   tokenizer fingerprint, model, prompt set, key_tokens, continuation_length, counts, and
                    each file's size, modification time and SHA-256 (checked on load: storage.manifest.verify_files)
    ngrams.npz      per key length k: ngrams_k [m, k + continuation_length] int32 and counts_k [m] int64
"""

from __future__ import annotations

import shlex
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.datastores.ngram_pool import RankedNGrams
from specbench.datastores.prompts import MODEL_DB_PROMPTS
from specbench.datastores.suffix_array import out_of_vocabulary
from specbench.errors import SpecbenchError, damage_reason

FORMAT_VERSION = 1
BUILD_COMMAND = "python scripts/build_model_db.py --model MODEL"


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
        arrays[f"ngrams_{key_length}"] = np.asarray(ngrams, dtype=np.int32)
        arrays[f"counts_{key_length}"] = np.asarray(counts, dtype=np.int64)
    manifest = {**manifest, "format_version": FORMAT_VERSION,
                "ngrams": {str(k): len(c) for k, (_, c) in tables.items()}}
    replace_directory(directory, lambda staging: np.savez(staging / "ngrams.npz", **arrays), manifest)


def load_model_db(directory: str | Path, tokenizer_fingerprint: str, key_tokens: int, continuation_length: int,
                  capacity: int, least_frequent_first: bool = False, *, vocab_size: int | None = None,
                  command: str = BUILD_COMMAND) -> RankedNGrams:
    """The model database for lookups with keys of up to ``key_tokens`` tokens and continuations of (at most)
    ``continuation_length`` tokens, checked against the target's tokenizer. A database built with longer
    continuations serves shorter ones (truncated, counts merged); one built with shorter continuations
    serves them as they are. Each key keeps its ``capacity`` most frequent continuations, listed most
    frequent first, or least frequent first (HD's code inserts them in ascending frequency into lists that
    keep the last ``capacity``).

    It must be whole (``verify_files``; each table of the size and dtype the manifest says) and, given
    ``vocab_size`` (the target's embedding rows), hold token ids 0..vocab_size-1 only. ``command``
    (scripts/build_model_db.py without ``--out``) is what the errors suggest to rebuild it."""
    directory = Path(directory)
    rebuild = f"rebuild it with `{command} --out {shlex.quote(str(directory))}`"
    manifest = read_manifest(directory, "model database", rebuild)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SpecbenchError(f"{directory}: model database format {manifest.get('format_version')}; {rebuild}")
    tokenizer = manifest.get("tokenizer") if isinstance(manifest.get("tokenizer"), dict) else {}
    if tokenizer.get("fingerprint") != tokenizer_fingerprint:
        raise SpecbenchError(f"{directory} was built for another tokenizer than the target's; build one for this "
                             f"model with `{command} --out NEW_DIR`")
    built_keys = manifest.get("key_tokens", 0)
    if not isinstance(built_keys, int) or built_keys < key_tokens:
        raise SpecbenchError(f"{directory} holds keys of up to {built_keys} tokens; the drafter "
                             f"uses {key_tokens}: {rebuild}")
    problem = verify_files(directory, manifest)
    if problem:
        raise SpecbenchError(f"{directory}: damaged model database ({problem}); {rebuild}")
    built_continuation = manifest.get("continuation_length")
    sizes = manifest.get("ngrams") if isinstance(manifest.get("ngrams"), dict) else {}
    tables = {}
    try:
        with np.load(directory / "ngrams.npz") as arrays:
            for k in range(1, key_tokens + 1):
                ngrams, counts = arrays[f"ngrams_{k}"], arrays[f"counts_{k}"]
                width = k + built_continuation if isinstance(built_continuation, int) else ngrams.shape[-1]
                rows = sizes.get(str(k), ngrams.shape[0])
                if (ngrams.dtype != np.int32 or counts.dtype != np.int64 or ngrams.shape != (rows, width)
                        or counts.shape != (rows,)):
                    raise ValueError(f"ngrams_{k} {ngrams.dtype}{list(ngrams.shape)}, counts_{k} "
                                     f"{counts.dtype}{list(counts.shape)}; manifest.json: {rows} rows of {width}")
                tables[k] = (ngrams, counts)
    except Exception as error:  # numpy and zipfile raise OSError, ValueError, KeyError, BadZipFile, zlib.error, ...
        raise SpecbenchError(f"{directory}: damaged model database ({damage_reason(error)}); {rebuild}") from None
    for k, (ngrams, _) in tables.items():
        bad = out_of_vocabulary(ngrams, 0, vocab_size)
        if bad is not None:
            raise SpecbenchError(f"{directory}: token id {bad} in ngrams_{k} is outside the target's vocabulary "
                                 f"(ids 0..{(vocab_size or 0) - 1}); {rebuild}")
    table: dict = {}
    for key_length in range(key_tokens, 0, -1):
        ngrams, counts = tables[key_length]
        ngrams, counts = merge_truncated(ngrams[:, : key_length + continuation_length], counts)
        RankedNGrams.from_counts(ngrams, counts, key_length, capacity, table)
    if least_frequent_first:
        table = {key: entries[::-1] for key, entries in table.items()}
    return RankedNGrams(table, key_tokens, source=describe_source(manifest))


# The manifest's account of where a model database's prompts came from (model_db_prompt_set writes it).
SOURCE_KEYS = ("prompts", "source_rows", "prompts_available", "prompts_overlapping_questions", "prompts_used",
               "answers", "answer_tokens", "max_new_tokens")


def describe_source(manifest: dict) -> dict:
    """Which prompts a model database was built from, in plain words (``prompt_set``) and figures, for the run's
    record: the built-in set is specbench's, not HD's."""
    source = {key: manifest[key] for key in SOURCE_KEYS if key in manifest}
    prompts = str(manifest.get("prompts", "?"))
    if prompts == str(MODEL_DB_PROMPTS):
        source["prompt_set"] = "specbench's built-in prompts (specbench/data/model_db_prompts.jsonl), not HD's OASST1"
    elif prompts.startswith("hf:OpenAssistant/oasst1"):
        rows = manifest.get("source_rows")
        source["prompt_set"] = ("OASST1's English messages, every role (HD's source" +
                                (f"; its first {rows} rows)" if rows else "; every row)"))
    else:
        source["prompt_set"] = prompts
    return source
