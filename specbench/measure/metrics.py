"""The metrics specbench reports, each defined once, here; records, analysis and scripts all call these.

They follow Spec-Bench's ``evaluation/speed.py``:

* tokens/s of a question: all its turns' new tokens over all its turns' wall time;
* tokens/s of a set of questions: the mean of the per-question rates (not total tokens over total time);
* speedup: mean method tokens/s over mean baseline tokens/s, over the same questions (a ratio of means, not a
  mean of per-question ratios);
* MAT (mean accepted tokens): the mean of every per-step accept length of every question, where a step is
  one forward pass of the target, the prefill included, and an accept length counts the bonus token (so
  plain decoding has MAT 1.00 exactly). A prefill that settles nothing (a drafter whose first draft comes from
  the prompt: ``Drafter.first_draft_from_prompt``) is not a step of its own: its originals read the prompt and
  verify the first draft in one pass (PLD, SpS) or leave the prompt pass out of their counts (Token Recycling).

One deliberate difference: speed.py counts the baseline's tokens by re-tokenising its answer text (minus one
token per turn) while it takes the method's ``new_tokens`` as recorded; specbench counts the generated token
ids on both sides (``new_tokens``), so an identical answer gets an identical count. The speedups therefore
differ from speed.py's only by that re-tokenisation.

Three more, which speed.py does not have:

* acceptance rate: accepted draft tokens over drafted (candidate) tokens verified, the bonus token excluded;
* accepted tokens per decoding step: like MAT but over decoding steps only (the prefill excluded), the
  quantity in the throughput model of "Decoding Speculative Decoding", where a step is draft + verify;
* draft seconds per decoding step: the drafter's time per step, over decoding steps only (the prefill drafts
  nothing).

The definitions other tools use, under their names, for comparisons with them:

* speedup as a mean of per-question ratios (``speedup_mean_of_ratios``): each question's tokens/s over its
  baseline's, averaged. Spec-Bench's speed.py takes the ratio of the means (``speedup`` above); the two differ
  when questions' lengths and speedups vary together (Spec-Bench issue #29), so both are reported;
* vLLM's mean acceptance length (``mean_acceptance_length``): 1 + accepted draft tokens / drafts, where a
  draft is a decoding step that verified at least one draft token (vllm/v1/spec_decode/metrics.py,
  ``SpecDecodingLogging.log``; the scheduler observes a draft only for a request with draft tokens). It differs
  from MAT in two ways: the prefill is not a step (MAT counts it, with the one token it settles), and neither
  is a step whose drafter proposed nothing (MAT counts it with its bonus token); both count the bonus token.
  vLLM's draft acceptance rate is ``acceptance_rate`` above (accepted over drafted tokens), the same quantity;
* vLLM's per-position acceptance rate (``per_position_acceptance_rate``): accepted draft tokens at position i
  over all drafts, so it can only fall with i (what vLLM's ``vllm bench`` reports per position, and the figure
  of a run under load, load.jsonl); ``acceptance_by_position`` divides by the drafts that reached position i
  instead, which tells a drafter's deep guesses apart from its short drafts. Two names for two definitions, in
  every file: they agree at position 1 and part from position 2 on for a drafter whose drafts vary in depth;
* vLLM's acceptance histogram (``acceptance_histogram``): entry j counts the drafts that accepted exactly j
  draft tokens (vLLM's per-request ``acceptance_histogram`` of ``--per-request-spec-decode-metrics``, vLLM
  pull request #48915: "index j is the number of verify steps that accepted exactly j draft tokens"), up to
  the deepest draft (vLLM's ``num_spec_tokens``). Of one request's steps it is that request's; of a set of
  requests, the sum of theirs;
* time per output token (TPOT, ``time_per_output_token_ms``): a question's wall time over its new tokens (all
  turns), in ms, with its mean and percentiles over questions. vLLM's benchmark leaves the first token's time
  out of it ((latency - TTFT) / (tokens - 1), ``time_per_output_token_after_first``, the figure of a run under
  load); specbench's includes the prefill, so a long prompt raises it;
* throughput under load (``throughput``): a load level's output tokens, or its requests, over the seconds from
  its first submission to its last completion (vLLM's benchmark's output throughput and request rate).

vLLM's three draft figures describe the same drafts, so they obey identities that NVIDIA's specdec_bench
checks on every run: the mean acceptance length is 1 + the sum of the per-position rates (a draft that accepted
n tokens counts once at each of positions 1..n), the histogram counts every draft once, and its tail from j is
the per-position rate at j. ``statistics_of_questions`` checks them wherever it computes the figures
(``check_acceptance_identities``) and raises ``AcceptanceFiguresDisagree`` when they fail: one of the
definitions has changed, or a step accepted more draft tokens than its recorded draft depth (a depth recorded
wrong), which ``_drafted_steps`` refuses first.

And the counts that say whether a set of answers is lossless: questions identical to the baseline, and of
the others those whose first differing token was a near-tie (the target's top two choices so close that
floating-point noise can swap them) or a violation (a real difference, which lossless decoding must not give).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def tokens_per_second(new_tokens: Sequence[int], wall_times: Sequence[float]) -> float:
    """One question's rate: the sum of its turns' new tokens over the sum of their wall times.

    >>> tokens_per_second([30, 10], [2.0, 2.0])
    10.0
    """
    return float(sum(new_tokens)) / float(sum(wall_times))


def mean_rate(per_question_rates: Iterable[float]) -> float:
    """Tokens/s of a set of questions: the mean of their per-question rates."""
    return float(np.mean(list(per_question_rates)))


def speedup(method_rates: Sequence[float], baseline_rates: Sequence[float]) -> float:
    """Mean method tokens/s over mean baseline tokens/s (per-question rates of the same questions).

    >>> speedup([20.0, 40.0], [10.0, 20.0])
    2.0
    """
    baseline = mean_rate(baseline_rates)
    return mean_rate(method_rates) / baseline if baseline > 0 else float("nan")


def mean_accepted_tokens(accept_lengths: Iterable[int]) -> float:
    """MAT: the mean over every step (prefill included) of the tokens it appended, bonus token included.

    >>> mean_accepted_tokens([1, 3, 2, 2])
    2.0
    >>> mean_accepted_tokens([0, 3, 1])  # a prefill that settled nothing is not a step
    2.0
    """
    steps = [length for length in accept_lengths if length > 0]
    return float(np.mean(steps)) if steps else float("nan")  # NaN, not numpy's warning, for no steps at all


def acceptance_rate(accepted_draft_tokens: int, drafted_tokens: int) -> float | None:
    """Accepted draft tokens (bonus excluded) over candidate draft tokens verified; None when nothing was
    drafted (plain decoding).

    >>> acceptance_rate(3, 12)
    0.25
    """
    return None if drafted_tokens == 0 else accepted_draft_tokens / drafted_tokens


def accepted_draft_tokens(accept_lengths: Iterable[int]) -> int:
    """Draft tokens accepted over a set of steps: every step's accept length minus its one bonus token (a
    prefill that settled nothing has none).

    >>> accepted_draft_tokens([1, 3, 2])
    3
    >>> accepted_draft_tokens([0, 3])
    2
    """
    return int(sum(length - 1 for length in accept_lengths if length > 0))


def acceptance_by_position(accept_lengths: Sequence[int], draft_depths: Sequence[int]) -> list[float]:
    """Acceptance per draft position: entry i - 1 is the share of steps whose verified draft reached position i
    (a chain's i-th token; a tree's depth i) that accepted a token there (accepted path at least i deep).
    Steps without a draft (the prefill, an empty draft) reach no position; positions no step reached are left
    off.

    >>> [round(share, 2) for share in acceptance_by_position([1, 3, 1, 2], [0, 4, 4, 2])]
    [0.67, 0.33, 0.0, 0.0]
    """
    depths, accepted = _drafted_steps(accept_lengths, draft_depths)
    reached = depths.max(initial=0)
    return [float(np.mean(accepted[depths >= position] >= position)) for position in range(1, reached + 1)]


def per_position_acceptance_rate(accept_lengths: Sequence[int], draft_depths: Sequence[int]) -> list[float]:
    """vLLM's per-position acceptance rate: entry i - 1 is the number of drafts (steps with a draft) that
    accepted a token at position i, over all drafts; up to the deepest draft's position.

    >>> [round(share, 2) for share in per_position_acceptance_rate([1, 3, 1, 2], [0, 4, 4, 2])]
    [0.67, 0.33, 0.0, 0.0]
    >>> per_position_acceptance_rate([1, 3, 2], [0, 4, 1])
    [1.0, 0.5, 0.0, 0.0]
    """
    depths, accepted = _drafted_steps(accept_lengths, draft_depths)
    reached = depths.max(initial=0)
    return [float(np.mean(accepted >= position)) for position in range(1, reached + 1)]


def mean_acceptance_length(accept_lengths: Sequence[int], draft_depths: Sequence[int]) -> float:
    """vLLM's mean acceptance length: 1 + accepted draft tokens over drafts (steps that verified a draft);
    1.0 without drafts, as vLLM's ``compute_acceptance_len``.

    >>> mean_acceptance_length([1, 3, 1, 2, 1], [0, 4, 4, 2, 0])  # 1 + (2 + 0 + 1) / 3
    2.0
    >>> mean_acceptance_length([1, 1], [0, 0])
    1.0
    """
    _, accepted = _drafted_steps(accept_lengths, draft_depths)
    return 1.0 + float(accepted.mean()) if accepted.size else 1.0


def acceptance_histogram(accept_lengths: Sequence[int], draft_depths: Sequence[int]) -> list[int]:
    """vLLM's acceptance histogram: entry j is the number of drafts (steps that verified a draft) that accepted
    exactly j draft tokens, for j from 0 to the deepest draft's depth; [] without drafts.

    >>> acceptance_histogram([1, 3, 1, 2, 1], [0, 4, 4, 2, 0])  # drafts accepting 2, 0 and 1 of 4, 4, 2
    [1, 1, 1, 0, 0]
    >>> acceptance_histogram([1, 1], [0, 0])
    []
    """
    depths, accepted = _drafted_steps(accept_lengths, draft_depths)
    if not depths.size:
        return []
    return np.bincount(accepted, minlength=int(depths.max()) + 1).tolist()


class AcceptanceFiguresDisagree(RuntimeError):
    """vLLM's acceptance figures of one set of steps break the identities that bind them: a bug in specbench
    (a changed definition), never a user's error."""


