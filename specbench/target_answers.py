"""The target's greedy answers to a prompt set, generated once per model and cached: HD's model database and the
distillation of pruned drafts both read them.

Layout in the cache (``<cache>/answers``)::

    <model>-<key>/                    published whole by artefacts.replace_directory: answers.jsonl and the
                                      manifest.json that records its size and SHA-256 (checked on every read)
    <model>-<key>[.rank<r>].partial   the rows of a generation under way, one batch appended at a time; an
                                      interrupted generation resumes from its whole, valid rows
    <model>-<key>.jsonl               an answers file of an earlier specbench (no checksum): taken as the staging
                                      of its generation, so its rows are kept and published with a checksum
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import torch
from tqdm import tqdm

from specbench.artefacts import cached_path, load_or_rebuild, rank_tag, read_manifest, replace_directory, verify_files
from specbench.datastores.prompts import MODEL_DB_PROMPTS, model_db_prompts
from specbench.errors import SpecbenchError, raise_refusal

log = logging.getLogger(__name__)
ANSWERS_FILE = "answers.jsonl"


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
    once per model, prompt set and length, and cached with a checksum: HD's model database and the distillation
    of pruned drafts read the same answers, and damaged ones are generated again with a warning
    (``artefacts.load_or_rebuild``). An interrupted generation resumes from the batches already answered."""
    if not isinstance(prompts, list):
        prompts = read_prompts(prompts if prompts else MODEL_DB_PROMPTS)
    # Keyed by the prompts' text itself (not a prompt file's path), so an edited prompt file gets new answers.
    directory = cached_path(cache_dir, "answers", target.name,
                            {"source": target.source, "prompts": prompts, "max_new_tokens": max_new_tokens})
    # One job generates while another waits and then reads what it published (see artefacts.build_lock for the
    # ranks of a torchrun job, which generate together).
    return load_or_rebuild(directory, f"answer set of {target.name}", lambda: read_answers(directory, len(prompts)),
                           lambda: _generate_into(directory, target, prompts, max_new_tokens, batch_size))


def _generate_into(directory: Path, target, prompts: list[str], max_new_tokens: int, batch_size: int) -> None:
    """Generate the answers through a staging file that an interrupted build resumes from (the build lock makes
    it this process's alone; under torchrun each rank has its own), then publish them whole with a checksum."""
    staging = directory.with_name(f"{directory.name}{rank_tag()}.partial")
    earlier = directory.with_name(f"{directory.name}.jsonl")
    if earlier.is_file() and not staging.exists():
        log.info("the answers in %s (written without a checksum) are taken over into %s", earlier, directory)
        # Copied, not renamed: every rank of a torchrun job resumes from it, in step.
        append_answers(staging, whole_rows(earlier, len(prompts), cut=False))
    pairs = whole_rows(staging, len(prompts))

    def save(batch):
        append_answers(staging, batch)
        pairs.extend(batch)

    generate_answers(target, prompts, max_new_tokens, batch_size, on_batch=save, done=len(pairs))
    lines = "".join(answer_line(prompt_ids, answer_ids) for prompt_ids, answer_ids in pairs)
    replace_directory(directory, lambda version: (version / ANSWERS_FILE).write_text(lines, encoding="utf-8"),
                      {"kind": "target answers", "model": {"name": target.name, "source": target.source},
                       "answers": len(pairs), "max_new_tokens": max_new_tokens})
    for leftover in (staging, earlier):
        with contextlib.suppress(OSError):  # published: a file left here is never read again
            leftover.unlink(missing_ok=True)


def read_answers(directory: Path, expected: int) -> list[tuple[list[int], list[int]]]:
    """The (prompt ids, answer ids) of published answers, checked whole (``artefacts.verify_files``: the size,
    and the SHA-256 when its times changed, that manifest.json recorded) and holding ``expected`` rows of
    non-negative token ids; otherwise a one-line SpecbenchError."""
    fix = f"remove {directory} to have them generated again"
    problem = verify_files(directory, read_manifest(directory, "target answers", fix))
    if problem:
        raise SpecbenchError(f"{directory}: damaged target answers ({problem}); {fix}")
    try:
        lines = (directory / ANSWERS_FILE).read_bytes().splitlines()
    except OSError as error:
        raise SpecbenchError(f"{directory}: damaged target answers ({ANSWERS_FILE}: {error.strerror}); {fix}") from None
    pairs = [_pair(line) for line in lines]
    if None in pairs or len(pairs) != expected:
        raise SpecbenchError(f"{directory}: damaged target answers ({ANSWERS_FILE} does not hold {expected} "
                             f"answers of token ids); {fix}")
    return pairs


def answer_line(prompt_ids, answer_ids) -> str:
    return json.dumps({"prompt_ids": list(prompt_ids), "answer_ids": list(answer_ids)}) + "\n"


def _pair(line: bytes) -> tuple[list[int], list[int]] | None:
    """A row's (prompt ids, answer ids), or None unless it is a JSON object of two lists of non-negative ids."""
    try:
        row = json.loads(line)
        pair = (row["prompt_ids"], row["answer_ids"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    valid = all(isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
                for ids in pair)
    return pair if valid else None


def whole_rows(file: Path, limit: int, cut: bool = True) -> list[tuple[list[int], list[int]]]:
    """The rows of a staging file (or an earlier answers file) up to the first that is not whole and valid, at
    most ``limit``. What follows them (the half line of an interrupted write, or damage) is not trusted: with
    ``cut`` it is cut off, so that the next batch is appended right after the last whole row."""
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise_refusal(error, file, "read")
    pairs, end = [], 0
    for line in data.splitlines(keepends=True):
        pair = _pair(line) if line.endswith(b"\n") and len(pairs) < limit else None
        if pair is None:
            break
        pairs.append(pair)
        end += len(line)
    if cut and end < len(data):
        try:
            os.truncate(file, end)
        except OSError as error:
            raise_refusal(error, file)
    return pairs


def append_answers(staging: Path, pairs) -> None:
    """Append the rows of one batch to ``staging``. A write the filesystem refuses part-way (a full disk) is cut
    back to where the file ended, so the batch is kept whole or not at all, and is one line naming the file."""
    data = "".join(answer_line(prompt_ids, answer_ids) for prompt_ids, answer_ids in pairs).encode("utf-8")
    try:
        handle = os.open(staging, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as error:
        raise_refusal(error, staging)
    try:
        start = os.fstat(handle).st_size
        try:
            written = 0
            while written < len(data):  # a short write: the rest goes through, or the refusal comes
                written += os.write(handle, data[written:])
        except OSError as error:
            # If even the cut fails, the next build still trusts only the whole rows before it (_whole_rows).
            with contextlib.suppress(OSError):
                os.ftruncate(handle, start)
            raise_refusal(error, staging)
    finally:
        os.close(handle)

