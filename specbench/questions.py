"""Benchmark questions in Spec-Bench's ``question.jsonl`` schema: {"question_id", "category", "turns"}.

Spec-Bench's six tasks are MT-bench (whose eight categories all map to the task ``mt_bench``),
translation, summarization, qa, math_reasoning and rag. Multilingual-SpecBench's five translation sets (De, Fr, Ja,
Ru, Zh to English; Kthyeon/Multilingual-SpecBench ``dataset/eval/<pair>_bench/question.jsonl``) are tasks of
their own, named by their category: deen, fren, jaen, ruen, zhen.

Long-context tasks (``specbench.long_context``): LongBench's gov_report, qmsum, multi_news, lcc and repobench-p as
LongSpec evaluates them, read from the user's ``<subset>.jsonl`` files (each record made into a question by the
subset's template), and ``longdoc``, specbench's own set written from the Python documentation on first use
(``specbench.run.selection``, which also selects these tasks' questions by prompt length).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.long_context import LONGBENCH_TASKS, LONGDOC
from specbench.long_context.longbench import longbench_question_id, longbench_turn

TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")  # Spec-Bench's
MULTILINGUAL_TASKS = ("deen", "fren", "jaen", "ruen", "zhen")  # Multilingual-SpecBench's
LONG_CONTEXT_TASKS = (*LONGBENCH_TASKS, LONGDOC)  # LongBench's as LongSpec evaluates them, and specbench's own
ALL_TASKS = (*TASKS, *MULTILINGUAL_TASKS, *LONG_CONTEXT_TASKS)
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
HUB_PREFIX = "hf:"
SAMPLE_QUESTIONS = Path(__file__).parent / "data" / "sample_questions.jsonl"
# specbench's own few translation questions in Multilingual-SpecBench's form, for tests and CPU runs (not its text)
MULTILINGUAL_SAMPLE = Path(__file__).parent / "data" / "multilingual_questions.jsonl"
QUESTION_FORMAT = ('a question file is UTF-8 JSON lines, one object per line: '
                   '{"question_id": 1, "category": "qa", "turns": ["..."]}, or LongBench\'s records '
                   '({"context": "...", "input": "...", ...}) in a file named after their subset: '
                   + ", ".join(f"{subset}.jsonl" for subset in LONGBENCH_TASKS))
# The parts of a question record: a line of a file that has none of them and a "context" is LongBench's.
QUESTION_KEYS = ("question_id", "category", "turns")


@dataclass(frozen=True)
class Prompt:
    """One benchmark question; MT-bench questions have two turns, the others one."""

    question_id: int | str
    category: str
    task: str
    turns: tuple[str, ...]


def task_of(category: str) -> str | None:
    """Spec-Bench task of a question category, or None when the category belongs to no task."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    return category if category in ALL_TASKS else None


def parse_questions(lines, source: str) -> list[Prompt]:
    """Questions from JSON lines; ``source`` names the file in error messages, each of which ends by saying what
    a question file must look like."""
    prompts, seen = [], set()
    for _, where, record in _json_records(lines, source):
        missing = [key for key in QUESTION_KEYS if key not in record]
        if missing:
            raise SpecbenchError(f"{where}: missing {', '.join(missing)}; {QUESTION_FORMAT}")
        question_id = record["question_id"]
        if not isinstance(question_id, (int, str)) or isinstance(question_id, bool):
            raise SpecbenchError(f"{where}: question_id must be an integer or a string, got {question_id!r}")
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise SpecbenchError(f"{where}: turns must be a non-empty list of strings")
        # Refused like an empty list of turns: a blank turn would be decoded and timed as if it asked something,
        # and every source (a local file, a hub dataset, the built-in set) is read here.
        blank = next((number for number, turn in enumerate(turns, start=1) if not turn.strip()), None)
        if blank is not None:
            raise SpecbenchError(f"{where}: question {question_id!r} turn {blank} is empty (no text but "
                                 f"whitespace); every turn must hold the text of a question")
        category = record["category"]
        task = task_of(category) if isinstance(category, str) else None
        if task is None:
            raise SpecbenchError(
                f"{where}: category {category!r} belongs to no task; expected one of "
                f"{', '.join(ALL_TASKS[1:])} or an MT-bench category ({', '.join(MT_BENCH_CATEGORIES)})"
            )
        if question_id in seen:
            raise SpecbenchError(f"{where}: question_id {question_id!r} appears twice")
        seen.add(question_id)
        prompts.append(Prompt(question_id, category, task, tuple(turns)))
    if not prompts:
        raise SpecbenchError(f"{source}: holds no questions; {QUESTION_FORMAT}")
    return prompts


