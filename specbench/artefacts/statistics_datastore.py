"""The statistics datastore of a corpus (REST's datastore, HD's statistics database, what SAM's corpus automaton is
built from): the corpus tokenized with the target's tokenizer and sorted into a suffix array, built once per
tokenizer and corpus content.

An ``auto`` datastore's cache key covers what it is built from by content (its corpus files' SHA-256), so an edited
corpus gives a new datastore; a cached one that fails its load checks is rebuilt with a warning, while one given by
path stops the run with one line naming it and the command that rebuilds it."""

from __future__ import annotations

import dataclasses
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
from specbench.artefacts.base import Artefact, announce_build
from specbench.datastores.corpus import (
    DEFAULT_CORPUS,
    corpus_bytes,
    corpus_identity,
    iter_documents,
    require_text,
    resolve_corpus,
)
from specbench.datastores.suffix_array import TokenDatastore
from specbench.errors import SpecbenchError
from specbench.storage.cache import cache_root

log = logging.getLogger(__name__)
# Measured on 2 cores: python-docs (11 MB of text, 2.9 M SmolLM2 tokens) tokenizes and sorts into a datastore in
# about 15 s (docs/usage.md).
SECONDS_PER_CORPUS_BYTE = 15.0 / 11e6


def tokenizer_name(tokenizer) -> str:
    """How a datastore's manifest names a tokenizer: its hub id or path, else its class."""
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def tokenizer_manifest(target) -> dict:
    return {"name": f"{target.name} ({tokenizer_name(target.tokenizer)})", "fingerprint": target.tokenizer_fingerprint}


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


def corpus_estimate(corpus: str, cache_dir: str | None, seconds_per_byte: float, rate_digits: int
                    ) -> tuple[float | None, str]:
    """(seconds, basis) of a build that reads all of ``corpus`` at ``seconds_per_byte`` (measured on python-docs);
    a hub dataset's size is unknown until it is downloaded."""
    size = corpus_bytes(resolve_corpus(corpus, cache_root(cache_dir)))
    if size is None:
        return None, "a hub dataset, whose size is known once downloaded"
    return (size * seconds_per_byte,
            f"{size / 1e6:.1f} MB of text at {1e-6 / seconds_per_byte:.{rate_digits}f} MB/s, measured on python-docs")


class StatisticsDatastore(Artefact):
    """The cached statistics datastore of ``corpus`` (by content) for the target's tokenizer, built on first use
    (its corpus checked first, and the build announced in one line naming ``command``, what builds it ahead of
    time). ``what`` names it in the plan: "statistics datastore" (HD's) or "datastore" (REST's)."""

    def __init__(self, target, corpus: str = DEFAULT_CORPUS, cache_dir: str | None = None,
                 what: str = "statistics datastore", command: str | None = None):
        self.target, self.corpus, self.cache_dir, self.kind = target, corpus, cache_dir, what
        self.directory = statistics_directory(target, corpus, cache_dir)
        self.command = command or self.rebuild_command()

    @property
    def what(self) -> str:
        return f"the {self.kind} of {self.corpus} for {self.target.name}"

    @property
    def label(self) -> str:
        return f"statistics datastore of {self.corpus} for {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        return corpus_estimate(self.corpus, self.cache_dir, SECONDS_PER_CORPUS_BYTE, rate_digits=2)

    def rebuild_command(self) -> str:
        return f"python scripts/build_datastore.py --model {self.target.name} --corpus {shlex.quote(self.corpus)}"

    def check(self) -> None:
        checked_corpus(self.corpus, self.cache_dir)

    def announce(self) -> str:
        # The line before a build names it as built, whichever drafter's plan calls it otherwise (REST's "datastore").
        return announce_build(dataclasses.replace(self.plan(), what=f"the statistics datastore of {self.corpus} for "
                                                                     f"{self.target.name}"))

    def build(self) -> None:
        self.check()
        self.announce()
        build_datastore(self.target, self.corpus, self.directory, cache_root(self.cache_dir))

    def load(self) -> TokenDatastore:
        return TokenDatastore.load(self.directory, self.target.tokenizer_fingerprint, vocab_size(self.target),
                                   self.rebuild_command())


def statistics_datastore(target, path: str, corpus: str = DEFAULT_CORPUS, cache_dir: str | None = None,
                         command: str | None = None) -> TokenDatastore:
    """The datastore at ``path``, or with ``path="auto"`` the cached ``StatisticsDatastore`` of ``corpus``, built
    first if missing and rebuilt (with a warning) if damaged."""
    if path != "auto":
        return given_datastore(target, path)
    return StatisticsDatastore(target, corpus, cache_dir, command=command).get()


def given_datastore(target, path: str) -> TokenDatastore:
    """The datastore the user gave at ``path``: refused in one line, naming the command that rebuilds it from
    what its manifest says it was built from, when it is damaged."""
    spec = recorded_source(path, "corpus", "spec")  # not the drafter's corpus: that is what auto would build from
    command = f"python scripts/build_datastore.py --model {target.name} --corpus {shlex.quote(spec or UNKNOWN_SOURCE)}"
    return TokenDatastore.load(path, target.tokenizer_fingerprint, vocab_size(target), command)
