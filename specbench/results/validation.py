"""What a line of each kind of result file must hold to be counted (``record_problem``): everything a reader of
results takes from a record (summary, analysis, resuming, the timing check) is checked here, once, so no later
sum or lookup meets a missing key or a wrong type."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specbench.measure.mismatch import KINDS as MISMATCH_KINDS
from specbench.measure.mismatch import Mismatch
from specbench.questions import ALL_TASKS
from specbench.results.question_keys import question_id_problem, shown
from specbench.results.schema import SKIP_CAUSES


def _json_type(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def is_count(value) -> bool:
    """A token or step count: a non-negative whole number (JSON may write it 3.0)."""
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0 and float(value).is_integer())


def is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _is_stall_record(stalls) -> bool:
    """A ``specbench.stalls`` record (``specbench.measure.stalls.question_stalls``): not measured (stalled null),
    or a verdict with each role's counts, which the summary and analysis describe."""
    # "stalled" present, and True, False or None itself (not 0 or 1.0, which compare equal to them)
    if not isinstance(stalls, dict) or not any(stalls.get("stalled", 0) is verdict for verdict in (True, False, None)):
        return False
    if stalls["stalled"] is None:
        return True
    roles = stalls.get("roles")
    return (isinstance(roles, dict) and bool(roles)
            and all(isinstance(found, dict) and is_count(found.get("steps"))
                    and all(is_seconds(found.get(key)) for key in ("excess_s", "wall_s", "share"))
                    for found in roles.values()))


@dataclass(frozen=True)
class LineKind:
    """What a line of one kind of result file must hold to be counted (``record_problem``), beyond a JSON object
    with an integer or string question_id.

    choice_lists: the lists an answer's ``choices[0]`` must hold; none: the record is not an answer.
    own_task:     specbench's method answers: a ``specbench`` object with the task the summary groups them by.
    skip:         a skipped-question record: a reason and, where recorded, one of SKIP_CAUSES.
    """

    choice_lists: tuple[str, ...] = ()
    own_task: bool = False
    skip: bool = False


METHOD_ANSWER = LineKind(("new_tokens", "wall_time", "accept_lengths"), own_task=True)
# A baseline answer, specbench's or Spec-Bench's own (analysis --spec-bench): no accept lengths needed.
BASELINE_ANSWER = LineKind(("new_tokens", "wall_time"))
# A method's answer in Spec-Bench's own model_answer files, which have no specbench key.
SPEC_BENCH_METHOD = LineKind(("new_tokens", "wall_time", "accept_lengths"))
SKIPPED_QUESTION = LineKind(skip=True)
ANY_RECORD = LineKind()
FILE_KINDS = {"answers.jsonl": METHOD_ANSWER, "baseline_answers.jsonl": BASELINE_ANSWER,
              "skipped.jsonl": SKIPPED_QUESTION}
MISMATCH_FIELDS = tuple(Mismatch.__dataclass_fields__)


def record_problem(record, kind: LineKind) -> str | None:
    """Why ``record`` (one parsed line) is not a well-formed record of ``kind``, or None. Everything a reader of
    results takes from a record (summary, analysis, resuming, the timing check) is checked here, once, so no
    later sum or lookup meets a missing key or a wrong type."""
    if not isinstance(record, dict):
        return f"is a JSON {_json_type(record)}, not an object"
    if "question_id" not in record:
        return "has no question_id"
    problem = question_id_problem(record["question_id"])
    if problem:
        return problem
    if kind.skip:
        return _skip_problem(record)
    if kind.choice_lists:
        return _answer_problem(record, kind)
    return None


def _skip_problem(record: dict) -> str | None:
    if not isinstance(record.get("reason"), str):
        return "has no reason (a string)"
    if "cause" in record and record["cause"] not in SKIP_CAUSES:
        return f"has an unknown cause {shown(record['cause'])} (one of {', '.join(SKIP_CAUSES)})"
    return None