def _json_records(lines, source: str):
    """(line number, where, the line's JSON object) for each non-blank line of a question file."""
    for number, line in enumerate(lines, start=1):
        if line.strip():
            where = f"{source}, line {number}"
            yield number, where, _json_object(line, where)


def _json_object(line: str, where: str) -> dict:
    """One JSON line of a question file as an object, or one line naming ``where`` and the formats read."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SpecbenchError(f"{where}: not valid JSON ({error.msg}); {QUESTION_FORMAT}") from None
    except ValueError as error:  # valid JSON Python will not read, e.g. an integer of over 4,300 digits
        raise SpecbenchError(f"{where}: unreadable ({error}); {QUESTION_FORMAT}") from None
    if not isinstance(record, dict):
        raise SpecbenchError(f"{where}: a JSON {type(record).__name__}, not an object; {QUESTION_FORMAT}")
    return record


def parse_longbench(lines, subset: str, source: str) -> list[Prompt]:
    """LongBench's records of ``subset`` (one JSON object a line: "context", for qmsum "input", and what else
    LongBench keeps) as questions of the task ``subset``, each turn LongSpec's prompt of the record
    (``long_context.longbench``), its id the record's ``_id`` or ``<subset>_<line>``."""
    prompts, seen = [], set()
    for number, where, record in _json_records(lines, source):
        question_id = longbench_question_id(subset, record, number, where)
        if question_id in seen:
            raise SpecbenchError(f"{where}: _id {question_id!r} appears twice")
        seen.add(question_id)
        prompts.append(Prompt(question_id, subset, subset, (longbench_turn(subset, record, where),)))
    if not prompts:
        raise SpecbenchError(f"{source}: holds no questions; {QUESTION_FORMAT}")
    return prompts


def read_questions(path: str | None, tasks: Sequence[str] = ()) -> list[Prompt]:
    """Questions from a local file (a question file, or LongBench's ``<subset>.jsonl``), from a directory (its
    ``question.jsonl``, else every ``*/question.jsonl`` one level down, in name order: Multilingual-SpecBench's
    ``dataset/eval``; else LongBench's data folder, each ``<subset>.jsonl`` of the five in it), from a hub dataset
    (``hf:owner/name`` or ``hf:owner/name:file.jsonl``), or, when ``path`` is None, the built-in sets written for
    specbench (Spec-Bench's tasks and the five translation pairs; the ``longdoc`` set, written from a corpus, is
    added by ``specbench.run.selection``). ``tasks``: the run's task.tasks, which say which LongBench subsets a
    folder must hold, and that a null path cannot serve them."""
    if path is not None and not isinstance(path, str):
        raise SpecbenchError(f"task.path must be a question file, hf:owner/dataset[:file.jsonl] or null, got {path!r}")
    if path is None:
        return _built_in(tasks)
    if path.startswith(HUB_PREFIX):
        path = _download_hub_questions(path[len(HUB_PREFIX):])
    file = Path(path).expanduser()
    if file.is_dir():
        return _read_folder(file, path, tasks)
    if not file.is_file():
        raise SpecbenchError(f"task.path={path}: no such file")
    return _read_file(file)[0]


