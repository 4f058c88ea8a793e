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
    return float(np.mean([length for length in accept_lengths if length > 0]))


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


def acceptance_by_position(accept_lengths: Sequence[int], draft_depths: Sequence[int],
                           steps: Sequence[int]) -> list[float]:
    """Acceptance per draft position: entry i - 1 is the share of decoding steps whose verified draft reached
    position i (a chain's i-th token; a tree's depth i) that accepted a token there (accepted path at least i
    deep). The prefill (step 0) is excluded; positions no step reached are left off.

    >>> [round(share, 2) for share in acceptance_by_position([1, 3, 1, 2], [0, 4, 4, 2], [0, 1, 2, 3])]
    [0.67, 0.33, 0.0, 0.0]
    """
    depths = np.array([depth for depth, step in zip(draft_depths, steps) if step > 0], dtype=np.int64)
    accepted = np.array([length - 1 for length, step in zip(accept_lengths, steps) if step > 0], dtype=np.int64)
    reached = depths.max(initial=0)
    return [float(np.mean(accepted[depths >= position] >= position)) for position in range(1, reached + 1)]


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


def answer_accept_lengths(record: dict) -> list[int]:
    """The per-step accept lengths of one model_answer record, every turn."""
    return list(record["choices"][0]["accept_lengths"])


def answer_drafted_tokens(record: dict) -> int | None:
    """Candidate draft tokens verified over all turns of a specbench answer record; None for records that do
    not carry the count (Spec-Bench's own files)."""
    return (record.get("specbench") or {}).get("drafted_tokens")


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
                            drafted: Sequence[int | None], baseline_rates: Sequence[float] | None) -> dict:
    """The statistics of a set of questions from their per-question tokens/s, accept lengths (one list per
    question) and drafted-token counts (None where unknown), and the paired baseline's tokens/s of the same
    questions in the same order when given: questions, tokens_per_s, baseline_tokens_per_s, speedup,
    mean_accepted_tokens, acceptance_rate. Values that need the baseline are None without it; the acceptance
    rate is None when any count is unknown or nothing was drafted."""
    lengths = [length for question in accept_lengths for length in question]
    drafted = list(drafted)
    statistics = {
        "questions": len(rates),
        "tokens_per_s": mean_rate(rates),
        "baseline_tokens_per_s": None,
        "speedup": None,
        "mean_accepted_tokens": mean_accepted_tokens(lengths),
        "acceptance_rate": None if any(count is None for count in drafted)
        else acceptance_rate(accepted_draft_tokens(lengths), sum(drafted)),
    }
    if baseline_rates is not None:
        statistics["baseline_tokens_per_s"] = mean_rate(baseline_rates)
        statistics["speedup"] = speedup(rates, baseline_rates)
    return statistics


def group_statistics(records: Sequence[dict], baseline_records: Sequence[dict] | None) -> dict:
    """The statistics of a set of answer records (one task, or all), and of the paired baseline records of the
    same questions in the same order when given: questions, tokens_per_s, baseline_tokens_per_s, speedup,
    mean_accepted_tokens, acceptance_rate (see ``statistics_of_questions``)."""
    return statistics_of_questions(
        [answer_rate(record) for record in records],
        [answer_accept_lengths(record) for record in records],
        [answer_drafted_tokens(record) for record in records],
        None if baseline_records is None else [answer_rate(record) for record in baseline_records],
    )
