"""Hierarchy Drafting (HD; Cho et al., NAACL Findings 2025): drafts from several token databases visited in
order of temporal locality, so acceleration stays consistent across tasks without any training.

    context     n-grams of this prompt and of what has been generated so far (updated every step, LRU)
    model       n-grams the target model itself tends to generate (built once per model)
    statistics  a large corpus datastore, searched with a suffix array (REST's datastore)

Databases are asked in ``order`` until ``num_candidates`` distinct candidate sequences are collected; the
candidates are merged into one draft tree whose nodes are labelled with the database that supplied them, so
the records say which database the accepted tokens came from. With ``lookahead_branch=true`` the drafts ride
on Lookahead's Jacobi window, whose n-grams also feed the context database, as in the original code.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.datastores.ngram_pool import NGramPool
from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.tree import trie_from_sequences
from specbench.drafters.base import require_positive
from specbench.drafters.jacobi import JacobiWindow
from specbench.errors import SpecbenchError

DATABASES = ("context", "model", "statistics")


class HierarchyDrafting(Drafter):
    def __init__(
        self,
        name: str = "hd",
        order=DATABASES,
        key_tokens: int = 2,
        draft_length: int = 4,
        num_candidates: int = 7,
        per_key_capacity: int = 7,
        context_from_prompt: bool = True,
        model_db: str = "auto",
        model_db_build: dict | None = None,
        statistics_db: str = "auto",
        statistics_corpus: str = "python-docs",
        statistics_max_matches: int = 1000,
        lookahead_branch: bool = False,
        window_size: int = 7,
        seed: int = 0,
        cache_dir: str | None = None,
    ):
        order = tuple(order)
        unknown = [db for db in order if db not in DATABASES]
        if unknown or not order or len(set(order)) != len(order):
            raise SpecbenchError(
                f"drafter.order={list(order)} must list distinct databases among {', '.join(DATABASES)}"
            )
        require_positive(key_tokens=key_tokens, draft_length=draft_length, num_candidates=num_candidates,
                         per_key_capacity=per_key_capacity, statistics_max_matches=statistics_max_matches,
                         window_size=window_size)
        self.name = name
        self.order = order
        self.key_tokens = key_tokens
        self.draft_length = draft_length
        self.num_candidates = num_candidates
        self.per_key_capacity = per_key_capacity
        self.context_from_prompt = context_from_prompt
        self.model_db_path = model_db
        self.model_db_build = dict(model_db_build or {"prompts": None, "continuation_length": 8,
                                                        "max_new_tokens": 256, "batch_size": 8, "max_ngrams": 100000})
        self.statistics_db_path = statistics_db
        self.statistics_corpus = statistics_corpus
        self.statistics_max_matches = statistics_max_matches
        self.cache_dir = cache_dir
        self.context_db = NGramPool(key_tokens, draft_length, per_key_capacity)
        self.model_db = None
        self.statistics_db = None
        self.window = JacobiWindow(window_size, draft_length, seed) if lookahead_branch else None
        self._tail = np.empty(0, dtype=np.int64)

    def prepare(self, target, sampling=None) -> None:
        from specbench.datastores import build

        if "model" in self.order:
            self.model_db = build.model_db(target, self.model_db_path, self.key_tokens, self.draft_length,
                                           self.per_key_capacity, self.model_db_build, self.cache_dir)
        if "statistics" in self.order:
            self.statistics_db = build.statistics_datastore(target, self.statistics_db_path, self.statistics_corpus,
                                                            self.cache_dir)

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.context_db.clear()
        if self.context_from_prompt:
            self.context_db.add_sequence(prompt_ids)
        self._tail = prompt_ids[-(self.key_tokens + self.draft_length):].copy()
        if self.window is not None:
            self.window.reset(prompt_ids)

    def lookup(self, database: str, context_ids: np.ndarray, limit: int) -> list[tuple[int, ...]]:
        """Up to ``limit`` candidate continuations of ``draft_length`` tokens from one database."""
        if database == "context":
            return self.context_db.lookup(context_ids, limit)
        if database == "model":
            return self.model_db.lookup(context_ids, limit)
        return self.statistics_lookup(context_ids, limit)

    def statistics_lookup(self, context_ids: np.ndarray, limit: int) -> list[tuple[int, ...]]:
        """The most frequent continuations after the context's last ``key_tokens`` tokens, then after fewer."""
        found: list[tuple[int, ...]] = []
        datastore = self.statistics_db
        for length in range(min(self.key_tokens, context_ids.size), 0, -1):
            lo, hi = datastore.find(context_ids[context_ids.size - length :])
            if hi == lo:
                continue
            continuations = datastore.continuations(lo, hi, length, self.draft_length, self.statistics_max_matches, limit)
            for sequence in map(tuple, continuations.sequences.tolist()):
                if sequence not in found:
                    found.append(sequence)
                    if len(found) == limit:
                        return found
        return found

    def propose(self, context_ids: np.ndarray) -> Draft:
        candidates: list[tuple[int, ...]] = []
        labels: list[str] = []
        for database in self.order:
            for sequence in self.lookup(database, context_ids, self.num_candidates):
                if sequence not in candidates:
                    candidates.append(sequence)
                    labels.append(database)
                    if len(candidates) == self.num_candidates:
                        break
            if len(candidates) == self.num_candidates:
                break
        tokens, parents, sources = trie_from_sequences(candidates, labels)
        if self.window is not None:
            return self.window.attach(tokens, parents, sources)
        return Draft(torch.from_numpy(tokens), torch.from_numpy(parents), sources=tuple(sources))

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        self._tail = self.context_db.add_new_tokens(self._tail, accepted_ids, self.key_tokens + self.draft_length)
        if self.window is not None:
            for ngram in self.window.update(outcome):
                self.context_db.add(ngram[:1], ngram[1:])
