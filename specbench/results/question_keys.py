"""Question ids compared, stored and shown one way: by their JSON text (``question_key``), so ``1`` and ``"1"``
stay two questions, as in the question file, and an integer beyond 64 bits keeps every digit."""

from __future__ import annotations

import json

import numpy as np


def question_key(question_id) -> str:
    """The one form in which question ids are compared, and stored where a column must hold a single type: their
    JSON text. ``1`` and ``"1"`` stay two questions, as in the question file, and an integer beyond 64 bits keeps
    every digit.

    >>> question_key(1), question_key("q2"), question_key(2**70)
    ('1', '"q2"', '1180591620717411303424')
    """
    if isinstance(question_id, np.integer):  # a row of an int64 column
        question_id = int(question_id)
    return json.dumps(question_id, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def question_id_of_key(text):
    """An id back from its ``question_key`` text; None (a row left out as malformed) for text that is not one."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None


def question_id_problem(question_id) -> str | None:
    """Why ``question_id`` cannot be a question's id, or None: ``specbench.questions`` takes integers and strings."""
    if isinstance(question_id, bool) or not isinstance(question_id, (int, str, np.integer)):
        return f"has a question_id {shown(question_id)} that is not an integer or a string"
    return None


def shown(value) -> str:
    """A JSON value as a message shows it: its JSON text, cut short."""
    try:
        return cut_short(question_key(value))
    except (TypeError, ValueError):
        return cut_short(repr(value))


def cut_short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."
