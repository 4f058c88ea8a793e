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
from specbench.data import read_questions
from specbench.datastores.prompts import MODEL_DB_PROMPTS, drop_overlapping, model_db_prompts
from specbench.target_answers import target_answers

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


def model_db_prompt_set(build: dict) -> tuple[list[str], dict]:
    """The prompts a model database is built from, per ``build`` (prompts, exclude_questions, max_prompts):
    the prompt set without the prompts that share a word 8-gram with any evaluation question (the question
    file in use, or the built-in sample), then the first max_prompts; and what was done, for the manifest."""
    prompts = model_db_prompts(build.get("prompts"))
    questions = [turn for prompt in read_questions(build.get("exclude_questions")) for turn in prompt.turns]
    kept, dropped = drop_overlapping(prompts, questions)
    if dropped:
        log.info("model database prompts: %d of %d share a word 8-gram with the evaluation questions and are left out",
                 dropped, len(prompts))
    if not kept:
        raise SpecbenchError(f"every prompt of {build.get('prompts') or MODEL_DB_PROMPTS} overlaps the evaluation "
                             "questions; give drafter.model_db_build.prompts another prompt set")
    limit = build.get("max_prompts")
    kept = kept[:limit] if limit else kept
    return kept, {"prompts": str(build.get("prompts") or MODEL_DB_PROMPTS), "prompts_available": len(prompts),
                  "prompts_overlapping_questions": dropped, "exclude_questions": build.get("exclude_questions"),
                  "prompts_used": len(kept)}


def build_model_db(target, directory: Path, build: dict, key_tokens: int, continuation_length: int,
                   cache_dir: str | None = None) -> None:
    """Build HD's model database in ``directory``: the target's greedy answers (``build``: max_new_tokens,
    batch_size) to the prompt set (``model_db_prompt_set``), whose n-grams are counted by document frequency
    (max_ngrams kept; include_final_ngram)."""
    prompts, provenance = model_db_prompt_set(build)
    answers = [answer for _, answer in target_answers(target, prompts, build["max_new_tokens"], build["batch_size"],
                                                      cache_dir)]
    tables = count_document_ngrams(answers, key_tokens, continuation_length, build["max_ngrams"],
                                   include_final=build.get("include_final_ngram", True))
    save_model_db(directory, tables, {
        "model": {"name": target.name, "source": target.source},
        "tokenizer": tokenizer_manifest(target),
        **provenance, "answers": len(answers), "answer_tokens": sum(map(len, answers)),
        "max_new_tokens": build["max_new_tokens"], "key_tokens": key_tokens,
        "continuation_length": continuation_length, "counting": "document frequency",
        "include_final_ngram": build.get("include_final_ngram", True), "specbench": specbench.__version__,
    })
    log.info("model database from %d answers (%d tokens) written to %s", len(answers), sum(map(len, answers)), directory)


def model_db(target, path: str, key_tokens: int, continuation_length: int, capacity: int, build: dict,
             cache_dir: str | None = None, least_frequent_first: bool = False):
    """The model database at ``path``, or with ``path="auto"`` the cached one for this model and ``build``
    settings (see ``build_model_db``), built first if missing. A database serves any continuation length up
    to the one it was built with."""
    if path == "auto":
        settings = {"source": target.source, "key": key_tokens, "continuation": continuation_length, **build}
        directory = cached_path(cache_dir, "model_db", target.name, settings)
        if not (directory / "manifest.json").is_file():
            log.info("building the model database for %s (once; cached in %s)", target.name, directory)
            build_model_db(target, directory, build, key_tokens, continuation_length, cache_dir)
        path = str(directory)
    return load_model_db(path, target.tokenizer_fingerprint, key_tokens, continuation_length, capacity,
                         least_frequent_first)
