"""Prompt sets for HD's model database (the target answers them and its n-grams are counted) and a check that
keeps them apart from the evaluation questions.

A prompt set spec is one of:

- ``None``: the built-in set, ``specbench/data/model_db_prompts.jsonl`` (96 prompts written for specbench);
- a jsonl file (``prompt`` field, or the first of Spec-Bench ``turns``) or a text file (one prompt per line);
- ``sharegpt`` (opt-in, see specbench/datastores/sharegpt.py) or ``sharegpt:FILE``: the first user turn of
  each complete conversation;
- ``hf:OpenAssistant/oasst1[:split]``: OASST1's English messages (every role, in row order), what HD's
  construct_model_DB.py answers (see ``oasst_prompts``);
- ``hf:owner/name[:split]``: any other hub dataset whose rows have a ``prompt`` or ``text`` field.
"""

from __future__ import annotations

import json
import re
from itertools import islice
from pathlib import Path

import specbench
from specbench.datastores.corpus import load_hub_rows, split_hub_spec
from specbench.datastores.sharegpt import first_user_turns, is_sharegpt_spec, load_sharegpt
from specbench.errors import SpecbenchError

PACKAGE_DATA = Path(specbench.__file__).parent / "data"
MODEL_DB_PROMPTS = PACKAGE_DATA / "model_db_prompts.jsonl"
# specbench's own prompts for training draft heads (scripts/make_head_prompts.py writes them; docs/fidelity.md)
HEAD_PROMPTS = PACKAGE_DATA / "head_prompts.jsonl"
OASST_PREFIX = "OpenAssistant/oasst"
PROMPT_SPECS = ("null (the built-in set)", "a jsonl/text file", "sharegpt", "sharegpt:FILE", "hf:OpenAssistant/oasst1",
                "hf:owner/name[:split] with a prompt or text field")
WORD = re.compile(r"[^\W_]+")


def model_db_prompts(spec: str | None, limit: int | None = None, source_rows: int | None = None) -> list[str]:
    """The prompts of a prompt set spec (see the module docstring), the first ``limit`` of them if given.
    ``source_rows``: read only the first that many rows of a hub source (``hf:``), prompts or not: HD's released
    construct_model_DB.py stops after row 10 (``if i == 10: break``), i.e. ``source_rows=11``."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise SpecbenchError(f"prompt limit {limit!r}: must be a positive number of prompts, or null for all")
    if source_rows is not None and (isinstance(source_rows, bool) or not isinstance(source_rows, int)
                                    or source_rows < 1):
        raise SpecbenchError(f"drafter.model_db_build.source_rows={source_rows!r}: must be a positive number of rows, "
                             "or null for every row")
    if source_rows is not None and not (spec or "").startswith("hf:"):
        raise SpecbenchError(f"drafter.model_db_build.source_rows={source_rows} applies to hub prompt sources (hf:...) "
                             f"only; the prompt set is {spec or 'the built-in set'}")
    if spec is None:
        prompts = read_prompt_file(MODEL_DB_PROMPTS)
    elif is_sharegpt_spec(spec):
        prompts = first_user_turns(load_sharegpt(spec))
    elif spec.startswith("hf:"):
        prompts = list(islice(hub_prompts(*split_hub_spec(spec[3:]), source_rows=source_rows), limit))
    elif Path(spec).expanduser().is_file():
        prompts = read_prompt_file(Path(spec).expanduser())
    else:
        raise SpecbenchError(f"prompt set {spec!r}: no such file, and not one of: {', '.join(PROMPT_SPECS)}")
    if not prompts:
        raise SpecbenchError(f"prompt set {spec or MODEL_DB_PROMPTS} holds no prompts")
    return prompts[:limit]


def read_prompt_file(path: Path) -> list[str]:
    """Prompts from jsonl (``prompt`` field, or the first of Spec-Bench ``turns``) or text (one per line)."""
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


def hub_prompts(name: str, split: str, source_rows: int | None = None):
    """Yield the prompts of a hub dataset split (of its first ``source_rows`` rows, if given), read lazily so
    that a limit stops early."""
    rows = islice(load_hub_rows(name, split), source_rows)
    if name.startswith(OASST_PREFIX):
        yield from oasst_prompts(rows)
        return
    for number, row in enumerate(rows, start=1):
        prompt = next((row[field] for field in ("prompt", "text") if isinstance(row.get(field), str)), None)
        if not isinstance(prompt, str):
            raise SpecbenchError(f"hf:{name}:{split}, row {number}: no 'prompt' or 'text' field "
                                 f"(it has {', '.join(sorted(row)) or 'no fields'})")
        if prompt.strip():
            yield prompt


def oasst_prompts(rows):
    """Yield the English messages (``lang == "en"``) of OASST1 message rows, of every role, in row order.

    This is what HD's scripts/construct_model_DB.py:60-62 (@bc1e650) hands the target: it filters on the
    language alone, so assistant replies are answered as prompts too, and its code is the only description of
    the model database's source we can check (docs/fidelity.md says why it is taken as what produced the
    published numbers). Its ``if i == 10: break`` (row 10 is the last read) is ``source_rows=11``."""
    for row in rows:
        text = row.get("text")
        if row.get("lang") == "en" and isinstance(text, str) and text.strip():
            yield text


def word_ngrams(text: str, n: int):
    """The word n-grams of ``text`` (lowercased words of letters and digits) as tuples; none if it is shorter."""
    words = WORD.findall(text.lower())
    return zip(*(words[i:] for i in range(n)))


def drop_overlapping(prompts: list[str], questions: list[str], n: int = 8) -> tuple[list[str], int]:
    """``prompts`` without those that share a word n-gram with any of ``questions``, and how many were dropped.

    HD's paper requires the model database's prompts to be disjoint from the evaluation questions: the database
    holds the target's answers, so a prompt that copies an evaluation question would store the very answer the
    drafter is then measured on. ``questions`` are question texts (every turn). Words are lowercased runs of
    letters and digits, so punctuation and spacing do not hide a copy; a prompt or question with fewer than
    ``n`` words cannot overlap. The question n-grams are collected into one set once, so the cost is linear in
    the prompts' length: about 1 s for ShareGPT's 17,000 first user turns (13 MB) against 500 questions."""
    if n < 1:
        raise SpecbenchError(f"overlap n-gram length {n}: must be at least 1")
    question_ngrams = {gram for question in questions for gram in word_ngrams(question, n)}
    kept = [prompt for prompt in prompts if not any(gram in question_ngrams for gram in word_ngrams(prompt, n))]
    return kept, len(prompts) - len(kept)