def check_acceptance_identities(mean_length: float, per_position: Sequence[float], histogram: Sequence[int]) -> None:
    """Raise ``AcceptanceFiguresDisagree`` unless vLLM's figures of one set of steps agree as their definitions
    make them: mean acceptance length = 1 + the sum of the per-position rates (specdec_bench's check); the
    histogram's mean accepted count = mean acceptance length - 1; the histogram's tail from j, over its
    drafts, = the per-position rate at j; as many histogram entries as positions + 1. Without drafts: length
    1.0, no positions, an empty histogram.

    >>> check_acceptance_identities(2.0, [2 / 3, 1 / 3, 0.0, 0.0], [1, 1, 1, 0, 0])
    >>> check_acceptance_identities(2.5, [2 / 3, 1 / 3], [1, 1, 1])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    specbench.measure.metrics.AcceptanceFiguresDisagree: vLLM's mean acceptance length 2.5 is not 1 + the sum of ...
    """
    rates, counts = np.asarray(per_position, dtype=np.float64), np.asarray(histogram, dtype=np.int64)
    drafts = int(counts.sum())
    problems = []
    if not np.isclose(mean_length, 1.0 + rates.sum(), rtol=1e-9, atol=1e-12):
        shown = ", ".join(f"{rate:.4f}" for rate in rates)
        problems.append(f"vLLM's mean acceptance length {mean_length:g} is not 1 + the sum of its per-position "
                        f"rates [{shown}] ({1.0 + rates.sum():g})")
    if counts.size != (rates.size + 1 if rates.size else 0):
        problems.append(f"the acceptance histogram has {counts.size} entries for {rates.size} draft positions "
                        "(one per accepted count 0..deepest draft)")
    elif drafts:
        histogram_mean = float((np.arange(counts.size) * counts).sum()) / drafts
        if not np.isclose(mean_length, 1.0 + histogram_mean, rtol=1e-9, atol=1e-12):
            problems.append(f"the acceptance histogram {counts.tolist()} gives a mean acceptance length of "
                            f"{1.0 + histogram_mean:g}, not {mean_length:g}")
        tails = counts[::-1].cumsum()[::-1][1:] / drafts
        if not np.allclose(tails, rates, rtol=1e-9, atol=1e-12):
            problems.append(f"the acceptance histogram {counts.tolist()} gives per-position rates "
                            f"{[round(float(t), 4) for t in tails]}, not {[round(float(r), 4) for r in rates]}")
    if problems:
        raise AcceptanceFiguresDisagree("; ".join(problems))


