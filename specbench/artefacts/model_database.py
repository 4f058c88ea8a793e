"""HD's model database: the n-grams of the target's own greedy answers to a prompt set (``TargetAnswers``),
counted by document frequency, built once per model and settings. Its cache key covers its prompt and question
files by content, so an edited file gives a new database; a cached one that fails its load checks is rebuilt with
a warning, while one given by path stops the run with one line naming the command that rebuilds it."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import specbench
from specbench.artefacts.base import Artefact
from specbench.artefacts.target_answers import TargetAnswers, target_answers
from specbench.artefacts.statistics_datastore import UNKNOWN_SOURCE, recorded_source, tokenizer_manifest, vocab_size
from specbench.datastores.model_db import count_document_ngrams, load_model_db, save_model_db
from specbench.datastores.prompts import MODEL_DB_PROMPTS, drop_overlapping, model_db_prompts
from specbench.datastores.sharegpt import SHAREGPT
from specbench.errors import SpecbenchError
from specbench.questions import SAMPLE_QUESTIONS, read_questions
from specbench.storage.cache import cached_path
from specbench.storage.manifest import file_digest

log = logging.getLogger(__name__)
# Counting the n-grams of 96 answers (51k tokens) into a model database takes a few seconds.
MODEL_DB_COUNT_S = 5.0


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


class ModelDatabase(Artefact):
    """The cached model database of these settings (see ``build_model_db``), built from the target's answers,
    which are planned beside it while it is not cached. A database serves any continuation length up to the one
    it was built with. ``command``: what builds it ahead of time, named in the line said before a build."""

    def __init__(self, target, key_tokens: int, continuation_length: int, capacity: int, build: dict,
                 cache_dir: str | None = None, least_frequent_first: bool = False, command: str | None = None):
        self.target, self.key_tokens, self.continuation_length = target, key_tokens, continuation_length
        self.capacity, self.settings, self.cache_dir = capacity, build, cache_dir
        self.least_frequent_first, self.given_command = least_frequent_first, command
        self.directory = model_db_directory(target, key_tokens, continuation_length, build, cache_dir)
        self.command = command or self.rebuild_command()

    @property
    def what(self) -> str:
        return f"HD's model database of {self.target.name} (n-grams of its answers)"

    @property
    def label(self) -> str:
        return f"model database of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        return MODEL_DB_COUNT_S, "counting n-grams; the answers are their own entry"

    def rebuild_command(self) -> str:
        return f"python scripts/build_model_db.py --model {self.target.name}"

    def inputs(self) -> list[Artefact]:
        prompts, _ = model_db_prompt_set(self.settings)
        return [TargetAnswers(self.target, prompts, self.settings["max_new_tokens"], cache_dir=self.cache_dir,
                              purpose=MODEL_DB_PURPOSE, command=self.given_command)]

    def build(self) -> None:
        build_model_db(self.target, self.directory, self.settings, self.key_tokens, self.continuation_length,
                       self.cache_dir, self.given_command)

    def load(self):
        return load_database(self.target, self.directory, self.key_tokens, self.continuation_length, self.capacity,
                             self.least_frequent_first, self.rebuild_command())


def load_database(target, directory, key_tokens: int, continuation_length: int, capacity: int,
                  least_frequent_first: bool, command: str):
    return load_model_db(directory, target.tokenizer_fingerprint, key_tokens, continuation_length, capacity,
                         least_frequent_first, vocab_size=vocab_size(target), command=command)


def model_db(target, path: str, key_tokens: int, continuation_length: int, capacity: int, build: dict,
             cache_dir: str | None = None, least_frequent_first: bool = False, command: str | None = None):
    """The model database at ``path``, or with ``path="auto"`` the cached ``ModelDatabase`` of these settings,
    built first if missing and rebuilt (with a warning) if damaged."""
    if path != "auto":
        return given_model_db(target, path, key_tokens, continuation_length, capacity, least_frequent_first)
    return ModelDatabase(target, key_tokens, continuation_length, capacity, build, cache_dir, least_frequent_first,
                         command).get()


def given_model_db(target, path: str, key_tokens: int, continuation_length: int, capacity: int,
                   least_frequent_first: bool = False):
    """The model database the user gave at ``path``; a damaged one is one line naming the command that rebuilds
    it from the prompt set its manifest records (not the drafter's model_db_build.prompts)."""
    recorded = recorded_source(path, "prompts")
    prompts = "" if recorded == str(MODEL_DB_PROMPTS) else f" --prompts {shlex.quote(recorded or UNKNOWN_SOURCE)}"
    return load_database(target, path, key_tokens, continuation_length, capacity, least_frequent_first,
                         f"python scripts/build_model_db.py --model {target.name}{prompts}")
