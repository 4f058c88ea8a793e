"""Text corpora for building datastores: local text/jsonl files and directories, or hub datasets.

The default statistics corpus is the Python 3 documentation (tutorial, library reference, HOWTOs, FAQs and
release notes: 512 reStructuredText files, about 11 MB of English prose and code, PSF License) from Debian's
``python3-doc`` package; ``./setup.sh`` unpacks it into the specbench cache without installing anything
system-wide. It holds none of Spec-Bench's questions or answers.

The papers' corpora can be named too: ``hf:stingning/ultrachat`` (UltraChat, what REST's chat datastore and HD's
statistics database were built from; every utterance is one document, as REST's get_datastore_chat.py adds them)
and the opt-in ``sharegpt`` (ShareGPT's assistant turns, see specbench/datastores/sharegpt.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from specbench.datastores.sharegpt import (
    SHAREGPT,
    assistant_turns,
    bundled_sharegpt_file,
    is_sharegpt_spec,
    load_sharegpt,
)
from specbench.errors import SpecbenchError

DEFAULT_CORPUS = "python-docs"
TEXT_SUFFIXES = (".txt", ".md", ".rst")
# How to get the default corpus, said by everything that needs it (datastores, task=longdoc's questions).
GET_DEFAULT_CORPUS = "run ./setup.sh on a Debian/Ubuntu machine, or `apt-get install python3-doc`"


def default_corpus_dirs(cache: Path) -> list[Path]:
    """Where the default corpus may be: unpacked by setup.sh into the cache, or installed by Debian."""
    candidates = [cache / "corpora" / DEFAULT_CORPUS]
    candidates += sorted(Path("/usr/share/doc").glob("python3*/html/_sources"))
    return [path for path in candidates if path.is_dir() and any(path.rglob("*.txt"))]


def resolve_corpus(spec: str, cache: Path) -> list[str]:
    """Sources for a corpus spec: ``python-docs`` (the default), ``sharegpt`` (opt-in), or comma-separated paths,
    ``hf:`` ids, ``sharegpt`` and ``sharegpt:FILE``. ``sharegpt`` stays a name in the sources, so that
    ``iter_documents`` checks the hash of the very bytes it parses; a missing package is reported here, before
    any model is loaded."""
    if spec == SHAREGPT:
        bundled_sharegpt_file()
        return [SHAREGPT]
    if spec == DEFAULT_CORPUS:
        found = default_corpus_dirs(cache)
        if not found:
            raise SpecbenchError(
                "the default statistics corpus (the Python documentation from Debian's python3-doc package) is "
                f"not here: {GET_DEFAULT_CORPUS}, or build a datastore from your own corpus with "
                "scripts/build_datastore.py --corpus FILES"
            )
        return [str(found[0])]
    return [part for part in spec.split(",") if part]


def iter_documents(sources: list[str]):
    """Yield the text of every document: a text file is one document; a jsonl line is one document (its
    ``text`` field, the ``value``/``content`` of each ShareGPT/chat message, or a Spec-Bench-style ``turns``
    list; an UltraChat ``data`` list of strings gives one document per string); a directory is every such file
    below it; ``hf:owner/name[:split]`` is a hub dataset's rows, read the same way; ``sharegpt`` and
    ``sharegpt:FILE`` give one document per assistant turn."""
    for source in sources:
        if is_sharegpt_spec(source):
            yield from assistant_turns(load_sharegpt(source))
            continue
        if source.startswith("hf:"):
            yield from _hub_documents(source[3:])
            continue
        for file in corpus_files(source):
            if file.suffix == ".jsonl":
                yield from _jsonl_documents(file)
            else:
                yield file.read_text(encoding="utf-8", errors="replace")


def require_text(corpus: str, sources: list[str]) -> None:
    """A one-line SpecbenchError unless every local source of ``corpus`` (``resolve_corpus``) holds a document with
    text: checked before a build starts (HD builds its model database, which takes minutes, before its statistics
    datastore), reading each source only up to its first such document. Hub datasets are checked when read, since
    knowing would mean downloading them; the bundled ShareGPT is checked by its hash."""
    for source in sources:
        if source.startswith("hf:") or is_sharegpt_spec(source):
            continue
        if not any(text for text in iter_documents([source])):
            raise SpecbenchError(f"corpus {corpus}: {source} holds no text, so there is nothing to build a datastore "
                                 "from; give files with text (drafter.corpus, drafter.statistics_corpus, or "
                                 "--corpus of scripts/build_datastore.py)")


def corpus_bytes(sources: list[str]) -> int | None:
    """How many bytes the local files of ``sources`` hold (what a build's time scales with), or None when a hub
    dataset is among them (its size is known only once downloaded)."""
    total = 0
    for source in sources:
        if source.startswith("hf:"):
            return None
        if is_sharegpt_spec(source):
            file = bundled_sharegpt_file() if source == SHAREGPT else Path(source[len(SHAREGPT) + 1:]).expanduser()
            total += Path(file).stat().st_size if Path(file).is_file() else 0
            continue
        total += sum(file.stat().st_size for file in corpus_files(source))
    return total


def corpus_files(source: str) -> list[Path]:
    """The files a local corpus source is read from, in order: the file itself, or a directory's text and
    jsonl files below it, sorted by path."""
    path = Path(source).expanduser()
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.suffix == ".jsonl"))
    if path.is_file():
        return [path]
    raise SpecbenchError(f"corpus {source}: no such file or directory")


def corpus_identity(sources: list[str]) -> list:
    """What a cache built from ``sources`` (``resolve_corpus``) is keyed by: the content of every local file
    read (SHA-256), with its name below the source directory (it orders the documents) or, for a single
    file, its suffix (it picks the parser); hub ids and the bundled ``sharegpt`` (whose hash is checked on
    every read) by their spec. So an edited corpus file gives another key, and a moved one the same."""
    from specbench.storage.manifest import file_digest

    identity = []
    for source in sources:
        if source.startswith("hf:") or source == SHAREGPT:
            identity.append(source)
        elif is_sharegpt_spec(source):
            file = Path(source[len(SHAREGPT) + 1:]).expanduser()
            if not file.is_file():
                raise SpecbenchError(f"corpus {source}: no such file")
            identity.append(["sharegpt", file_digest(file)])
        elif Path(source).expanduser().is_dir():
            root = Path(source).expanduser()
            identity.append([[file.relative_to(root).as_posix(), file_digest(file)] for file in corpus_files(source)])
        else:
            file = corpus_files(source)[0]
            identity.append([file.suffix, file_digest(file)])
    return identity


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


def record_documents(record) -> list[str]:
    """The documents in one jsonl line or hub row: UltraChat's ``{"data": [utterance, ...]}`` gives one per
    non-empty utterance (as REST's get_datastore_chat.py adds them to its datastore), any other record one."""
    data = record.get("data") if isinstance(record, dict) else None
    if isinstance(data, list) and data and all(isinstance(item, str) for item in data):
        return [item for item in data if item]
    text = _record_text(record)
    return [text] if text else []


def _jsonl_documents(file: Path):
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise SpecbenchError(f"{file}, line {number}: not valid JSON") from None
            yield from record_documents(record)


def split_hub_spec(spec: str) -> tuple[str, str]:
    """``owner/name[:split]`` (after ``hf:``) -> (name, split); the split defaults to ``train``."""
    name, _, split = spec.partition(":")
    return name, split or "train"


def load_hub_rows(name: str, split: str):
    """The rows of a hub dataset split. ``datasets`` is imported only here, so that specbench runs without it."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise SpecbenchError(f"hf:{name} needs the `datasets` package: pip install datasets") from None
    try:
        return load_dataset(name, split=split)
    except Exception as error:  # unreachable hub, unknown dataset or split
        raise SpecbenchError(f"hf:{name}:{split}: could not load it ({type(error).__name__}: {error})") from None


def _hub_documents(spec: str):
    for row in load_hub_rows(*split_hub_spec(spec)):
        yield from record_documents(row)
