"""Hierarchy Drafting (HD; Cho et al., NAACL Findings 2025) as its authors' code runs it
(zomss/Hierarchy_Drafting, model/hierachy/decoding.py): drafts from token databases visited in order of
temporal locality, verified inside Lookahead's Jacobi window.

    context     n-grams of this turn's prompt, of the window and of what was generated (lade's token map)
    model       n-grams the target itself tends to generate (its answers to a prompt set; built once)
    statistics  a corpus datastore searched as REST searches it (built once)

Each database returns up to 7 continuations of 4 tokens after the last token; the lists are concatenated in
``order`` (no deduplication) and cut to the first 7, which are verified as separate chains beside the window
in one forward pass. docs/fidelity.md traces every setting to the original file and line, and names the
keys that switch to specbench's own variants (a deduplicated trie, every generated n-gram, ...).
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch

from specbench.datastores.ngram_pool import NGramPool
from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.tree import guess_layout
from specbench.drafters.base import require_flag, require_non_negative, require_positive
from specbench.drafters.jacobi import JacobiWindow
from specbench.drafters.rest import node_paths, retrieved_tree
from specbench.errors import SpecbenchError

DATABASES = ("context", "model", "statistics")
OUTPUT_NGRAMS = ("code", "every", "none")


def statistics_candidates(datastore, context_ids: np.ndarray, key_tokens: int, draft_length: int, limit: int,
                          choices: int, max_matches: int, continuation_length: int) -> list[tuple[int, ...]]:
    """HD's ``get_db``: DraftRetriever searches with the last ``key_tokens`` tokens, then fewer, down to one
    (each search even when the longer one found enough, unless ``limit`` rows are already collected); each
    search's paths are taken longest first, cut to ``draft_length`` tokens, and kept unless equal to, a
    prefix of, or extended by a row already kept. Paths of equal length come in DraftRetriever's hash-set
    order in the original; here the more frequent first. Rows may be shorter than ``draft_length``."""
    rows: list[tuple[int, ...]] = []
    for length in range(min(key_tokens, context_ids.size), 0, -1):
        lo, hi = datastore.find(context_ids[context_ids.size - length :])
        tokens, parents, counts = retrieved_tree(datastore, lo, hi, length, continuation_length, max_matches,
                                                 "first", choices, True)
        paths = node_paths(tokens, parents)
        for index in sorted(range(len(paths)), key=lambda i: (-len(paths[i]), -counts[i], i)):
            row = paths[index][:draft_length]
            if all(any(a != b for a, b in zip(row, kept)) for kept in rows):
                rows.append(row)
                if len(rows) == limit:
                    return rows
    return rows


def generated_ngrams(tokens: np.ndarray, accepted_draft: int, size: int) -> list[tuple[int, ...]]:
    """The generated n-grams HD's code adds to its context database after a step (decoding.py, the
    ``input_ids[0, -LEVEL-hit_ids : -hit_ids]`` loop): for k = 1 .. accepted_draft - 1, the n-gram ending k
    tokens before the end of ``tokens`` (the context after the step). The slice for k = 0 is empty, so the
    n-gram ending at the newest token is never added, and a step that accepted fewer than 2 draft tokens adds
    nothing.

    Example, size 3: tokens [1 2 3 4 5 6] after a step that accepted 3 draft tokens (and a bonus) ->
    [(3, 4, 5), (2, 3, 4)].
    """
    values = tokens.tolist()
    return [tuple(values[len(values) - size - k : len(values) - k]) for k in range(1, accepted_draft)
            if len(values) - size - k >= 0]


def check_model_db_build(build: dict) -> None:
    """The numbers and flags of ``drafter.model_db_build`` (read only when the database is built, minutes into a
    first run), checked when the drafter is made: one line naming the key."""
    for key in ("max_new_tokens", "batch_size", "max_ngrams"):
        if key in build:
            require_positive(**{f"model_db_build.{key}": build[key]})
    for key in ("source_rows", "max_prompts"):  # null: all
        if build.get(key) is not None:
            require_positive(**{f"model_db_build.{key}": build[key]})
    if "include_final_ngram" in build:
        require_flag(**{"model_db_build.include_final_ngram": build["include_final_ngram"]})


class HierarchyDrafting(Drafter):
    def __init__(
        self,
        name: str = "hd",
        order=DATABASES,
        draft_length: int = 4,
        num_candidates: int = 7,
        per_key_capacity: int = 7,
        context_from_prompt: bool = True,
        context_from_output: str = "code",
        model_db: str = "auto",
        model_db_build: dict | None = None,
        model_db_least_frequent_first: bool = True,
        statistics_db: str = "auto",
        statistics_corpus: str = "python-docs",
        statistics_key_tokens: int = 2,
        statistics_choices: int = 64,
        statistics_max_matches: int = 5000,
        statistics_continuation_length: int = 10,
        statistics_pad: bool = True,
        merge_candidates: bool = False,
        lookahead_branch: bool = True,
        window_size: int = 7,
        fill_step_ngrams: bool = True,
        seed: int = 10,
        cache_dir: str | None = None,
    ):
        order = tuple(order)
        unknown = [db for db in order if db not in DATABASES]
        if unknown or not order or len(set(order)) != len(order):
            raise SpecbenchError(
                f"drafter.order={list(order)} must list distinct databases among {', '.join(DATABASES)}"
            )
        if context_from_output not in OUTPUT_NGRAMS:
            raise SpecbenchError(f"drafter.context_from_output must be one of {', '.join(OUTPUT_NGRAMS)}, "
                                 f"got {context_from_output!r}")
        require_positive(draft_length=draft_length, num_candidates=num_candidates, per_key_capacity=per_key_capacity,
                         statistics_key_tokens=statistics_key_tokens, statistics_choices=statistics_choices,
                         statistics_max_matches=statistics_max_matches,
                         statistics_continuation_length=statistics_continuation_length, window_size=window_size)
        require_non_negative(seed=seed)
        require_flag(context_from_prompt=context_from_prompt, model_db_least_frequent_first=model_db_least_frequent_first,
                     statistics_pad=statistics_pad, merge_candidates=merge_candidates,
                     lookahead_branch=lookahead_branch, fill_step_ngrams=fill_step_ngrams)
        check_model_db_build(dict(model_db_build or {}))
        self.name = name
        self.order = order
        self.draft_length = draft_length
        self.num_candidates = num_candidates
        self.per_key_capacity = per_key_capacity
        self.context_from_prompt = context_from_prompt
        self.context_from_output = context_from_output
        self.model_db_path = model_db
        self.model_db_build = dict(model_db_build or {})
        self.model_db_least_frequent_first = model_db_least_frequent_first
        self.statistics_db_path = statistics_db
        self.statistics_corpus = statistics_corpus
        self.statistics_key_tokens = statistics_key_tokens
        self.statistics_choices = statistics_choices
        self.statistics_max_matches = statistics_max_matches
        self.statistics_continuation_length = statistics_continuation_length
        self.statistics_pad = statistics_pad
        self.merge_candidates = merge_candidates
        self.seed = seed
        self.cache_dir = cache_dir
        # lade's token map, keyed by the one token before each n-gram, least recently added first.
        self.context_db = NGramPool(1, draft_length, per_key_capacity)
        self.model_db = None
        self.statistics_db = None
        self.vocab_size = 1
        self.window = (JacobiWindow(window_size, draft_length, seed, fill_step_ngrams=fill_step_ngrams)
                       if lookahead_branch else None)
        self._pad_draws = random.Random(seed)
        self._tail = np.empty(0, dtype=np.int64)

    def _cached(self, target) -> dict:
        """The cached databases of ``auto`` paths, by the attribute they are loaded into."""
        from specbench.artefacts.base import prepare_command
        from specbench.artefacts.model_database import ModelDatabase
        from specbench.artefacts.statistics_datastore import StatisticsDatastore

        command = prepare_command(target.name, self.name)
        cached = {}
        if "model" in self.order and self.model_db_path == "auto":
            cached["model_db"] = ModelDatabase(target, 1, self.draft_length, self.per_key_capacity, self.model_db_build,
                                               self.cache_dir, self.model_db_least_frequent_first, command)
        if "statistics" in self.order and self.statistics_db_path == "auto":
            cached["statistics_db"] = StatisticsDatastore(target, self.statistics_corpus, self.cache_dir,
                                                          command=command)
        return cached

    def artefacts(self, target) -> list:
        return list(self._cached(target).values())

    def prepare(self, target, sampling=None) -> None:
        from specbench.artefacts.base import fetch
        from specbench.artefacts.model_database import given_model_db
        from specbench.artefacts.statistics_datastore import given_datastore

        self.vocab_size = target.vocab_size
        # Databases given by path load in a moment, before the cached ones are built: the model database's answers
        # take minutes on a first use, and the statistics corpus is checked before them (fetch).
        if "statistics" in self.order and self.statistics_db_path != "auto":
            self.statistics_db = given_datastore(target, self.statistics_db_path)
        if "model" in self.order and self.model_db_path != "auto":
            self.model_db = given_model_db(target, self.model_db_path, 1, self.draft_length, self.per_key_capacity,
                                           least_frequent_first=self.model_db_least_frequent_first)
        for name, loaded in fetch(self._cached(target)).items():
            setattr(self, name, loaded)

    def fork(self) -> HierarchyDrafting:
        # The databases are shared; the context database, the window and the pad draws are one question's.
        forked = copy.copy(self)
        forked.context_db = NGramPool(1, self.draft_length, self.per_key_capacity)
        forked.window = copy.deepcopy(self.window)
        forked._pad_draws = random.Random(self.seed)
        return forked

    def sources(self) -> dict:
        found = {}
        if self.model_db is not None:
            found["model_db"] = self.model_db.source
        if self.statistics_db is not None:
            found["statistics_db"] = {"corpus": self.statistics_corpus if self.statistics_db_path == "auto"
                                      else self.statistics_db_path}
        return found

    def begin(self, prompt_ids: np.ndarray) -> None:
        # HD's token map and window are built anew on every generate call, i.e. every turn.
        self.context_db.clear()
        if self.context_from_prompt:
            self.context_db.add_sequence(prompt_ids)
        self._tail = prompt_ids[-2 * (1 + self.draft_length):].copy()
        self._pad_draws = random.Random(self.seed)
        if self.window is not None:
            self.window.reset(prompt_ids)

    def lookup(self, database: str, context_ids: np.ndarray, limit: int) -> list[tuple[int, ...]]:
        """Up to ``limit`` candidate continuations from one database, in the order the original lists them."""
        if database == "context":
            return self.context_db.lookup(context_ids[-1:], limit, oldest_first=True)
        if database == "model":
            return self.model_db.lookup(context_ids[-1:], limit)
        rows = statistics_candidates(self.statistics_db, context_ids, self.statistics_key_tokens, self.draft_length,
                                     limit, self.statistics_choices, self.statistics_max_matches,
                                     self.statistics_continuation_length)
        if self.statistics_pad:
            # HD pads a short path with one random token id repeated (pad_path(row, 4, random.randint(...))).
            rows = [row + (self._pad_draws.randint(0, self.vocab_size - 1),) * (self.draft_length - len(row))
                    if len(row) < self.draft_length else row for row in rows]
        return rows

    def propose(self, context_ids: np.ndarray) -> Draft:
        candidates: list[tuple[int, ...]] = []
        labels: list[str] = []
        for database in self.order:
            found = self.lookup(database, context_ids, self.num_candidates)
            if self.merge_candidates:  # specbench's variant: each candidate once
                found = [sequence for sequence in found if sequence not in candidates]
            candidates += found
            labels += [database] * len(found)
            if len(candidates) >= self.num_candidates:  # later databases are not asked
                break
        candidates, labels = candidates[: self.num_candidates], labels[: self.num_candidates]
        tokens, parents, mask, sources = guess_layout(candidates, labels, self.merge_candidates, accept_last=True)
        if self.window is not None:
            return self.window.attach(tokens, parents, sources, mask, root=int(context_ids[-1]))
        return Draft(torch.from_numpy(tokens), torch.from_numpy(parents), sources=tuple(sources))

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        if self.window is not None:
            for ngram in self.window.update(outcome):
                self.context_db.add(ngram[:1], ngram[1:])
        size = 1 + self.draft_length
        if self.context_from_output == "every":
            self._tail = self.context_db.add_new_tokens(self._tail, accepted_ids, size)
            return
        tokens = np.concatenate((self._tail, accepted_ids))
        if self.context_from_output == "code":
            for ngram in generated_ngrams(tokens, accepted_ids.size - 1, size):
                self.context_db.add(ngram[:1], ngram[1:])
        self._tail = tokens[-2 * size:]  # enough for the n-grams ending up to draft_length tokens back
