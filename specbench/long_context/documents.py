"""``longdoc``: specbench's own long-context questions, written at run time from the default statistics corpus (the
Python documentation, PSF License, that ./setup.sh unpacks; ``specbench.datastores.corpus``), never shipped.

The set is fixed by the corpus and the constants below: of the corpus's files, in sorted path order, those whose
text cut at a paragraph boundary to at most 18,000 characters keeps at least 14,000 (and a section heading) are
eligible; twelve of them, evenly spaced over that order, are taken; odd ones are asked for a summary in LongSpec's
gov_report prompt, even ones a question on one of their section headings in its qmsum prompt
(``specbench.long_context.longbench``). The file is written once per corpus content into the specbench cache
(``questions/``, the corpus's identity and these settings in its name) and read like any question file.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from specbench.datastores.corpus import (DEFAULT_CORPUS, GET_DEFAULT_CORPUS, corpus_files, corpus_identity,
                                         default_corpus_dirs)
from specbench.errors import SpecbenchError
from specbench.long_context import LONGDOC
from specbench.long_context.longbench import LONGBENCH_TEMPLATES
from specbench.storage.atomic import write_atomically
from specbench.storage.cache import cache_root, cached_path
from specbench.storage.refusal import refusing_writes

log = logging.getLogger(__name__)

# What defines the set (all of it in the cache key). About 4 characters a token of SmolLM2's tokenizer on this
# English prose and code: 14,000-18,000 characters are 3,000-5,000 tokens (docs/usage.md gives the measured counts).
LONGDOC_QUESTIONS = 12
LONGDOC_CHARACTERS = (14_000, 18_000)  # (the least a kept document's cut holds, the most it may hold)
# The question on a section (the qmsum prompt's {input}), derived from the document itself.
LONGDOC_QUERY = "What does the document say about {heading}?"
# Which of LongSpec's templates each question takes, by its position among the chosen documents.
LONGDOC_TEMPLATES = ("gov_report", "qmsum")

# A reStructuredText section's underline (or overline): one punctuation character repeated, nothing else.
_ADORNMENT = re.compile(r"([!-/:-@\[-`{-~])\1{2,}[ \t]*")
# The end of a paragraph: a line with nothing but whitespace on it.
_PARAGRAPH_END = re.compile(r"\n[ \t]*\n")


def cut_at_paragraph(text: str, limit: int) -> str:
    """``text`` (without surrounding whitespace) cut at its last paragraph end that leaves at most ``limit``
    characters, so that no paragraph is cut in two; "" when its first paragraph alone is longer."""
    text = text.strip()
    if len(text) <= limit:
        return text
    ends = [match.start() for match in _PARAGRAPH_END.finditer(text) if match.start() <= limit]
    return text[:ends[-1]].rstrip() if ends else ""


def section_headings(text: str) -> list[str]:
    """The titles of ``text``'s reStructuredText sections, in order: a line of text over an underline at least as
    long (an overlined title's overline is passed over).

    >>> section_headings("Title\\n=====\\n\\nBody.\\n\\nPart one\\n--------\\n")
    ['Title', 'Part one']
    """
    lines = text.splitlines()
    headings = []
    for above, line in zip(lines, lines[1:]):
        title = above.strip()
        if title and not _ADORNMENT.fullmatch(above.strip()) and _ADORNMENT.fullmatch(line) \
                and len(line.rstrip()) >= len(title):
            headings.append(title)
    return headings


def longdoc_records(documents: list[tuple[str, str]]) -> list[dict]:
    """The set's question records, in Spec-Bench's schema with where each came from (``source``: the document's
    name; ``template``: the LongSpec prompt it is asked in), from ``documents`` ((name, text) in the corpus's
    order). The query is on the document's first section after its title (the title when it has no other), within
    the text the prompt holds, so that it can be answered from it."""
    least, most = LONGDOC_CHARACTERS
    eligible = []
    for name, text in documents:
        cut = cut_at_paragraph(text, most)
        headings = section_headings(cut)
        if len(cut) >= least and headings:
            eligible.append((name, cut, headings[1] if len(headings) > 1 else headings[0]))
    if len(eligible) < LONGDOC_QUESTIONS:
        raise SpecbenchError(f"task=longdoc takes {LONGDOC_QUESTIONS} documents of at least {least:,} characters "
                             f"with a section heading from the corpus {DEFAULT_CORPUS}, which has {len(eligible)}: "
                             f"{GET_DEFAULT_CORPUS} for the whole Python documentation")
    records = []
    for number in range(LONGDOC_QUESTIONS):
        # Evenly spaced over the corpus's order: its parts (C API, library, HOWTOs, tutorial, ...) each have a say.
        name, text, heading = eligible[number * len(eligible) // LONGDOC_QUESTIONS]
        template = LONGDOC_TEMPLATES[number % len(LONGDOC_TEMPLATES)]
        query = LONGDOC_QUERY.format(heading=heading)
        turn = LONGBENCH_TEMPLATES[template].format(context=text, input=query)
        records.append({"question_id": f"{LONGDOC}_{number + 1}", "category": LONGDOC, "turns": [turn],
                        "source": name, "template": template})
    return records


def _corpus_root(cache_dir: str | None) -> Path:
    found = default_corpus_dirs(cache_root(cache_dir))
    if not found:
        raise SpecbenchError(f"task=longdoc is written from the Python documentation (the corpus {DEFAULT_CORPUS}), "
                             f"which is not here: {GET_DEFAULT_CORPUS}; or point task.path at a question file")
    return found[0]


def longdoc_path(cache_dir: str | None = None) -> Path:
    """Where the cache keeps the set written from the corpus as it is now (written or not): its name holds a key
    of the corpus's content (``corpus_identity``) and of the constants above, so an edited corpus gives a new set."""
    settings = {"corpus": corpus_identity([str(_corpus_root(cache_dir))]), "questions": LONGDOC_QUESTIONS,
                "characters": list(LONGDOC_CHARACTERS), "query": LONGDOC_QUERY,
                "templates": [LONGBENCH_TEMPLATES[template] for template in LONGDOC_TEMPLATES]}
    return cached_path(cache_dir, "questions", f"{LONGDOC}-{DEFAULT_CORPUS}", settings, ".jsonl")


def longdoc_file(cache_dir: str | None = None) -> Path:
    """The set's question file in the cache (``longdoc_path``), written (atomically) on first use from the default
    corpus; one line saying how to get the corpus when it is not here."""
    path = longdoc_path(cache_dir)
    if path.is_file():
        return path
    root = _corpus_root(cache_dir)
    documents = [(file.relative_to(root).as_posix(), file.read_text(encoding="utf-8", errors="replace"))
                 for file in corpus_files(str(root))]
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in longdoc_records(documents))
    with refusing_writes(path.parent, "create"):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda staging: staging.write_text(lines, encoding="utf-8"))
    log.info("task=longdoc: %d questions written from %s to %s (once for this corpus)", LONGDOC_QUESTIONS, root, path)
    return path