def _drafted_steps(accept_lengths: Sequence[int], draft_depths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The draft depths and accepted draft tokens (accept length minus the bonus token) of the steps that
    verified a draft (depth > 0), in order. A ValueError when a step accepted more draft tokens than its draft
    was deep, or a step without a draft more than its bonus token: no loop can, so its depths were recorded
    wrong (a node count, another step's), and every per-position figure would be too."""
    if len(accept_lengths) != len(draft_depths):
        raise ValueError(f"{len(accept_lengths)} accept lengths but {len(draft_depths)} draft depths")
    depths = np.asarray(draft_depths, dtype=np.int64)
    lengths = np.asarray(accept_lengths, dtype=np.int64)
    beyond = np.flatnonzero(lengths > depths + 1)
    if beyond.size:
        step = int(beyond[0])
        raise ValueError(f"step {step} (of {lengths.size}) appended {lengths[step]} tokens after a draft "
                         f"{depths[step]} deep: at most depth + 1 (the bonus token) can be appended")
    drafted = depths > 0
    return depths[drafted], lengths[drafted] - 1


def speedup_mean_of_ratios(method_rates: Sequence[float], baseline_rates: Sequence[float]) -> float:
    """The mean over questions of each question's tokens/s over its baseline's (the other common definition;
    ``speedup`` is Spec-Bench's ratio of means).

    >>> speedup_mean_of_ratios([20.0, 40.0], [10.0, 40.0])  # (2 + 1) / 2; the ratio of means says 60/50
    1.5
    """
    ratios = [method / baseline for method, baseline in zip(method_rates, baseline_rates, strict=True)]
    return float(np.mean(ratios)) if ratios and all(np.isfinite(ratios)) else float("nan")


def time_per_output_token_ms(rate: float) -> float:
    """A question's time per output token in ms, from its tokens/s (all turns' wall time over new tokens).

    >>> time_per_output_token_ms(40.0)
    25.0
    """
    return 1000.0 / rate


def time_per_output_token_after_first(first_token_s: float, last_token_s: float, tokens: int) -> float | None:
    """vLLM's benchmark's time per output token of one request: the seconds from its first token to its last over
    the tokens after the first; None for a request of one token (or none), which has no such time.

    >>> time_per_output_token_after_first(0.25, 1.75, 4)  # 1.5 s over the 3 tokens after the first
    0.5
    """
    if tokens < 2:
        return None
    return (last_token_s - first_token_s) / (tokens - 1)


def throughput(count: int, seconds: float) -> float:
    """Output tokens, or requests, per second of a load level: ``count`` over the seconds from the level's first
    submission to its last completion (vLLM's benchmark's output throughput and request throughput).

    >>> throughput(120, 2.0)
    60.0
    """
    return count / seconds


TPOT_PERCENTILES = (50, 90, 99)  # vLLM's benchmark prints the median and p99 by default; p90 sits between


def tpot_statistics(per_question_rates: Sequence[float]) -> dict:
    """Mean time per output token over questions (``tpot_ms``) and its percentiles (``tpot_p50_ms`` ...,
    numpy's linear interpolation, as vLLM's benchmark), from per-question tokens/s.

    >>> tpot_statistics([10.0, 20.0, 40.0])
    {'tpot_ms': 58.333333333333336, 'tpot_p50_ms': 50.0, 'tpot_p90_ms': 90.0, 'tpot_p99_ms': 99.0}
    """
    values = np.array([time_per_output_token_ms(rate) for rate in per_question_rates], dtype=np.float64)
    statistics = {"tpot_ms": float(values.mean())}
    for percentile in TPOT_PERCENTILES:
        statistics[f"tpot_p{percentile}_ms"] = float(np.percentile(values, percentile))
    return statistics


def draft_seconds_per_step(draft_seconds: Sequence[float], steps: Sequence[int]) -> float:
    """Mean time in the drafter per decoding step, the prefill (step 0) excluded; NaN without decoding steps.

    >>> draft_seconds_per_step([0.0, 0.002, 0.004], [0, 1, 2])
    0.003
    """
    return _mean_over_decoding_steps(draft_seconds, steps)


def accepted_per_decoding_step(accepted_tokens: Sequence[int], steps: Sequence[int]) -> float:
    """Mean accepted tokens (bonus included) over decoding steps, the prefill (step 0) excluded.

    >>> accepted_per_decoding_step([1, 3, 1, 2], [0, 1, 2, 3])
    2.0
    """
    return _mean_over_decoding_steps(accepted_tokens, steps)


def _mean_over_decoding_steps(values: Sequence[float], steps: Sequence[int]) -> float:
    """The mean of ``values`` over the steps after the prefill (step > 0); NaN when there are none."""
    kept = [value for value, step in zip(values, steps) if step > 0]
    return float(np.mean(kept)) if kept else float("nan")


def answer_rate(record: dict) -> float:
    """tokens/s of one model_answer record (specbench's or Spec-Bench's schema)."""
    choice = record["choices"][0]
    return tokens_per_second(choice["new_tokens"], choice["wall_time"])


def answer_decoding_rate(record: dict) -> float | None:
    """tokens/s of one model_answer record after each turn's prefill: the new tokens but each turn's first (the
    prefill's own) over the wall time less the prefill seconds (``specbench.prefill_s``). A record without them
    (written before they were, Spec-Bench's own, or without timings) gives ``answer_rate``. None when there is no
    time or no token to divide.

    Example: 21 tokens in 2.72 s with a 1.39 s prefill -> 20 / 1.33 = 15.0 tok/s (``answer_rate``: 7.7)."""
    choice = record["choices"][0]
    tokens, seconds = sum(choice["new_tokens"]), sum(choice["wall_time"])
    prefill = (record.get("specbench") or {}).get("prefill_s")
    if prefill and len(prefill) == len(choice["wall_time"]) and all(isinstance(part, (int, float)) for part in prefill):
        tokens, seconds = tokens - len(prefill), seconds - sum(prefill)
    return tokens_per_second([tokens], [seconds]) if seconds > 0 and tokens > 0 else None


def answer_accept_lengths(record: dict) -> list[int]:
    """The per-step accept lengths of one model_answer record, every turn."""
    return list(record["choices"][0]["accept_lengths"])


def answer_drafted_tokens(record: dict) -> int | None:
    """Candidate draft tokens verified over all turns of a specbench answer record; None for records that do
    not carry the count (Spec-Bench's own files)."""
    return (record.get("specbench") or {}).get("drafted_tokens")


def answer_draft_depths(record: dict) -> list[int] | None:
    """The per-step draft depths of a specbench answer record (every turn, parallel to its accept lengths: 0
    for a step without a draft); None for records that do not carry them (written before specbench recorded
    them, Spec-Bench's own files)."""
    return (record.get("specbench") or {}).get("draft_depths")


def answer_mismatch_kind(record: dict) -> str | None:
    """How a specbench answer record first differs from its baseline: "near_tie", "violation" or "not_checked"
    (a sampling run); None when it does not differ, or when the record does not say."""
    return ((record.get("specbench") or {}).get("mismatch") or {}).get("kind")


def exactness_counts(identical: Sequence[bool | None], mismatch_kinds: Sequence[str | None]) -> dict:
    """Of a set of questions (their identical_to_baseline flags and mismatch kinds, in the same order): how many
    are identical to the baseline, and how many of the others differ at a near-tie or by a violation.

    ``identical`` is None when any flag is unknown (no baseline). ``near_ties`` and ``violations`` are None
    when that is, when any question was not checked (sampling), or when a differing question does not say
    how it differs (records written before the kind was recorded).

    >>> exactness_counts([True, False, False], [None, "near_tie", "violation"])
    {'identical': 1, 'near_ties': 1, 'violations': 1}
    >>> exactness_counts([True, False], [None, None])
    {'identical': 1, 'near_ties': None, 'violations': None}
    """
    flags, kinds = list(identical), list(mismatch_kinds)
    if any(flag is None for flag in flags):
        return {"identical": None, "near_ties": None, "violations": None}
    counts = {"identical": sum(bool(flag) for flag in flags), "near_ties": None, "violations": None}
    unexplained = any(not flag and kind is None for flag, kind in zip(flags, kinds))
    if not unexplained and "not_checked" not in kinds:
        counts["near_ties"] = kinds.count("near_tie")
        counts["violations"] = kinds.count("violation")
    return counts


def statistics_of_questions(rates: Sequence[float], accept_lengths: Sequence[Sequence[int]],
                            drafted: Sequence[int | None], baseline_rates: Sequence[float] | None,
                            draft_depths: Sequence[Sequence[int] | None] | None = None) -> dict:
    """The statistics of a set of questions from their per-question tokens/s, accept lengths (one list per
    question), drafted-token counts (None where unknown) and draft depths (one list per question, parallel to
    its accept lengths; None where unknown), and the paired baseline's tokens/s of the same questions in the
    same order when given: questions, tokens_per_s, baseline_tokens_per_s, speedup, speedup_mean_of_ratios,
    mean_accepted_tokens, acceptance_rate, mean_acceptance_length, acceptance_by_position,
    per_position_acceptance_rate, acceptance_histogram (the sum of the questions' own), and the time per output
    token (``tpot_statistics``). Values that need the baseline are None without it; the acceptance rate is None
    when any count is unknown or nothing was drafted; the vLLM and per-position figures are None when any
    question's draft depths are unknown (records written before they were recorded, Spec-Bench's own files),
    and checked against each other otherwise (``check_acceptance_identities``)."""
    lengths = [length for question in accept_lengths for length in question]
    drafted = list(drafted)
    depths = None if draft_depths is None or any(question is None for question in draft_depths) \
        else [depth for question in draft_depths for depth in question]
    statistics = {
        "questions": len(rates),
        "tokens_per_s": mean_rate(rates),
        "baseline_tokens_per_s": None,
        "speedup": None,
        "speedup_mean_of_ratios": None,
        "mean_accepted_tokens": mean_accepted_tokens(lengths),
        "acceptance_rate": None if any(count is None for count in drafted)
        else acceptance_rate(accepted_draft_tokens(lengths), sum(drafted)),
        "mean_acceptance_length": None if depths is None else mean_acceptance_length(lengths, depths),
        "acceptance_by_position": None if depths is None else acceptance_by_position(lengths, depths),
        "per_position_acceptance_rate": None if depths is None else per_position_acceptance_rate(lengths, depths),
        "acceptance_histogram": None if depths is None else acceptance_histogram(lengths, depths),
        **tpot_statistics(rates),
    }
    if depths is not None:
        check_acceptance_identities(statistics["mean_acceptance_length"], statistics["per_position_acceptance_rate"],
                                    statistics["acceptance_histogram"])
    if baseline_rates is not None:
        statistics["baseline_tokens_per_s"] = mean_rate(baseline_rates)
        statistics["speedup"] = speedup(rates, baseline_rates)
        statistics["speedup_mean_of_ratios"] = speedup_mean_of_ratios(rates, baseline_rates)
    return statistics


def group_statistics(records: Sequence[dict], baseline_records: Sequence[dict] | None) -> dict:
    """The statistics of a set of answer records (one task, or all), and of the paired baseline records of the
    same questions in the same order when given (see ``statistics_of_questions``)."""
    return statistics_of_questions(
        [answer_rate(record) for record in records],
        [answer_accept_lengths(record) for record in records],
        [answer_drafted_tokens(record) for record in records],
        None if baseline_records is None else [answer_rate(record) for record in baseline_records],
        [answer_draft_depths(record) for record in records],
    )
