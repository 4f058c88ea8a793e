"""The records of a run under load (``engine.concurrency``): every question of the task set submitted with a
number of requests kept in flight, once by AR and once by the method, in one serving engine.

One line of ``load.jsonl`` in the run directory per (concurrency, role), appended when that level has finished
for that role, so an interrupted sweep resumes at the first level it lacks. Pure: no torch, no engine. What an
engine hands in per request is a ``ServedRequest``, in specbench's names; every figure of a line is a function of
``specbench.measure.metrics``.

A line (``LoadLevel.to_line``):

    concurrency            requests kept in flight
    role                   "baseline" (AR) or "method"
    method                 the name the method is shown under ("pld@vllm"; "ar@vllm" for the baseline)
    requests               requests completed (every question's first turn)
    output_tokens          tokens generated, every request together
    duration_s             wall time from the first submission to the last completion
    output_tokens_per_s    output_tokens / duration_s (``metrics.throughput``)
    requests_per_s         requests / duration_s (``metrics.throughput``)
    ttft_s, tpot_s, latency_s
                           {mean, p50, p90, p99} over requests: time to first token (submission to the first
                           token the client received), time per output token after the first ((last - first) /
                           (tokens - 1), requests of one token left out: ``metrics.time_per_output_token_after_first``),
                           and the whole request's time
    drafts, draft_tokens, accepted_tokens
                           the verify steps that checked a draft, their draft tokens and the draft tokens accepted,
                           over the level (None for AR)
    mean_acceptance_length tokens per verify step, the bonus token included: 1 + accepted / drafts
                           (``metrics.mean_acceptance_length``; None for AR)
    per_position_acceptance_rate
                           per draft position i, the drafts that accepted a token at i over all drafts
                           (``metrics.per_position_acceptance_rate``, vLLM's definition; None for AR). Files written
                           before it had this name call it ``acceptance_by_position``, which summary.json uses for
                           the other definition: ``read_load_lines`` reads the old name as this one (``as_current``).
    identical_to_baseline  for the method: requests whose tokens equal the baseline's at the same concurrency
                           (None for the baseline and when the baseline's level is missing)
    question_ids           the requests' questions, in submission order
    token_digests          question id (as a string) -> ``token_digest`` of its tokens: the outputs compared across
                           levels and roles without storing them
    warm_up                what ran untimed on that role's engine just before the level ({runs, max_new_tokens}:
                           ``runs`` rounds of ``concurrency`` requests of ``max_new_tokens`` tokens each,
                           ``specbench.load_sweep``); absent from lines written before it was recorded

Every line of a file is measured as its first was: over the same questions, after the same warm-up. The one reader,
``read_load_lines`` (resuming and analysis alike), leaves out and names a line that is not (and a damaged one: not
JSON, not a level, an impossible figure, a repeated level).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.measure import metrics
from specbench.results.left_out import SHOWN_PROBLEMS, numbers_text, warn_once
from specbench.results.question_keys import question_key, shown

LOAD_FILE = "load.jsonl"
PERCENTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` by linear interpolation between order statistics (numpy's default),
    None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: list[float]) -> dict[str, float | None]:
    """{mean, p50, p90, p99} of ``values`` (every entry None for none)."""
    figures = {"mean": sum(values) / len(values) if values else None}
    figures.update({f"p{q}": percentile(values, q) for q in PERCENTILES})
    return figures


@dataclass
class ServedRequest:
    """One request served under load, as the client saw it, in specbench's names (what ``Engine.serve`` hands
    back): its question, seconds from its submission to its first and to its last token, its tokens, and, where
    the engine speculated, one entry per verify step that checked a draft (in order): the draft's depth (a chain's
    tokens) and the tokens that step appended, the bonus token included (``metrics``' accept lengths). None for
    both without speculation (AR)."""

    question_id: object
    first_token_s: float
    last_token_s: float
    token_ids: list[int]
    draft_depths: list[int] | None = None
    accept_lengths: list[int] | None = None

    @property
    def time_per_output_token(self) -> float | None:
        return metrics.time_per_output_token_after_first(self.first_token_s, self.last_token_s, len(self.token_ids))


@dataclass
class LoadLevel:
    concurrency: int
    role: str
    method: str
    requests: int
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float
    requests_per_s: float
    ttft_s: dict
    tpot_s: dict
    latency_s: dict
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    mean_acceptance_length: float | None = None
    per_position_acceptance_rate: list[float] | None = None
    identical_to_baseline: int | None = None
    question_ids: list = field(default_factory=list)
    token_digests: dict = field(default_factory=dict)
    warm_up: dict | None = None
    # what a proposer drafting inside the engine's steps did during the level (engine=vllm-custom;
    # ``results.proposer.ProposerCounters.between``): None where the engine drafts with its own methods
    proposer: dict | None = None

    def to_line(self) -> dict:
        return asdict(self)


def token_digest(token_ids) -> str:
    """A short digest of a request's tokens, so load levels compare outputs without storing them."""
    return hashlib.sha256(json.dumps(list(map(int, token_ids))).encode()).hexdigest()[:16]


def summarise_level(concurrency: int, role: str, method: str, requests: list[ServedRequest], duration_s: float,
                    baseline_tokens: dict | None = None, baseline_digests: dict | None = None,
                    warm_up: dict | None = None, proposer: dict | None = None) -> LoadLevel:
    """A ``LoadLevel`` from what the client measured (``requests``, ``duration_s``) and the verify steps the
    requests carry (the speculative figures: none when no request speculated, AR).
    For ``identical_to_baseline``, the baseline at this level: ``baseline_tokens`` (question id -> its tokens) or
    ``baseline_digests`` (its line's ``token_digests``). ``warm_up``: what ran untimed before the level
    (``specbench.load_sweep.LevelWarmUp.record``)."""
    if duration_s <= 0:
        raise ValueError(f"a level's duration must be positive, got {duration_s}")
    output_tokens = sum(len(request.token_ids) for request in requests)
    tpots = [tpot for tpot in (request.time_per_output_token for request in requests) if tpot is not None]
    level = LoadLevel(
        concurrency=int(concurrency), role=role, method=method, requests=len(requests), output_tokens=output_tokens,
        duration_s=duration_s, output_tokens_per_s=metrics.throughput(output_tokens, duration_s),
        requests_per_s=metrics.throughput(len(requests), duration_s),
        ttft_s=distribution([request.first_token_s for request in requests]),
        tpot_s=distribution(tpots),
        latency_s=distribution([request.last_token_s for request in requests]),
        question_ids=[request.question_id for request in requests],
        token_digests={str(request.question_id): token_digest(request.token_ids) for request in requests},
        warm_up=warm_up,
        proposer=proposer,
    )
    speculated = [request for request in requests if request.draft_depths is not None]
    if speculated:
        depths = [int(depth) for request in speculated for depth in request.draft_depths]
        lengths = [int(length) for request in speculated for length in request.accept_lengths]
        level.drafts = sum(1 for depth in depths if depth > 0)
        level.draft_tokens = sum(depths)
        level.accepted_tokens = metrics.accepted_draft_tokens(lengths)
        if level.drafts:
            level.mean_acceptance_length = metrics.mean_acceptance_length(lengths, depths)
            level.per_position_acceptance_rate = metrics.per_position_acceptance_rate(lengths, depths)
    if baseline_tokens is not None:
        baseline_digests = {str(key): token_digest(tokens) for key, tokens in baseline_tokens.items()}
    if baseline_digests is not None:
        level.identical_to_baseline = sum(1 for key, digest in level.token_digests.items()
                                          if baseline_digests.get(key) == digest)
    return level


# Keys a line of load.jsonl once had, read as the key that now holds that figure: "acceptance_by_position" was vLLM's
# share of all drafts per position, which now has vLLM's own name (summary.json's acceptance_by_position is the
# share of the drafts that reached the position).
RENAMED_KEYS = {"acceptance_by_position": "per_position_acceptance_rate"}


def as_current(line):
    """A line of load.jsonl with the figures an older file recorded under another name (``RENAMED_KEYS``) under
    today's; a line that is not an object is handed back as it is."""
    if not isinstance(line, dict):
        return line
    renamed = {new: line[old] for old, new in RENAMED_KEYS.items() if old in line and new not in line}
    return {key: value for key, value in line.items() if key not in RENAMED_KEYS} | renamed


ROLES = ("baseline", "method")
DISTRIBUTIONS = ("ttft_s", "tpot_s", "latency_s")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def level_problem(line) -> str | None:
    """Why ``line`` (one parsed line of load.jsonl, today's keys) is not a level that can be counted, or None:
    a figure a reader takes from it is missing, of the wrong type, or impossible (a duration that is not
    positive, a throughput that is negative, not finite or not its tokens over its duration, a time below zero,
    a rate outside [0, 1], more identical requests than requests). Everything resuming and analysis read of a
    line is checked here, once."""
    if not isinstance(line, dict):
        kind = {list: "an array", str: "a string", type(None): "null", bool: "a boolean"}.get(type(line), "a number")
        return f"is {kind}, not a level (an object)"
    if "role" not in line:
        return "has no role (baseline or method)"
    if line["role"] not in ROLES:
        return f"has role {shown(line['role'])}, not baseline or method"
    if not _count(line.get("concurrency"), 1):
        return f"has concurrency {shown(line.get('concurrency'))}, not a whole number of requests of 1 or more"
    if not isinstance(line.get("method"), str):
        return "has no method name"
    for key, minimum in (("requests", 1), ("output_tokens", 0)):
        if not _count(line.get(key), minimum):
            return f"has {key} {shown(line.get(key))}, not a whole number of {minimum} or more"
    duration = line.get("duration_s")
    if not _number(duration) or duration <= 0:
        return f"has duration_s {shown(duration)}, not a positive number of seconds"
    for key, count in (("output_tokens_per_s", line["output_tokens"]), ("requests_per_s", line["requests"])):
        value = line.get(key)
        if not _number(value) or value < 0:
            return f"has {key} {shown(value)}, not a finite number of 0 or more"
        if not math.isclose(value, metrics.throughput(count, duration), rel_tol=1e-9):
            return f"has {key} {value!r}, which is not its count over duration_s ({count} / {duration!r})"
    for name in DISTRIBUTIONS:
        figures = line.get(name)
        if not isinstance(figures, dict) or any(
                figures.get(key) is not None and (not _number(figures.get(key)) or figures[key] < 0)
                for key in ("mean", *(f"p{q}" for q in PERCENTILES))):
            return f"has {name} {shown(figures)}, not {{mean, p50, p90, p99}} of seconds (0 or more, or null)"
    for key in ("drafts", "draft_tokens", "accepted_tokens"):
        if line.get(key) is not None and not _count(line[key]):
            return f"has {key} {shown(line[key])}, not a count"
    if (line.get("accepted_tokens") or 0) > (line.get("draft_tokens") or 0):
        return "has more accepted_tokens than draft_tokens"
    length = line.get("mean_acceptance_length")
    if length is not None and (not _number(length) or length < 1):
        return f"has mean_acceptance_length {shown(length)}, not a number of 1 or more (the bonus token counts)"
    rates = line.get("per_position_acceptance_rate")
    if rates is not None and (not isinstance(rates, list) or not all(_number(rate) and 0 <= rate <= 1
                                                                     for rate in rates)):
        return f"has per_position_acceptance_rate {shown(rates)}, not a list of rates in [0, 1]"
    identical = line.get("identical_to_baseline")
    if identical is not None and (not _count(identical) or identical > line["requests"]):
        return f"has identical_to_baseline {shown(identical)}, not a count of at most its {line['requests']} requests"
    questions = line.get("question_ids")
    if not isinstance(questions, list) or len(questions) != line["requests"] or not all(
            isinstance(question, (int, str)) and not isinstance(question, bool) for question in questions):
        return "has no question_ids, one per request"
    if not isinstance(line.get("token_digests"), dict):
        return "has no token_digests"
    if line.get("warm_up") is not None and not isinstance(line["warm_up"], dict):
        return f"has warm_up {shown(line['warm_up'])}, not an object"
    proposer = line.get("proposer")
    if proposer is not None and (not isinstance(proposer, dict) or not _count(proposer.get("calls"))
                                 or not _number(proposer.get("draft_s")) or proposer["draft_s"] < 0):
        return f"has proposer {shown(proposer)}, not {{calls, draft_s, ...}} counts and seconds"
    return None


def question_set(line: dict) -> frozenset[str]:
    """The questions a level submitted, compared by ``question_key`` (order aside)."""
    return frozenset(question_key(question) for question in line["question_ids"])


@dataclass
class LoadLines:
    """What ``read_load_lines`` kept of a run's load.jsonl: the ``levels`` that count (today's keys), read from
    the 1-based lines ``numbers``, and the (line, why) pairs it left out."""

    path: Path
    levels: list[dict] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    left_out: list[tuple[int, str]] = field(default_factory=list)

    def warning(self) -> str | None:
        """The one warning naming every line left out and why; None when none was."""
        if not self.left_out:
            return None
        ordered = sorted(self.left_out)
        parts = [f"line {number} {why}" for number, why in ordered[:SHOWN_PROBLEMS]]
        if len(ordered) > SHOWN_PROBLEMS:
            parts.append(f"and {len(ordered) - SHOWN_PROBLEMS} more (lines "
                         f"{numbers_text(number for number, _ in ordered[SHOWN_PROBLEMS:])})")
        return f"{self.path}: {'; '.join(parts)} ({len(ordered)} line(s) left out, not counted)"

    def done(self) -> dict[tuple[int, str], dict]:
        """(concurrency, role) -> its level."""
        return {(level["concurrency"], level["role"]): level for level in self.levels}


def read_load_lines(run_dir: str | Path) -> LoadLines:
    """The lines of ``run_dir``'s load.jsonl that count, as resuming and analysis both read them; logs nothing.

    A line counts when it is whole, JSON, a level (``level_problem``, on today's keys: ``as_current``), the first
    of its (concurrency, role), and measured as the file's first level was: over the same questions and after
    the same warm-up (``warm_up``; a file written before it was recorded has none on any line). Each other line is
    left out with why. The last line without its newline is an interrupted write: left out without a word, as the
    level it records is measured again on resume."""
    lines = LoadLines(Path(run_dir) / LOAD_FILE)
    if not lines.path.is_file():
        return lines
    try:
        data = lines.path.read_bytes()
    except OSError as error:
        raise SpecbenchError(f"{lines.path}: cannot be read ({error.strerror or error})") from None
    first: dict | None = None
    seen: dict[tuple[int, str], int] = {}  # (concurrency, role) -> the line that counts for it
    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            line = as_current(json.loads(raw.decode("utf-8")))
        except (ValueError, RecursionError):  # not UTF-8, not JSON, an integer past 4300 digits, deep nesting
            lines.left_out.append((number, "is not valid JSON"))
            continue
        problem = level_problem(line)
        if problem is None and (line["concurrency"], line["role"]) in seen:
            problem = (f"repeats concurrency {line['concurrency']} {line['role']} of line "
                       f"{seen[line['concurrency'], line['role']]} (the first is kept)")
        if problem is None and first is not None and question_set(line) != question_set(first):
            problem = (f"is over {len(line['question_ids'])} questions other than line {lines.numbers[0]}'s "
                       f"{len(first['question_ids'])}: a file holds one question set")
        if problem is None and first is not None and line.get("warm_up") != first.get("warm_up"):
            problem = (f"was measured after another warm-up ({shown(line.get('warm_up'))}) than line "
                       f"{lines.numbers[0]} ({shown(first.get('warm_up'))})")
        if problem is not None:
            lines.left_out.append((number, problem))
            continue
        first = first or line
        seen[line["concurrency"], line["role"]] = number
        lines.levels.append(line)
        lines.numbers.append(number)
    return lines


def read_load_levels(run_dir: str | Path) -> list[dict]:
    """The levels of ``run_dir``'s load.jsonl that count (``read_load_lines``), the others named in one warning."""
    lines = read_load_lines(run_dir)
    warn_once(lines.warning(), [])
    return lines.levels


def finished_levels(run_dir: str | Path) -> set[tuple[int, str]]:
    """(concurrency, role) of every level load.jsonl already holds (``read_load_lines``: a damaged line is none)."""
    return set(read_load_lines(run_dir).done())
