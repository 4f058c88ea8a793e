"""The target's greedy answers to a prompt set, generated once per model and cached: HD's model database and the
distillation of pruned drafts both read them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from tqdm import tqdm

from specbench.artefacts import build_lock, cached_path, rank_tag, require_writable
from specbench.datastores.prompts import MODEL_DB_PROMPTS, model_db_prompts

log = logging.getLogger(__name__)


def read_prompts(path: str | Path) -> list[str]:
    """Prompts of a prompt set: a jsonl file (``prompt`` field, or the first of Spec-Bench ``turns``), a text
    file (one per line), or a named source (``sharegpt``, ``hf:OpenAssistant/oasst1``; see
    specbench/datastores/prompts.py)."""
    return model_db_prompts(str(path))


@torch.inference_mode()
def generate_answers(target, prompts: list[str], max_new_tokens: int, batch_size: int, on_batch=None,
                     done: int = 0) -> list[list[int]]:
    """The target's greedy answers (token ids, up to its EOS) to ``prompts[done:]``, in batches; ``on_batch``
    (if given) receives each batch's answers as soon as they exist, so a long build can be resumed."""
    model = target.model
    pad = min(target.eos_token_ids)
    answers = []
    batches = range(done, len(prompts), batch_size)
    for begin in tqdm(batches, desc=f"{target.name} answering prompts", unit="batch"):
        encoded = [target.encode_conversation([prompt], []) for prompt in prompts[begin : begin + batch_size]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):  # left padding, so every answer starts at the same column
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        output = model.generate(input_ids.to(target.backend.input_device), attention_mask=attention.to(target.backend.input_device),
                                do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad,
                                eos_token_id=sorted(target.eos_token_ids))
        batch = []
        for row in output[:, width:].tolist():
            cut = next((i for i, token in enumerate(row) if token in target.eos_token_ids), len(row))
            batch.append(row[:cut])
        answers += batch
        if on_batch is not None:
            on_batch(list(zip(encoded, batch)))
    return answers


def target_answers(target, prompts: str | list[str] | None = None, max_new_tokens: int = 256, batch_size: int = 8,
                   cache_dir: str | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of the target's greedy answers to a prompt set: a list of prompts, or a prompt
    set spec (``read_prompts``; default: the built-in set, disjoint from the evaluation questions). Generated
    once per model, prompt set and length, and cached: HD's model database and the distillation of pruned
    drafts read the same answers. An interrupted generation resumes from the batches already answered."""
    if not isinstance(prompts, list):
        prompts = read_prompts(prompts if prompts else MODEL_DB_PROMPTS)
    # Keyed by the prompts' text itself (not a prompt file's path), so an edited prompt file gets new answers.
    file = cached_path(cache_dir, "answers", target.name,
                       {"source": target.source, "prompts": prompts, "max_new_tokens": max_new_tokens}, ".jsonl")
    if file.is_file():
        pairs = _read_answers(file, len(prompts))
        if pairs is not None:
            return pairs
        log.warning("the cached answers %s are damaged and are being generated again", file)
    require_writable(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    # One job generates; another one waits and reads what it wrote (see artefacts.build_lock for torchrun's ranks).
    with build_lock(file.with_name(file.name + ".lock")):
        if file.is_file():
            pairs = _read_answers(file, len(prompts))
            if pairs is not None:
                return pairs
        return _generate_into(file, target, prompts, max_new_tokens, batch_size)


def _generate_into(file: Path, target, prompts: list[str], max_new_tokens: int, batch_size: int):
    """Generate the answers into ``file`` through a staging file that an interrupted build resumes from (the
    build lock makes it this process's alone; under torchrun each rank has its own)."""
    staging = file.with_suffix(f"{rank_tag()}.partial")
    done = _complete_rows(staging)
    with staging.open("a", encoding="utf-8") as handle:
        def save(pairs):
            handle.write("".join(json.dumps({"prompt_ids": p, "answer_ids": a}) + "\n" for p, a in pairs))
            handle.flush()

        generate_answers(target, prompts, max_new_tokens, batch_size, on_batch=save, done=len(done))
    rows = [json.loads(line) for line in staging.read_text().splitlines()]
    staging.replace(file)  # atomic: a reader sees the old file or the whole new one
    return [(row["prompt_ids"], row["answer_ids"]) for row in rows]


def _read_answers(file: Path, expected: int) -> list[tuple[list[int], list[int]]] | None:
    """The (prompt ids, answer ids) of a cached answers file, or None unless it holds ``expected`` whole rows
    of non-negative token ids."""
    try:
        rows = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        pairs = [(row["prompt_ids"], row["answer_ids"]) for row in rows]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    valid = all(isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
                for pair in pairs for ids in pair)
    return pairs if valid and len(pairs) == expected else None


def _complete_rows(staging: Path) -> list[str]:
    """The whole lines of an interrupted generation's file, rewritten without a half-written last line."""
    if not staging.is_file():
        return []
    text = staging.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    complete = [line for line in lines if line.endswith("\n")]
    if len(complete) != len(lines):
        staging.write_text("".join(complete), encoding="utf-8")
    return complete