def _built_in(tasks: Sequence[str]) -> list[Prompt]:
    longbench = [task for task in LONGBENCH_TASKS if task in tasks]
    if longbench:
        raise SpecbenchError(f"task.path is null, but LongBench's {', '.join(longbench)} can only be read from your "
                             "copy of LongBench (specbench ships none of its text): point task.path at your LongBench "
                             "data folder, which holds " + ", ".join(f"{task}.jsonl" for task in longbench))
    return [*parse_questions(SAMPLE_QUESTIONS.read_text(encoding="utf-8").splitlines(), "built-in sample set"),
            *parse_questions(MULTILINGUAL_SAMPLE.read_text(encoding="utf-8").splitlines(), "built-in multilingual set")]


def _read_file(file: Path) -> tuple[list[Prompt], str]:
    """The questions of one file and its form, "question" or "longbench": LongBench's when its first record is
    no question record and either holds a "context" or is in a file named after a subset. Its subset is the
    file's name; a name that is none of the five is refused, naming them."""
    lines = _text_lines(file)
    first = next((line for line in lines if line.strip()), None)
    try:
        record = json.loads(first) if first is not None else None
    except ValueError:  # parse_questions names the line and the formats
        record = None
    if (not isinstance(record, dict) or any(key in record for key in QUESTION_KEYS)
            or ("context" not in record and file.stem not in LONGBENCH_TASKS)):
        return parse_questions(lines, str(file)), "question"
    if file.stem not in LONGBENCH_TASKS:
        raise SpecbenchError(f"{file}: LongBench records, whose subset is the file's name, and {file.stem!r} is not "
                             f"one specbench has LongSpec's prompt for; name the file one of "
                             + ", ".join(f"{subset}.jsonl" for subset in LONGBENCH_TASKS))
    return parse_longbench(lines, file.stem, str(file)), "longbench"


def _read_folder(folder: Path, path: str, tasks: Sequence[str]) -> list[Prompt]:
    """A folder's questions: Spec-Bench's question.jsonl (or Multilingual-SpecBench's ``*/question.jsonl``), or
    LongBench's data folder, whose other subsets' files are not read. A folder of both, or a subset's file holding
    question records, is refused: which of them a run reads would be a guess."""
    if (folder / "question.jsonl").is_file():
        question_files = [folder / "question.jsonl"]
    else:
        question_files = sorted(folder.glob("*/question.jsonl"))
    subset_files = [folder / f"{subset}.jsonl" for subset in LONGBENCH_TASKS if (folder / f"{subset}.jsonl").is_file()]
    if question_files and subset_files:
        raise SpecbenchError(f"task.path={path}: a folder mixing question files ({', '.join(map(str, question_files))}) "
                             f"with LongBench's ({', '.join(map(str, subset_files))}); point task.path at a folder "
                             "holding one form, or at one file")
    if not question_files and not subset_files:
        raise SpecbenchError(f"task.path={path}: a directory with no question.jsonl in it or one level down (a "
                             "Spec-Bench data folder, or Multilingual-SpecBench's dataset/eval) and none of LongBench's "
                             + ", ".join(f"{subset}.jsonl" for subset in LONGBENCH_TASKS)
                             + "; name a question file or such a directory")
    prompts = []
    for file in question_files or subset_files:
        read, form = _read_file(file)
        if subset_files and form != "longbench":
            raise SpecbenchError(f"task.path={path}: a folder mixing forms: {file} holds question records, not "
                                 "LongBench's; a LongBench data folder holds LongBench's records in each <subset>.jsonl")
        prompts += read
    if subset_files:
        absent = [task for task in LONGBENCH_TASKS if task in tasks and folder / f"{task}.jsonl" not in subset_files]
        if absent:
            raise SpecbenchError(f"task.path={path}: a LongBench data folder without "
                                 + ", ".join(f"{task}.jsonl" for task in absent)
                                 + f", which task.tasks selects; add the file or leave {', '.join(absent)} out of "
                                 "task.tasks")
    _refuse_repeated_ids(prompts, question_files or subset_files)
    return prompts


