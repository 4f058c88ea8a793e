"""The target's greedy answers to a prompt set, generated once per model and cached: HD's model database and the
distillation of pruned drafts both read them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

import specbench
from specbench.errors import SpecbenchError
from specbench.models import cached_path

MODEL_DB_PROMPTS = Path(specbench.__file__).parent / "data" / "model_db_prompts.jsonl"


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
