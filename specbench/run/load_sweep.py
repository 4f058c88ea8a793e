"""A run under load (``engine.concurrency``): at each level, every question's first turn submitted with that many
requests in flight, by AR and then by the method, each (level, role) recorded as one line of load.jsonl once it
has finished whole (``specbench.results.load``). A resumed run measures only the levels it lacks; a level cut
short (a request that timed out, an engine that died, Ctrl-C) leaves no line and is measured again."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from tqdm import tqdm

from specbench.engines.base import BASELINE, METHOD, Engine
from specbench.errors import SpecbenchError
from specbench.questions import Prompt
from specbench.results.load import LOAD_FILE, RequestTiming, read_load_levels, summarise_level
from specbench.storage.atomic import append_whole
from specbench.storage.refusal import raise_refusal

log = logging.getLogger(__name__)


def spec_counters(completions) -> dict | None:
    """The speculative counters of a level summed over its requests from vLLM's per-request counts: verify steps
    (``drafts``), tokens proposed and accepted, and per draft position how many drafts had that position accepted;
    None when no request speculated (AR)."""
    specs = [completion.spec for completion in completions if completion.spec is not None]
    if not specs:
        return None
    positions: list[int] = []
    for spec in specs:
        for accepted in spec.get("per_step_accepted", []):
            if len(positions) < accepted:
                positions.extend([0] * (accepted - len(positions)))
            for position in range(accepted):
                positions[position] += 1
    width = max([spec.get("num_spec_tokens", 0) for spec in specs] + [len(positions)])
    positions.extend([0] * (width - len(positions)))
    return {"drafts": sum(spec["num_spec_steps"] for spec in specs),
            "draft_tokens": sum(spec["num_draft_tokens"] for spec in specs),
            "accepted_tokens": sum(spec["num_accepted_draft_tokens"] for spec in specs),
            "accepted_per_position": positions}


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


def measure_load(engine: Engine, method: str, run_dir: str | Path, prompts: list[Prompt]) -> list[dict]:
    """Every level of ``engine.load_levels`` not yet in ``run_dir``'s load.jsonl, AR first; returns every line
    the file then holds."""
    path = Path(run_dir) / LOAD_FILE
    if not prompts:
        log.warning("no question to submit under load (every selected question was skipped)")
        return read_load_levels(run_dir)
    done = {(int(line["concurrency"]), line["role"]): line for line in read_load_levels(run_dir)}
    todo = [(level, role) for level in engine.load_levels for role in (BASELINE, METHOD) if (level, role) not in done]
    if todo:
        drop_cut_line(path)
    names = {BASELINE: "ar" + engine.method_suffix, METHOD: method}
    with tqdm(total=len(engine.load_levels) * 2, initial=len(engine.load_levels) * 2 - len(todo), unit="level",
              desc="under load", dynamic_ncols=True) as bar:
        for level, role in todo:
            bar.set_postfix_str(f"{names[role]}, {level} in flight, {len(prompts)} requests")
            try:
                completions, duration = engine.serve(prompts, role, level)
            except SpecbenchError as error:
                raise SpecbenchError(f"the load level of {level} requests in flight ({names[role]}) did not finish: "
                                     f"{error}; nothing of it was written, and the same command resumes at it") from None
            baseline = done.get((level, BASELINE)) if role == METHOD else None
            line = summarise_level(
                level, role, names[role],
                [RequestTiming(c.key, c.first_token_s, c.last_token_s, c.token_ids) for c in completions],
                duration, spec_counters(completions) if role == METHOD else None,
                baseline_digests=None if baseline is None else baseline["token_digests"],
            ).to_line()
            append_whole(path, (json.dumps(line) + "\n").encode(), sync=True)
            done[(level, role)] = line
            bar.update(1)
            log.info("under load: %s at %d in flight: %.1f tok/s", names[role], level, line["output_tokens_per_s"])
    return read_load_levels(run_dir)