def _answer_problem(record: dict, kind: LineKind) -> str | None:
    choices = record.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        if "turns" in record:
            return "has turns but no choices: it is a question (Spec-Bench's question.jsonl), not an answer"
        return "has no choices"
    if not isinstance(record.get("category"), str):
        return "has no category (a string)"
    choice = choices[0]
    for key in kind.choice_lists:
        if not isinstance(choice.get(key), list):
            return f"has no choices[0].{key}"
    new_tokens, wall_time = choice["new_tokens"], choice["wall_time"]
    if not all(is_count(value) for value in new_tokens):
        return "has a choices[0].new_tokens that is not a list of token counts"
    if not all(is_seconds(value) for value in wall_time):
        return "has a choices[0].wall_time that is not a list of seconds"
    if len(new_tokens) != len(wall_time):
        return f"has {len(new_tokens)} new_tokens but {len(wall_time)} wall_time entries (one per turn each)"
    if not sum(wall_time) > 0:
        return "has no positive wall_time (its tokens/s would divide by zero)"
    if "accept_lengths" in kind.choice_lists:
        lengths = choice["accept_lengths"]
        if not lengths or not all(is_count(value) for value in lengths):
            return "has a choices[0].accept_lengths that is not a non-empty list of token counts"
        depths = (record.get("specbench") or {}).get("draft_depths") if isinstance(record.get("specbench"), dict) else None
        if depths is not None and not (isinstance(depths, list) and len(depths) == len(lengths)
                                       and all(is_count(value) for value in depths)):
            return "has a specbench.draft_depths that is not a list of draft depths, one per accept length"
        if depths is not None:
            # No step appends more than its draft's depth + the bonus token; a record that says so has its
            # depths wrong, and every per-position figure computed from it would be.
            beyond = next((index for index, (length, depth) in enumerate(zip(lengths, depths))
                           if length > depth + 1), None)
            if beyond is not None:
                return (f"has a step (accept_lengths[{beyond}]) that appends {lengths[beyond]} tokens after a draft "
                        f"{depths[beyond]} deep (specbench.draft_depths): at most depth + 1")
    return _specbench_problem(record.get("specbench"), kind)


def _specbench_problem(ours, kind: LineKind) -> str | None:
    """What is wrong with an answer's ``specbench`` object (None where Spec-Bench's own files have none)."""
    if ours is None and not kind.own_task:
        return None
    if not isinstance(ours, dict):
        return "has no specbench object"
    if kind.own_task and ours.get("task") not in ALL_TASKS:
        return f"has no known specbench.task ({shown(ours.get('task'))})"
    if ours.get("identical_to_baseline") is not None and not isinstance(ours["identical_to_baseline"], bool):
        return "has a specbench.identical_to_baseline that is not true, false or null"
    if ours.get("drafted_tokens") is not None and not is_count(ours["drafted_tokens"]):
        return "has a specbench.drafted_tokens that is not a token count"
    mismatch = ours.get("mismatch")
    if mismatch is not None:
        if not isinstance(mismatch, dict) or mismatch.get("kind") not in MISMATCH_KINDS:
            return f"has a specbench.mismatch without a kind ({', '.join(MISMATCH_KINDS)})"
        if mismatch["kind"] == "violation" and any(key not in mismatch for key in MISMATCH_FIELDS):
            return "has a specbench.mismatch violation without its tokens and margins"
    contention = ours.get("contention")
    if contention is not None and not (isinstance(contention, dict) and (contention.get("other_cores") is None
                                                                         or is_seconds(contention["other_cores"]))):
        return "has a specbench.contention without a number of other_cores"
    if "stalls" in ours and not _is_stall_record(ours["stalls"]):
        return ("has a specbench.stalls that is not a stall verdict (stalled true, false or null, and each role's "
                "steps, excess_s, wall_s and share)")
    prefill = ours.get("prefill_s")
    if prefill is not None and not (isinstance(prefill, list) and all(part is None or is_seconds(part)
                                                                       for part in prefill)):
        return "has a specbench.prefill_s that is not a list of seconds (one per turn)"
    if ours.get("peak_gpu_memory_bytes") is not None and not is_count(ours["peak_gpu_memory_bytes"]):
        return "has a specbench.peak_gpu_memory_bytes that is not a byte count"
    return None
