"""Building the databases that drafters read, with progress bars; used by the scripts and, for
``auto`` paths, on a drafter's first use (results are cached, so that happens once per model).

An ``auto`` database's cache key covers what it is built from by content (corpus files, prompt and question
files: their SHA-256), so an edited file gives a new database; a cached one that fails its load checks is
rebuilt with a warning (``artefacts.load_or_rebuild``), while one given by path stops the run with one line
naming it and the command that rebuilds it."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import specbench
from specbench.artefacts import PlannedArtefact, announce_build, cache_root, cached_path, file_digest, load_or_rebuild
from specbench.datastores.corpus import (
    DEFAULT_CORPUS,
    corpus_bytes,
    corpus_identity,
    iter_documents,
    require_text,
    resolve_corpus,
)
from specbench.datastores.model_db import (
    count_document_ngrams,
    load_model_db,
    save_model_db,
)
from specbench.datastores.sharegpt import SHAREGPT
from specbench.datastores.suffix_array import TokenDatastore
from specbench.errors import SpecbenchError
from specbench.questions import SAMPLE_QUESTIONS, read_questions
from specbench.datastores.prompts import MODEL_DB_PROMPTS, drop_overlapping, model_db_prompts
from specbench.target_answers import planned_answers, target_answers

log = logging.getLogger(__name__)
# Measured on 2 cores: python-docs (11 MB of text, 2.9 M SmolLM2 tokens) tokenizes and sorts into a datastore in
# about 15 s (docs/usage.md).
SECONDS_PER_CORPUS_BYTE = 15.0 / 11e6
# Counting the n-grams of 96 answers (51k tokens) into a model database takes a few seconds.
MODEL_DB_COUNT_S = 5.0


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


def vocab_size(target) -> int:
    """The target's vocabulary as the model sees it (its embedding rows): every token id in a database must be
    below it, or the model fails mid-run."""
    return target.vocab_size


def corpus_cache_key(corpus: str, cache: Path) -> str:
    """The part of an auto database's directory name that stands for ``corpus``: a hash of what its sources
    hold (``corpus_identity``), so that an edited corpus file is never served from its old database."""
    identity = corpus_identity(resolve_corpus(corpus, cache))
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


# What a rebuild command names when a damaged manifest no longer says what the database was built from: a guess
# (the drafter's configured corpus, meant for ``auto``) would rebuild it from something else.
UNKNOWN_SOURCE = "WHAT_IT_WAS_BUILT_FROM"


def recorded_source(directory: str | Path, *keys: str) -> str | None:
    """The string a database's manifest.json holds under ``keys`` (``"corpus", "spec"``: a datastore's corpus),
    for the command that rebuilds it. A manifest cut short or garbled is searched for the last key's entry
    (``"spec": "..."``), since a damaged database is exactly the one whose rebuild command is shown; None when
    the manifest does not say."""
    try:
        text = (Path(directory) / "manifest.json").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    try:
        value = json.loads(text)
        for key in keys:
            value = value[key]
    except Exception:  # not JSON (RecursionError included), or not of this shape: searched as text below
        entry = re.search(rf'"{re.escape(keys[-1])}":\s*("(?:[^"\\]|\\.)*")', text)
        try:
            value = json.loads(entry.group(1)) if entry else None
        except Exception:
            value = None
    return value if isinstance(value, str) else None


def statistics_directory(target, corpus: str, cache_dir: str | None = None) -> Path:
    """Where the cache keeps the statistics datastore of ``corpus`` (by content) for this tokenizer."""
    cache = cache_root(cache_dir)
    return cache / "datastores" / f"{target.tokenizer_fingerprint}-{corpus_cache_key(corpus, cache)}"


def checked_corpus(corpus: str, cache_dir: str | None = None) -> list[str]:
    """The sources of ``corpus``, found and holding text (``corpus.require_text``): what a build checks before it
    starts, so that a missing or empty corpus is one line before minutes of other building."""
    sources = resolve_corpus(corpus, cache_root(cache_dir))
    require_text(corpus, sources)
    return sources


def planned_statistics(target, corpus: str, cache_dir: str | None = None, what: str = "statistics datastore",
                       command: str | None = None) -> PlannedArtefact:
    """The statistics datastore ``statistics_datastore(..., "auto", corpus)`` looks up, as a plan entry."""
    size = corpus_bytes(resolve_corpus(corpus, cache_root(cache_dir)))
    return PlannedArtefact(
        what=f"the {what} of {corpus} for {target.name}",
        directory=statistics_directory(target, corpus, cache_dir),
        seconds=None if size is None else size * SECONDS_PER_CORPUS_BYTE,
        basis=("a hub dataset, whose size is known once downloaded" if size is None else
               f"{size / 1e6:.1f} MB of text at {1e-6 / SECONDS_PER_CORPUS_BYTE:.2f} MB/s, measured on python-docs"),
        command=command or f"python scripts/build_datastore.py --model {target.name} --corpus {shlex.quote(corpus)}")


def statistics_datastore(target, path: str, corpus: str = DEFAULT_CORPUS, cache_dir: str | None = None,
                         command: str | None = None) -> TokenDatastore:
    """The datastore at ``path``, or with ``path="auto"`` the cached one for this tokenizer and the content of
    ``corpus``, built first if missing (its corpus checked first, and the build announced in one line naming
    ``command``, what builds it ahead of time), and rebuilt (with a warning) if damaged."""
    fingerprint, vocab = target.tokenizer_fingerprint, vocab_size(target)
    if path != "auto":
        spec = recorded_source(path, "corpus", "spec")  # not ``corpus``: that is what auto would build from
        command = f"python scripts/build_datastore.py --model {target.name} --corpus {shlex.quote(spec or UNKNOWN_SOURCE)}"
        return TokenDatastore.load(path, fingerprint, vocab, command)
    cache = cache_root(cache_dir)
    directory = statistics_directory(target, corpus, cache_dir)
    rebuild = f"python scripts/build_datastore.py --model {target.name} --corpus {shlex.quote(corpus)}"

    def build() -> None:
        checked_corpus(corpus, cache_dir)
        announce_build(planned_statistics(target, corpus, cache_dir, command=command))
        build_datastore(target, corpus, directory, cache)

    return load_or_rebuild(directory, f"statistics datastore of {corpus} for {target.name}",
                           lambda: TokenDatastore.load(directory, fingerprint, vocab, rebuild), build)


def source_identity(spec: str | None, default: Path | None = None):
    """What a cache key records for a prompt set or question file spec: a local file (``default`` for None) by
    its content and suffix, ``sharegpt:FILE`` by its file's content, anything else (hub ids, the bundled
    ``sharegpt``) by its spec."""
    if spec is None and default is not None:
        spec = str(default)
    if spec is None:
        return None
    file = Path(spec[len(SHAREGPT) + 1:] if spec.startswith(SHAREGPT + ":") else spec).expanduser()
    if spec.startswith("hf:") or spec == SHAREGPT or not file.is_file():
        return spec
    return {"suffix": file.suffix, "sha256": file_digest(file), "sharegpt": spec.startswith(SHAREGPT + ":")}


def model_db_prompt_set(build: dict) -> tuple[list[str], dict]:
    """The prompts a model database is built from, per ``build`` (prompts, exclude_questions, max_prompts):
    the prompt set without the prompts that share a word 8-gram with any evaluation question (the question
    file in use, or the built-in sample), then the first max_prompts; and what was done, for the manifest."""
    prompts = model_db_prompts(build.get("prompts"), source_rows=build.get("source_rows"))
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
    return kept, {"prompts": str(build.get("prompts") or MODEL_DB_PROMPTS), "source_rows": build.get("source_rows"),
                  "prompts_available": len(prompts),
                  "prompts_overlapping_questions": dropped, "exclude_questions": build.get("exclude_questions"),
                  "prompts_used": len(kept)}


def build_model_db(target, directory: Path, build: dict, key_tokens: int, continuation_length: int,
                   cache_dir: str | None = None, command: str | None = None) -> None:
    """Build HD's model database in ``directory``: the target's greedy answers (``build``: max_new_tokens,
    batch_size) to the prompt set (``model_db_prompt_set``), whose n-grams are counted by document frequency
    (max_ngrams kept; include_final_ngram). ``command``: what builds it ahead of time, for the line said before
    the answers are generated."""
    prompts, provenance = model_db_prompt_set(build)
    answers = [answer for _, answer in target_answers(target, prompts, build["max_new_tokens"], build["batch_size"],
                                                      cache_dir, purpose=MODEL_DB_PURPOSE, command=command)]
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


MODEL_DB_PURPOSE = "what HD's model database is counted from"


def model_db_directory(target, key_tokens: int, continuation_length: int, build: dict,
                       cache_dir: str | None = None) -> Path:
    """Where the cache keeps the auto model database of these settings (its prompt and question files by
    content)."""
    settings = {"source": target.source, "key": key_tokens, "continuation": continuation_length, **build,
                "prompts": source_identity(build.get("prompts"), MODEL_DB_PROMPTS),
                "exclude_questions": source_identity(build.get("exclude_questions"), SAMPLE_QUESTIONS)}
    return cached_path(cache_dir, "model_db", target.name, settings)


def planned_model_db(target, key_tokens: int, continuation_length: int, build: dict, cache_dir: str | None = None,
                     command: str | None = None) -> list[PlannedArtefact]:
    """What ``model_db(..., "auto", ...)`` looks up, as plan entries: the answers (unless the database is cached,
    when they are not read) and the database counted from them."""
    directory = model_db_directory(target, key_tokens, continuation_length, build, cache_dir)
    counted = PlannedArtefact(what=f"HD's model database of {target.name} (n-grams of its answers)",
                              directory=directory, seconds=MODEL_DB_COUNT_S,
                              basis="counting n-grams; the answers are their own entry", command=command or
                              f"python scripts/build_model_db.py --model {target.name}")
    if directory.exists():
        return [counted]
    prompts, _ = model_db_prompt_set(build)
    return [planned_answers(target, prompts, build["max_new_tokens"], cache_dir, MODEL_DB_PURPOSE, command), counted]


def model_db(target, path: str, key_tokens: int, continuation_length: int, capacity: int, build: dict,
             cache_dir: str | None = None, least_frequent_first: bool = False, command: str | None = None):
    """The model database at ``path``, or with ``path="auto"`` the cached one for this model and ``build``
    settings (see ``build_model_db``; its prompt set and question files by content), built first if missing
    and rebuilt (with a warning) if damaged. A database serves any continuation length up to the one it was
    built with. ``command``: what builds it ahead of time, named in the line said before a build."""
    def load(directory, command=f"python scripts/build_model_db.py --model {target.name}"):
        return load_model_db(directory, target.tokenizer_fingerprint, key_tokens, continuation_length, capacity,
                             least_frequent_first, vocab_size=vocab_size(target), command=command)

    if path != "auto":
        # The prompt set it was built from (its manifest's), not the drafter's model_db_build.prompts.
        recorded = recorded_source(path, "prompts")
        prompts = "" if recorded == str(MODEL_DB_PROMPTS) else f" --prompts {shlex.quote(recorded or UNKNOWN_SOURCE)}"
        return load(path, f"python scripts/build_model_db.py --model {target.name}{prompts}")
    directory = model_db_directory(target, key_tokens, continuation_length, build, cache_dir)
    return load_or_rebuild(directory, f"model database of {target.name}", lambda: load(directory),
                           lambda: build_model_db(target, directory, build, key_tokens, continuation_length,
                                                  cache_dir, command))
