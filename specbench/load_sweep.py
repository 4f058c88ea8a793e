"""A run under load, beside the runner that calls it once the paired questions are done: at each of the engine's
load levels (``Engine.load_levels``, vLLM's ``engine.concurrency``), every question's first turn submitted with
that many requests in flight (``Engine.serve``), by AR and then by the method, each (level, role) recorded as one
line of load.jsonl once it has finished whole (``specbench.results.load``). A resumed run measures only the levels
it lacks; a level cut short (a request that timed out, an engine that died, Ctrl-C) leaves no line and is measured
again.

Every level is measured as the first was, whatever ran before it in the session (the paired questions, another
level, nothing at all in a session that only extends the sweep or re-measures a damaged line): each (level, role)
is preceded by the same untimed warm-up at its own concurrency (``LevelWarmUp``), recorded in its line. A file holds
one question set and one warm-up: a session that would add levels over other questions, or warmed otherwise, is
refused in one line before anything is measured (``check_load_file``), and the reader leaves out any line that
differs from the file's first (``specbench.results.load.read_load_lines``)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specbench.engines.base import BASELINE, METHOD, Engine
from specbench.errors import SpecbenchError
from specbench.questions import Prompt
from specbench.results.left_out import warn_once
from specbench.results.load import LOAD_FILE, LoadLines, question_set, read_load_lines, summarise_level
from specbench.results.proposer import ProposerCounters
from specbench.results.question_keys import question_key, shown
from specbench.storage.atomic import append_whole
from specbench.storage.refusal import raise_refusal

log = logging.getLogger(__name__)

ROLES = (BASELINE, METHOD)  # the order each level is measured in


@dataclass(frozen=True)
class LevelWarmUp:
    """The untimed warm-up before every (level, role): ``runs`` rounds of the level's first ``concurrency``
    questions' first turns, that many in flight, ``max_new_tokens`` tokens each (``run.warmup_runs``,
    ``run.warmup_max_new_tokens``, as the paired questions' warm-up). An engine compiles and caches per batch shape
    on its first requests (a cold vLLM engine's first tokens take many times longer), so a level is warmed at its
    own concurrency, just before it, and never relies on what ran earlier in the session.
    The engine's prefix cache is emptied before the measured requests (``Engine.serve``)."""

    runs: int
    max_new_tokens: int

    @staticmethod
    def of(settings) -> LevelWarmUp:
        """The warm-up a run's ``RunSettings`` ask for."""
        return LevelWarmUp(int(settings.warmup_runs), int(settings.warmup_max_new_tokens))

    def record(self) -> dict:
        """What load.jsonl's ``warm_up`` records of it."""
        return {"runs": self.runs, "max_new_tokens": self.max_new_tokens}

    def run(self, engine: Engine, prompts: list[Prompt], role: str, concurrency: int) -> None:
        for _ in range(self.runs):
            engine.serve(prompts[:concurrency], role, concurrency, max_new_tokens=self.max_new_tokens)


def drop_cut_line(path: Path) -> None:
    """Cut ``path`` back to its last whole line: a line a killed session left without its newline (its level is
    measured again) would otherwise run into the next line appended, and that level would be lost as well."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        try:
            os.truncate(path, data.rfind(b"\n") + 1)
        except OSError as error:
            raise_refusal(error, path)


def _warm_up_text(record: dict | None) -> str:
    if record is None:
        return "no recorded warm-up (written before specbench warmed each level)"
    return f"a warm-up of {shown(record)}"


def check_same_measure(lines: LoadLines, question_ids: list, warm_up: LevelWarmUp) -> None:
    """Refuse, in one line, to add levels to ``lines``' file over other questions than its levels' or after
    another warm-up: its levels would not compare with the new ones, in one file and under one name."""
    if not lines.levels:
        return
    first = lines.levels[0]
    ours = frozenset(question_key(question) for question in question_ids)
    theirs = question_set(first)
    if ours != theirs:
        added, missing = sorted(ours - theirs), sorted(theirs - ours)
        differ = "; ".join(part for part in (f"{len(added)} not in it ({', '.join(added[:3])}"
                                             f"{', ...' if len(added) > 3 else ''})" if added else "",
                                             f"{len(missing)} of its own missing ({', '.join(missing[:3])}"
                                             f"{', ...' if len(missing) > 3 else ''})" if missing else "") if part)
        raise SpecbenchError(
            f"{lines.path} holds load levels over {len(theirs)} questions; this run would submit {len(ours)} ({differ})"
            f": a load.jsonl holds one question set, so select the questions its levels were measured over "
            f"(task.tasks, task.limit_per_task) or measure these under load in another run directory (hydra.run.dir)")
    if first.get("warm_up") != warm_up.record():
        raise SpecbenchError(
            f"{lines.path} holds load levels measured after {_warm_up_text(first.get('warm_up'))}; this run warms "
            f"each level with {_warm_up_text(warm_up.record())}, and levels warmed otherwise do not compare: "
            f"measure under load in another run directory (hydra.run.dir)")


def pending_levels(lines: LoadLines, levels: list[int]) -> list[tuple[int, str]]:
    """(level, role) of ``levels`` that ``lines`` lacks, in the order they are measured."""
    done = lines.done()
    return [(level, role) for level in levels for role in ROLES if (level, role) not in done]


def check_load_file(run_dir: str | Path, levels: list[int], question_ids: list, warm_up: LevelWarmUp) -> None:
    """Before anything loads: when ``run_dir``'s load.jsonl lacks a level of ``levels``, refuse in one line to
    measure it over other questions or after another warm-up (``check_same_measure``)."""
    lines = read_load_lines(run_dir)
    if pending_levels(lines, levels):
        check_same_measure(lines, question_ids, warm_up)


def measure_load(engine: Engine, method: str, run_dir: str | Path, prompts: list[Prompt],
                 warm_up: LevelWarmUp) -> list[dict]:
    """Every level of ``engine.load_levels`` not yet in ``run_dir``'s load.jsonl, AR first, each after
    ``warm_up``; returns every level the file then holds (lines left out by the reader named in one warning)."""
    path = Path(run_dir) / LOAD_FILE
    lines = read_load_lines(run_dir)
    warn_once(lines.warning(), [])
    if not prompts:
        log.warning("no question to submit under load (every selected question was skipped)")
        return lines.levels
    done = lines.done()
    todo = pending_levels(lines, engine.load_levels)
    if todo:
        check_same_measure(lines, [prompt.question_id for prompt in prompts], warm_up)
        drop_cut_line(path)
    names = {BASELINE: "ar" + engine.method_suffix, METHOD: method}
    with tqdm(total=len(engine.load_levels) * 2, initial=len(engine.load_levels) * 2 - len(todo), unit="level",
              desc="under load", dynamic_ncols=True) as bar:
        for level, role in todo:
            bar.set_postfix_str(f"{names[role]}, {level} in flight, {len(prompts)} requests")
            try:
                warm_up.run(engine, prompts, role, level)
                before = engine.proposer_counters() if role == METHOD else None
                served, duration = engine.serve(prompts, role, level)
                after = engine.proposer_counters() if before is not None else None
            except SpecbenchError as error:
                raise SpecbenchError(f"the load level of {level} requests in flight ({names[role]}) did not finish: "
                                     f"{error}; nothing of it was written, and the same command resumes at it") from None
            baseline = done.get((level, BASELINE)) if role == METHOD else None
            line = summarise_level(level, role, names[role], served, duration,
                                   baseline_digests=None if baseline is None else baseline["token_digests"],
                                   warm_up=warm_up.record(),
                                   proposer=None if after is None else ProposerCounters.between(before, after)).to_line()
            append_whole(path, (json.dumps(line) + "\n").encode(), sync=True)
            done[(level, role)] = line
            bar.update(1)
            log.info("under load: %s at %d in flight: %.1f tok/s", names[role], level, line["output_tokens_per_s"])
    return read_load_lines(run_dir).levels
