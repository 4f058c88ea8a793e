"""Building the databases that drafters read, with progress bars; used by the scripts and, for
``auto`` paths, on a drafter's first use (results are cached, so that happens once per model)."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import specbench
from specbench.datastores.corpus import DEFAULT_CORPUS, iter_documents, resolve_corpus
from specbench.datastores.model_db import (
    count_document_ngrams,
    load_model_db,
    save_model_db,
)
from specbench.datastores.suffix_array import TokenDatastore
from specbench.errors import SpecbenchError
from specbench.models import cache_root, cached_path
from specbench.target_answers import MODEL_DB_PROMPTS, target_answers

log = logging.getLogger(__name__)


def tokenizer_manifest(target) -> dict:
    name = getattr(target.tokenizer, "name_or_path", None) or type(target.tokenizer).__name__
    return {"name": f"{target.name} ({name})", "fingerprint": target.tokenizer_fingerprint}


def build_datastore(target, corpus: str, directory: Path, cache: Path) -> TokenDatastore:
    """Tokenize ``corpus`` with the target's tokenizer and save a suffix-array datastore in ``directory``."""
    sources = resolve_corpus(corpus, cache)
    documents = []
    characters = 0
    for text in tqdm(iter_documents(sources), desc=f"tokenizing {corpus}", unit="doc"):
        documents.append(np.asarray(target.tokenizer.encode(text, add_special_tokens=False), dtype=np.int32))
        characters += len(text)
    if not sum(document.size for document in documents):
        raise SpecbenchError(
            f"corpus {corpus} ({', '.join(sources)}) holds no text: nothing to build a datastore from; "
            "give scripts/build_datastore.py --corpus (or drafter.corpus) files with text"
        )
    started = time.perf_counter()
    datastore = TokenDatastore.build(documents, {
        "corpus": {"spec": corpus, "sources": sources, "characters": characters},
        "tokenizer": tokenizer_manifest(target),
        "specbench": specbench.__version__,
    })
    datastore.save(directory)
    log.info("datastore of %d tokens from %d documents written to %s (suffix array in %.1f s)",
             datastore.manifest["tokens"], datastore.manifest["documents"], directory, time.perf_counter() - started)
    return datastore


def statistics_datastore(target, path: str, corpus: str = DEFAULT_CORPUS, cache_dir: str | None = None) -> TokenDatastore:
    """The datastore at ``path``, or with ``path="auto"`` the cached one for this tokenizer and ``corpus``,
    built first if missing."""
    if path != "auto":
        return TokenDatastore.load(path, target.tokenizer_fingerprint)
    cache = cache_root(cache_dir)
    corpus_key = hashlib.sha1(corpus.encode()).hexdigest()[:8]
    directory = cache / "datastores" / f"{target.tokenizer_fingerprint}-{corpus_key}"
    if not (directory / "manifest.json").is_file():
        log.info("building the statistics datastore for %s from %s (once; cached in %s)", target.name, corpus, directory)
        build_datastore(target, corpus, directory, cache)
    return TokenDatastore.load(directory, target.tokenizer_fingerprint)


def build_model_db(target, directory: Path, prompts_file: str | None, key_tokens: int, continuation_length: int,
                   max_new_tokens: int, batch_size: int, max_ngrams: int, cache_dir: str | None = None) -> None:
    prompts_path = Path(prompts_file) if prompts_file else MODEL_DB_PROMPTS
    answers = [answer for _, answer in target_answers(target, prompts_file, max_new_tokens, batch_size, cache_dir)]
    tables = count_document_ngrams(answers, key_tokens, continuation_length, max_ngrams)
    save_model_db(directory, tables, {
        "model": {"name": target.name, "source": target.source},
        "tokenizer": tokenizer_manifest(target),
        "prompts": str(prompts_path), "answers": len(answers), "answer_tokens": sum(map(len, answers)),
        "max_new_tokens": max_new_tokens, "key_tokens": key_tokens, "continuation_length": continuation_length,
        "counting": "document frequency", "specbench": specbench.__version__,
    })
    log.info("model database from %d answers written to %s", len(answers), directory)


def model_db(target, path: str, key_tokens: int, continuation_length: int, capacity: int, build: dict,
             cache_dir: str | None = None):
    """The model database at ``path``, or with ``path="auto"`` the cached one for this model and settings,
    built first if missing (``build``: prompts, continuation_length, max_new_tokens, batch_size, max_ngrams).
    A database serves any continuation length up to the one it was built with."""
    if path == "auto":
        directory = cached_path(cache_dir, "model_db", target.name, {"source": target.source, "key": key_tokens, **build})
        if not (directory / "manifest.json").is_file():
            log.info("building the model database for %s (once; cached in %s)", target.name, directory)
            build_model_db(target, directory, build.get("prompts"), key_tokens, build["continuation_length"],
                           build["max_new_tokens"], build["batch_size"], build["max_ngrams"], cache_dir)
        path = str(directory)
    return load_model_db(path, target.tokenizer_fingerprint, key_tokens, continuation_length, capacity)