def _refuse_repeated_ids(prompts: list[Prompt], files: list[Path]) -> None:
    seen = set()
    for prompt in prompts:
        if prompt.question_id in seen:
            raise SpecbenchError(f"question_id {prompt.question_id!r} appears in more than one of "
                                 f"{', '.join(map(str, files))}: every question of a run needs its own id")
        seen.add(prompt.question_id)


def _text_lines(file: Path) -> list[str]:
    """The lines of a question file, or a one-line error when it is binary, not UTF-8, or one JSON document
    (a list or a pretty-printed object) rather than JSON lines."""
    with file.open("rb") as handle:
        if b"\0" in handle.read(8192):
            raise SpecbenchError(f"{file}: holds NUL bytes, so it is a binary file (or UTF-16 text), not a question "
                                 f"file; {QUESTION_FORMAT}")
    lines = []
    for number, raw in enumerate(file.read_bytes().splitlines(), start=1):
        try:
            lines.append(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
        except UnicodeDecodeError as error:
            raise SpecbenchError(f"{file}, line {number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
                                 f"{error.start + 1}); {QUESTION_FORMAT}") from None
    _refuse_one_document(lines, file)
    return lines


def _refuse_one_document(lines: list[str], file: Path) -> None:
    """A JSON document spread over several lines parses as a whole but not line by line: name the mistake."""
    if sum(1 for line in lines if line.strip()) < 2:
        return
    first = next(line for line in lines if line.strip())
    try:
        json.loads(first)
        return
    except json.JSONDecodeError:
        pass
    try:
        document = json.loads("\n".join(lines))
    except json.JSONDecodeError:
        return
    raise SpecbenchError(f"{file}: one JSON {type(document).__name__} over several lines, not JSON lines; "
                         f"{QUESTION_FORMAT}")


def _download_hub_questions(spec: str) -> str:
    repo_id, _, filename = spec.partition(":")
    filename = filename or "question.jsonl"
    try:
        from huggingface_hub import hf_hub_download

        return hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset")
    except Exception as error:  # not cached and the hub is unreachable, or no such dataset/file
        raise SpecbenchError(
            f"task.path={HUB_PREFIX}{spec}: could not get {filename} from hub dataset {repo_id} "
            f"({type(error).__name__}); pass a local question.jsonl instead"
        ) from None


def check_selection(tasks: list[str], limit_per_task: int | None) -> None:
    """Refuse a task selection that can select nothing, naming the key: unknown or no tasks, a limit that is
    not a positive integer (true is not 1 here)."""
    if not tasks:
        raise SpecbenchError(f"task.tasks is empty; choose one or more of {', '.join(ALL_TASKS)}")
    unknown = [str(task) for task in tasks if task not in ALL_TASKS]
    if unknown:
        raise SpecbenchError(f"task.tasks has unknown task(s) {', '.join(unknown)}; valid: {', '.join(ALL_TASKS)}")
    if limit_per_task is not None and (not isinstance(limit_per_task, int) or isinstance(limit_per_task, bool)
                                       or limit_per_task < 1):
        raise SpecbenchError(f"task.limit_per_task must be a positive integer or null, got {limit_per_task!r}")


def select_questions(prompts: list[Prompt], tasks: list[str], limit_per_task: int | None) -> list[Prompt]:
    """The questions of ``tasks`` in file order, at most ``limit_per_task`` of each."""
    check_selection(tasks, limit_per_task)
    taken: dict[str, int] = {}
    selected = []
    for prompt in prompts:
        if prompt.task not in tasks:
            continue
        if limit_per_task is not None and taken.get(prompt.task, 0) >= limit_per_task:
            continue
        taken[prompt.task] = taken.get(prompt.task, 0) + 1
        selected.append(prompt)
    if not selected:
        raise SpecbenchError(f"no questions for task(s) {', '.join(tasks)} in the question file")
    return selected
