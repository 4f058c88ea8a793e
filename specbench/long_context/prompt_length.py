"""The prompt-length selection of LongSpec's evaluation: a prompt is kept when ``1200 < tokens <= context - 2000``
(sail-sg/LongSpec @15e4998, ``longspec/test/inference_long-bench.py:95-102, 117-128``: its whole formatted prompt
tokenized, the context length of each target less 2,000 for the answer), and the first ``--test_length`` of those
kept are run (:129-130, 136-137). Here the bounds are a task's ``min_prompt_tokens`` (exclusive) and
``max_prompt_tokens`` (inclusive), counted over the first turn as the target reads it: in its prompt format, the
chat template's own tokens included.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)

Question = TypeVar("Question")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_prompt_bounds(min_tokens, max_tokens) -> tuple[int, int | None] | None:
    """``(task.min_prompt_tokens, task.max_prompt_tokens)`` checked, null read as no bound: None when neither
    bounds anything (the task selects by length not at all), else (least exclusive, most inclusive or None).
    A value that is no token count, or bounds no prompt can fall between, is one line naming both keys."""
    if min_tokens is not None and not _is_count(min_tokens):
        raise SpecbenchError(f"task.min_prompt_tokens must be a number of tokens (0 or more) or null, got "
                             f"{min_tokens!r}")
    if max_tokens is not None and (not _is_count(max_tokens) or max_tokens == 0):
        raise SpecbenchError(f"task.max_prompt_tokens must be a positive number of tokens or null, got {max_tokens!r}")
    least = min_tokens or 0
    if max_tokens is not None and max_tokens <= least:
        raise SpecbenchError(f"task.max_prompt_tokens={max_tokens} keeps no prompt of more than "
                             f"task.min_prompt_tokens={least} tokens; make it larger than {least}, or null")
    return None if least == 0 and max_tokens is None else (least, max_tokens)


def within_prompt_length(questions: Sequence[Question], count_tokens: Callable[[Question], int],
                         min_tokens: int, max_tokens: int | None) -> list[Question]:
    """The ``questions`` whose prompt has more than ``min_tokens`` and at most ``max_tokens`` (None: any number)
    tokens by ``count_tokens``, in their order; how many were dropped is logged, and none left is one line giving
    the prompts' range and the keys to change."""
    counts = [count_tokens(question) for question in questions]
    kept = [question for question, count in zip(questions, counts)
            if count > min_tokens and (max_tokens is None or count <= max_tokens)]
    most = "any number" if max_tokens is None else f"at most {max_tokens:,}"
    if not kept:
        spread = f"from {min(counts):,} to {max(counts):,}" if counts else "none"
        raise SpecbenchError(f"none of the {len(questions)} selected questions has a prompt of more than "
                             f"{min_tokens:,} and {most} tokens (theirs: {spread}); lower task.min_prompt_tokens or "
                             "raise task.max_prompt_tokens")
    short = sum(count <= min_tokens for count in counts)
    log.info("prompt length: %d of %d questions kept (more than %s and %s tokens); %d dropped as shorter, %d as longer",
             len(kept), len(questions), f"{min_tokens:,}", most, short, len(questions) - len(kept) - short)
    return kept
