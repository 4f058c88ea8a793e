"""The records of a run under load (``engine.concurrency``): every question of the task set submitted with a
number of requests kept in flight, once by AR and once by the method, in one serving engine.

One line of ``load.jsonl`` in the run directory per (concurrency, role), appended when that level has finished
for that role, so an interrupted sweep resumes at the first level it lacks. Pure: no torch, no engine.

A line (``LoadLevel.to_line``):

    concurrency            requests kept in flight
    role                   "baseline" (AR) or "method"
    method                 the name the method is shown under ("pld@vllm"; "ar@vllm" for the baseline)
    requests               requests completed (every question's first turn)
    output_tokens          tokens generated, every request together
    duration_s             wall time from the first submission to the last completion
    output_tokens_per_s    output_tokens / duration_s
    requests_per_s         requests / duration_s
    ttft_s, tpot_s, latency_s
                           {mean, p50, p90, p99} over requests: time to first token (submission to the first
                           token the client received), time per output token after the first ((last - first) /
                           (tokens - 1), requests of one token left out), and the whole request's time
    drafts, draft_tokens, accepted_tokens
                           the engine's own speculative counters over the level (None for AR)
    mean_acceptance_length tokens per verify step, the bonus token included: 1 + accepted / drafts (None for AR)
    acceptance_by_position per draft position, the share of drafts whose token there was accepted (None for AR)
    identical_to_baseline  for the method: requests whose tokens equal the baseline's at the same concurrency
                           (None for the baseline and when the baseline's level is missing)
    question_ids           the requests' questions, in submission order
    token_digests          question id (as a string) -> ``token_digest`` of its tokens: the outputs compared across
                           levels and roles without storing them
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
class RequestTiming:
    """One request as the client saw it: seconds from its submission to its first and last token, its tokens."""

    question_id: object
    first_token_s: float
    last_token_s: float
    token_ids: list[int]

    @property
    def time_per_output_token(self) -> float | None:
        if len(self.token_ids) < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (len(self.token_ids) - 1)


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
    acceptance_by_position: list[float] | None = None
    identical_to_baseline: int | None = None
    question_ids: list = field(default_factory=list)
    token_digests: dict = field(default_factory=dict)

    def to_line(self) -> dict:
        return asdict(self)


def token_digest(token_ids) -> str:
    """A short digest of a request's tokens, so load levels compare outputs without storing them."""
    return hashlib.sha256(json.dumps(list(map(int, token_ids))).encode()).hexdigest()[:16]


def summarise_level(concurrency: int, role: str, method: str, requests: list[RequestTiming], duration_s: float,
                    counters: dict | None = None, baseline_tokens: dict | None = None,
                    baseline_digests: dict | None = None) -> LoadLevel:
    """A ``LoadLevel`` from what the client measured (``requests``, ``duration_s``) and the engine's speculative
    ``counters`` ({drafts, draft_tokens, accepted_tokens, accepted_per_position}; None for AR).
    For ``identical_to_baseline``, the baseline at this level: ``baseline_tokens`` (question id -> its tokens) or
    ``baseline_digests`` (its line's ``token_digests``)."""
    if duration_s <= 0:
        raise ValueError(f"a level's duration must be positive, got {duration_s}")
    output_tokens = sum(len(request.token_ids) for request in requests)
    tpots = [tpot for tpot in (request.time_per_output_token for request in requests) if tpot is not None]
    level = LoadLevel(
        concurrency=int(concurrency), role=role, method=method, requests=len(requests), output_tokens=output_tokens,
        duration_s=duration_s, output_tokens_per_s=output_tokens / duration_s,
        requests_per_s=len(requests) / duration_s,
        ttft_s=distribution([request.first_token_s for request in requests]),
        tpot_s=distribution(tpots),
        latency_s=distribution([request.last_token_s for request in requests]),
        question_ids=[request.question_id for request in requests],
        token_digests={str(request.question_id): token_digest(request.token_ids) for request in requests},
    )
    if counters is not None:
        drafts, accepted = int(counters["drafts"]), int(counters["accepted_tokens"])
        level.drafts, level.draft_tokens, level.accepted_tokens = drafts, int(counters["draft_tokens"]), accepted
        if drafts:
            level.mean_acceptance_length = 1 + accepted / drafts
            level.acceptance_by_position = [int(count) / drafts for count in counters["accepted_per_position"]]
    if baseline_tokens is not None:
        baseline_digests = {str(key): token_digest(tokens) for key, tokens in baseline_tokens.items()}
    if baseline_digests is not None:
        level.identical_to_baseline = sum(1 for key, digest in level.token_digests.items()
                                          if baseline_digests.get(key) == digest)
    return level


def read_load_levels(run_dir: str | Path) -> list[dict]:
    """The lines of ``run_dir``'s load.jsonl (none when it has none); a line cut short by an interruption (the
    last, without its newline) is left out, as the level it records is measured again on resume."""
    path = Path(run_dir) / LOAD_FILE
    if not path.is_file():
        return []
    levels = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            levels.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return levels


def finished_levels(run_dir: str | Path) -> set[tuple[int, str]]:
    """(concurrency, role) of every level load.jsonl already holds."""
    return {(int(level["concurrency"]), level["role"]) for level in read_load_levels(run_dir)}
