"""The summary as the terminal shows it: an aligned table per task, the lines that must not be missed under it
(a busy machine, GPUs torch could not use, skipped questions), and the loud paragraph naming every violation."""

from __future__ import annotations

from specbench.measure import metrics
from specbench.measure.floor import describe_curve
from specbench.results.schema import SKIP_CAUSES
from specbench.results.summary import skip_counts

SHOWN_POSITIONS = 8  # draft positions printed under the summary table; summary.json holds them all


def format_summary_table(summary: dict) -> str:
    """The summary as an aligned text table, one row per task and one for overall. ``exact`` reads
    identical / near-tie / violation counts out of the questions ("-" without a baseline)."""

    def show(value, fmt: str, suffix: str = "") -> str:
        return "-" if value is None else format(value, fmt) + suffix

    def exact(stats) -> str:
        if stats["identical_to_baseline"] is None:
            return "-"
        if stats.get("near_ties") is None:  # sampling: outputs are not expected to be identical
            return f"{stats['identical_to_baseline']}/{stats['questions']} (sampled)"
        return f"{stats['identical_to_baseline']}/{stats.get('near_ties', 0)}/{stats.get('violations', 0)}"

    header = ("task", "questions", "exact", "speedup", "per-q", "MAT", "MAL", "accept", "TPOT ms", "p90",
              "tok/s", "AR tok/s")
    rows = [header]
    for task, stats in summary["tasks"].items():
        rows.append((
            task,
            str(stats["questions"]),
            exact(stats),
            show(stats["speedup"], ".2f", "x"),
            show(stats.get("speedup_mean_of_ratios"), ".2f", "x"),
            show(stats["mean_accepted_tokens"], ".2f"),
            show(stats.get("mean_acceptance_length"), ".2f"),
            show(stats.get("acceptance_rate"), ".2f"),
            show(stats.get("tpot_ms"), ".1f"),
            show(stats.get("tpot_p90_ms"), ".1f"),
            show(stats["tokens_per_s"], ".1f"),
            show(stats["baseline_tokens_per_s"], ".1f"),
        ))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                       for column, (cell, width) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    positions = (summary["tasks"].get("overall") or {}).get("acceptance_by_position")
    if positions:
        shown = " ".join(f"{share:.2f}" for share in positions[:SHOWN_POSITIONS])
        more = f" (of {len(positions)})" if len(positions) > SHOWN_POSITIONS else ""
        lines.append(f"acceptance by draft position 1-{min(len(positions), SHOWN_POSITIONS)}{more}, overall: {shown}")
    curve = describe_curve(summary.get("cost_curve") or {})
    if curve:
        lines.append(f"cost of a pass: {curve}")
    lines += ["exact = identical / near-tie / violation (see specbench.measure.mismatch); speedup = mean tok/s over mean AR "
              "tok/s (Spec-Bench);",
              "per-q = mean of per-question speedups; MAT = mean accepted tokens per target pass, prefill and bonus "
              "token included;",
              "MAL = vLLM's mean acceptance length (1 + accepted / drafts); accept = accepted / drafted tokens; TPOT = "
              "ms per output token",
              "(mean over questions, p90 its 90th percentile); docs/measurement.md defines each"]
    return "\n".join(lines + summary_flags(summary))


def summary_flags(summary: dict, shown: int = 5) -> list[str]:
    """Lines that must not be missed under a summary table: timings taken on a busy machine (the numbers stay,
    flagged), questions with stalls inside them (``stall_flags``), a run on the CPU of a machine whose GPUs torch could not use, and questions skipped (how many, by
    cause, and the first few with their reasons)."""
    lines = []
    unused = (summary.get("environment") or {}).get("gpus_not_used")
    if unused:
        lines.append(f"RAN ON THE CPU: nvidia-smi lists {len(unused['listed'])} GPU(s) ({'; '.join(unused['listed'])}) "
                     f"that torch could not use: {unused['reason']}")
    timing = summary.get("timing") or {}
    if timing and not timing.get("trustworthy", True):
        warnings = timing.get("warnings", [])
        lines.append(f"TIMINGS UNTRUSTWORTHY (busy machine, {len(warnings)} warning(s)): "
                     + "; ".join(warnings[:shown]) + (" ..." if len(warnings) > shown else ""))
    lines += stall_flags(timing.get("stalls") or {}, shown)
    skipped = summary.get("skipped") or []
    if skipped:
        counted = ", ".join(f"{count} {SKIP_CAUSES.get(cause, cause)}" for cause, count in skip_counts(skipped).items())
        lines.append(f"skipped {len(skipped)} question(s): "
                     + "; ".join(f"{record['question_id']}: {record['reason']}" for record in skipped[:shown])
                     + (" ..." if len(skipped) > shown else "") + f" ({counted})")
    return lines


def stall_flags(stalls: dict, shown: int = 5) -> list[str]:
    """The lines of the summary's ``timing.stalls`` (``specbench.measure.stalls``): the questions whose stalled
    steps lost a material share of their time (kept, flagged), and how many could not be checked."""
    lines = []
    stalled = stalls.get("stalled_questions") or []
    if stalled:
        names = ", ".join(map(str, stalled[:shown])) + (" ..." if len(stalled) > shown else "")
        lines.append(f"STALLED: {len(stalled)} question(s) lost more than run.stall_share of their time to stalled "
                     f"steps ({names}): kept and flagged; python -m analysis tables --leave-out-stalled leaves them "
                     "out")
    if stalls.get("not_measured"):
        lines.append(f"stalls inside a question: not measured for {stalls['not_measured']} question(s) (the engine "
                     "records no per-step times)")
    if stalls.get("not_checked"):
        lines.append(f"stalls inside a question: not checked for {stalls['not_checked']} question(s) (recorded "
                     "before specbench checked for them)")
    return lines


def violation_report(summary: dict, answers: list[dict]) -> str | None:
    """A loud paragraph naming every answer whose difference from the baseline is a violation, or None."""
    bad = [record for record in answers if metrics.answer_mismatch_kind(record) == "violation"]
    if not bad:
        return None
    lines = [f"LOSSLESSNESS VIOLATION: {len(bad)} answer(s) differ from the baseline beyond a numerical near-tie:"]
    for record in bad:
        found = record["specbench"]["mismatch"]
        lines.append(f"  question {record['question_id']} turn {found['turn'] + 1}, token {found['index']}: method "
                     f"{found['method_token']} vs baseline {found['baseline_token']} (logit margins: method "
                     f"{found['method_margin']}, baseline {found['baseline_margin']})")
    return "\n".join(lines)
