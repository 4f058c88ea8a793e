"""How a reader tells what it left out of a result file: one warning per file, the first few lines or rows
described one by one and the rest listed by number, each warning logged once per run directory."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

SHOWN_PROBLEMS = 10  # left-out lines described one by one in a warning; the rest are listed by number


def numbers_text(numbers) -> str:
    """1-based line or row numbers as ranges: ``3, 7-9``.

    >>> numbers_text([9, 3, 7, 8])
    '3, 7-9'
    """
    ranges: list[list[int]] = []
    for number in sorted(numbers):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


def warn_once(message: str | None, warnings: list[str], already: set[str] | None = None) -> None:
    """Keep ``message`` in ``warnings`` and log it, unless it is in ``already`` (the warnings a RunDirectory
    gave before: a resumed run reads its files twice, the finished-run check then the opening, and one bad line
    is one warning)."""
    if message:
        if already is None or message not in already:
            log.warning("%s", message)
            if already is not None:
                already.add(message)
        warnings.append(message)
