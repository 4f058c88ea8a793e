"""summary.json's statistics: per task and overall (``specbench.measure.metrics``: Spec-Bench's definitions),
how many answers are identical to the baseline, and the questions skipped by cause. Read from the answer records
alone, so a run whose steps carry no per-phase times (an engine without per-step timings) summarizes alike."""

from __future__ import annotations

from collections import Counter

from specbench.measure import metrics
from specbench.questions import ALL_TASKS
from specbench.results.question_keys import question_key
from specbench.results.schema import SUMMARY_KEYS


def summarize(answers: list[dict], baseline_answers: list[dict] | None) -> dict:
    """Per-task and overall statistics (``specbench.measure.metrics.group_statistics``: Spec-Bench's definitions),
    with, when there is a baseline, how many answers are identical to it and how many differ at a near-tie
    or by a violation (``specbench.measure.mismatch``)."""
    baseline_by_id = {question_key(record["question_id"]): record for record in baseline_answers or []}
    groups: dict[str, list[dict]] = {}
    for record in answers:
        groups.setdefault(record["specbench"]["task"], []).append(record)
    ordered = [task for task in ALL_TASKS if task in groups]
    result = {task: _group_summary(groups[task], baseline_by_id, baseline_answers is not None) for task in ordered}
    if answers:
        result["overall"] = _group_summary(answers, baseline_by_id, baseline_answers is not None)
    return result


def _group_summary(records: list[dict], baseline_by_id: dict, with_baseline: bool) -> dict:
    baseline = [baseline_by_id[question_key(record["question_id"])] for record in records] if with_baseline else None
    statistics = metrics.group_statistics(records, baseline)
    identical = [r["specbench"]["identical_to_baseline"] if with_baseline else None for r in records]
    counts = metrics.exactness_counts(identical, [metrics.answer_mismatch_kind(r) for r in records])
    statistics.update(identical_to_baseline=counts["identical"], near_ties=counts["near_ties"],
                      violations=counts["violations"])
    return {key: statistics[key] for key in SUMMARY_KEYS}


def skip_counts(skipped: list[dict]) -> dict[str, int]:
    """How many skipped-question records there are of each cause (SKIP_CAUSES), in order of first appearance."""
    return dict(Counter(record.get("cause", "too_long") for record in skipped))
