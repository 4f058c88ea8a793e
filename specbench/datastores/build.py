"""Building the databases that drafters read, with progress bars; used by the scripts and, for
``auto`` paths, on a drafter's first use (results are cached, so that happens once per model)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
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

log = logging.getLogger(__name__)
MODEL_DB_PROMPTS = Path(specbench.__file__).parent / "data" / "model_db_prompts.jsonl"


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


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from jsonl (``prompt`` field, or the first of Spec-Bench ``turns``) or text (one per line)."""
    path = Path(path)
    if not path.is_file():
        raise SpecbenchError(f"prompt file {path}: no such file")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            prompts.append(line.strip())
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise SpecbenchError(f"{path}, line {number}: not valid JSON") from None
        prompt = record.get("prompt") or (record.get("turns") or [None])[0]
        if not isinstance(prompt, str):
            raise SpecbenchError(f"{path}, line {number}: no prompt (expected a 'prompt' or 'turns' field)")
        prompts.append(prompt)
    if not prompts:
        raise SpecbenchError(f"prompt file {path} holds no prompts")
    return prompts


@torch.inference_mode()
def generate_answers(target, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[list[int]]:
    """The target's greedy answers (token ids, up to its EOS) to ``prompts``, in batches."""
    model = target.model
    pad = min(target.eos_token_ids)
    answers = []
    batches = range(0, len(prompts), batch_size)
    for begin in tqdm(batches, desc=f"{target.name} answering prompts", unit="batch"):
        encoded = [target.encode_conversation([prompt], []) for prompt in prompts[begin : begin + batch_size]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):  # left padding, so every answer starts at the same column
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        output = model.generate(input_ids.to(target.device), attention_mask=attention.to(target.device),
                                do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad,
                                eos_token_id=sorted(target.eos_token_ids))
        for row in output[:, width:].tolist():
            cut = next((i for i, token in enumerate(row) if token in target.eos_token_ids), len(row))
            answers.append(row[:cut])
    return answers


def target_answers(target, prompts_file: str | None = None, max_new_tokens: int = 256, batch_size: int = 8,
                   cache_dir: str | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of the target's greedy answers to a prompt set (default: the built-in set,
    disjoint from the evaluation questions). Generated once per model, prompt file and length, and cached:
    HD's model database and the distillation of pruned drafts read the same answers."""
    prompts_path = Path(prompts_file) if prompts_file else MODEL_DB_PROMPTS
    prompts = read_prompts(prompts_path)
    file = cached_path(cache_dir, "answers", target.name,
                       {"source": target.source, "prompts": prompts, "max_new_tokens": max_new_tokens}, ".jsonl")
    if file.is_file():
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        if len(rows) == len(prompts):
            return [(row["prompt_ids"], row["answer_ids"]) for row in rows]
    answers = generate_answers(target, prompts, max_new_tokens, batch_size)
    pairs = [(target.encode_conversation([prompt], []), answer) for prompt, answer in zip(prompts, answers)]
    file.parent.mkdir(parents=True, exist_ok=True)
    staging = file.with_suffix(".partial")
    staging.write_text("".join(json.dumps({"prompt_ids": p, "answer_ids": a}) + "\n" for p, a in pairs))
    staging.replace(file)
    return pairs


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
