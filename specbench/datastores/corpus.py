"""Text corpora for building datastores: local text/jsonl files and directories, or hub datasets.

The default statistics corpus is the Python 3 documentation (tutorial, library reference, HOWTOs, FAQs and
release notes: 512 reStructuredText files, about 11 MB of English prose and code, PSF License) from Debian's
``python3-doc`` package; ``./setup.sh`` unpacks it into the specbench cache without installing anything
system-wide. It holds none of Spec-Bench's questions or answers.
"""

from __future__ import annotations

import json
from pathlib import Path

from specbench.errors import SpecbenchError

DEFAULT_CORPUS = "python-docs"
TEXT_SUFFIXES = (".txt", ".md", ".rst")


def default_corpus_dirs(cache: Path) -> list[Path]:
    """Where the default corpus may be: unpacked by setup.sh into the cache, or installed by Debian."""
    candidates = [cache / "corpora" / DEFAULT_CORPUS]
    candidates += sorted(Path("/usr/share/doc").glob("python3*/html/_sources"))
    return [path for path in candidates if path.is_dir() and any(path.rglob("*.txt"))]


def resolve_corpus(spec: str, cache: Path) -> list[str]:
    """Paths (or one ``hf:`` id) for a corpus spec: ``python-docs`` (the default) or comma-separated paths."""
    if spec == DEFAULT_CORPUS:
        found = default_corpus_dirs(cache)
        if not found:
            raise SpecbenchError(
                "the default statistics corpus (the Python documentation from Debian's python3-doc package) is "
                "not here: run ./setup.sh on a Debian/Ubuntu machine, or `apt-get install python3-doc`, or build a "
                "datastore from your own corpus with scripts/build_datastore.py --corpus FILES"
            )
        return [str(found[0])]
    return [part for part in spec.split(",") if part]


def iter_documents(sources: list[str]):
    """Yield the text of every document: a text file is one document; a jsonl line is one document (its
    ``text`` field, the ``value``/``content`` of each ShareGPT/chat message, or a Spec-Bench-style ``turns``
    list); a directory is every such file below it; ``hf:owner/name[:split]`` is a hub dataset's rows."""
    for source in sources:
        if source.startswith("hf:"):
            yield from _hub_documents(source[3:])
            continue
        path = Path(source).expanduser()
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.suffix == ".jsonl"))
        elif path.is_file():
            files = [path]
        else:
            raise SpecbenchError(f"corpus {source}: no such file or directory")
        for file in files:
            if file.suffix == ".jsonl":
                yield from _jsonl_documents(file)
            else:
                yield file.read_text(encoding="utf-8", errors="replace")


def _record_text(record) -> str:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        return ""
    if isinstance(record.get("text"), str):
        return record["text"]
    for key in ("conversations", "messages", "data", "turns"):
        value = record.get(key)
        if isinstance(value, list):
            parts = [item if isinstance(item, str) else str(item.get("value") or item.get("content") or "")
                     for item in value]
            return "\n".join(part for part in parts if part)
    return ""


def _jsonl_documents(file: Path):
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                text = _record_text(json.loads(line))
            except json.JSONDecodeError:
                raise SpecbenchError(f"{file}, line {number}: not valid JSON") from None
            if text:
                yield text


def _hub_documents(spec: str):
    name, _, split = spec.partition(":")
    try:
        from datasets import load_dataset
    except ImportError:
        raise SpecbenchError("reading a hub dataset needs the `datasets` package: pip install datasets") from None
    try:
        rows = load_dataset(name, split=split or "train")
    except Exception as error:  # unreachable hub, unknown dataset
        raise SpecbenchError(f"corpus hf:{spec}: could not load it ({type(error).__name__}: {error})") from None
    for row in rows:
        text = _record_text(row)
        if text:
            yield text
