"""SAM-Decoding's static suffix automaton of a corpus, built once per tokenizer, vocabulary, EOS and corpus content
from the corpus's statistics datastore (the same tokens REST searches)."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import numpy as np

from specbench.artefacts.base import Artefact
from specbench.artefacts.statistics_datastore import (
    StatisticsDatastore,
    checked_corpus,
    corpus_cache_key,
    corpus_estimate,
    statistics_datastore,
    vocab_size,
)
from specbench.datastores.suffix_array import SEPARATOR
from specbench.datastores.suffix_automaton import StaticSuffixAutomaton
from specbench.storage.cache import cache_root

log = logging.getLogger(__name__)


# Measured on 2 cores: python-docs' automaton (2.9 M tokens, from 11 MB of text) builds in 2.0 s, ShareGPT's (21.9 M
# tokens) in 15.3 s (docs/usage.md), beside the datastore it is built from.
SECONDS_PER_CORPUS_BYTE = 2.0 / 11e6


def corpus_automaton_directory(target, corpus: str, cache_dir: str | None = None) -> Path:
    """Where the cache keeps the static automaton of ``corpus`` (by content) for this tokenizer, vocabulary and
    EOS."""
    cache = cache_root(cache_dir)
    key = hashlib.sha256(f"{corpus_cache_key(corpus, cache)} {vocab_size(target)} {_eos_token(target)}".encode()
                         ).hexdigest()[:16]
    return cache / "sam" / f"{target.tokenizer_fingerprint}-{key}"


class CorpusAutomaton(Artefact):
    """The static automaton of ``corpus`` for the target's tokenizer: loaded from the cache, or built once from the
    corpus's statistics datastore (planned beside it while it is not cached). Like the authors' build script
    (tools/build_static_sam.py), every document ends with EOS and every vocabulary token is added as a one-token
    document, so that any token has a match of at least 1. The cache key covers the corpus's content, the
    vocabulary size and EOS; a cached automaton that fails its load checks is rebuilt."""

    def __init__(self, target, corpus: str, cache_dir: str | None = None, command: str | None = None):
        self.target, self.corpus, self.cache_dir, self.given_command = target, corpus, cache_dir, command
        self.directory = corpus_automaton_directory(target, corpus, cache_dir)
        self.command = command or f"python -m specbench.prepare --model {target.name} --drafters samd"

    @property
    def what(self) -> str:
        return f"the suffix automaton of {self.corpus} for {self.target.name}"

    @property
    def label(self) -> str:
        return f"suffix automaton of {self.corpus} for {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        return corpus_estimate(self.corpus, self.cache_dir, SECONDS_PER_CORPUS_BYTE, rate_digits=1)

    def rebuild_command(self) -> str:
        return self.command

    def inputs(self) -> list[Artefact]:
        return [StatisticsDatastore(self.target, self.corpus, self.cache_dir, command=self.command)]

    def check(self) -> None:
        checked_corpus(self.corpus, self.cache_dir)

    def build(self) -> None:
        self.check()
        self.announce()
        datastore = statistics_datastore(self.target, "auto", self.corpus, self.cache_dir, command=self.given_command)
        documents = _datastore_documents(datastore.tokens)
        documents.extend(np.array([token], dtype=np.int32) for token in range(vocab_size(self.target)))
        log.info("building the suffix automaton of %s for %s (%d tokens)", self.corpus, self.target.name,
                 datastore.manifest["tokens"])
        started = time.perf_counter()
        automaton = StaticSuffixAutomaton.build(documents, _eos_token(self.target))
        automaton.save(self.directory, source={"corpus": self.corpus, "tokenizer": self.target.tokenizer_fingerprint,
                                               "build_s": round(time.perf_counter() - started, 1)})

    def load(self) -> StaticSuffixAutomaton:
        return StaticSuffixAutomaton.load(self.directory, vocab_size=vocab_size(self.target))


def corpus_automaton(target, corpus: str, cache_dir: str | None = None,
                     command: str | None = None) -> StaticSuffixAutomaton:
    """The ``CorpusAutomaton`` of ``corpus``, built first if need be."""
    return CorpusAutomaton(target, corpus, cache_dir, command).get()


def _eos_token(target) -> int:
    eos = getattr(target.tokenizer, "eos_token_id", None)
    return int(eos) if eos is not None else min(target.eos_token_ids)


def _datastore_documents(tokens: np.ndarray) -> list[np.ndarray]:
    """A datastore's token stream (documents each followed by SEPARATOR) split back into documents."""
    ends = np.flatnonzero(tokens == SEPARATOR)
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [tokens[start:end] for start, end in zip(starts, ends) if end > start]


