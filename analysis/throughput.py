"""The simplified throughput model of "Decoding Speculative Decoding" (Yan, Agarwal, Venkataraman), checked as
the paper checks it: each run's decoding throughput is predicted from a target latency measured outside that
run, and compared with the run's measured throughput.

Over a run's decoding steps (the prefill, step 0, excluded):

    measured  = sum(accepted_tokens) / sum(draft_s + verify_s      + overhead_s)
    predicted = sum(accepted_tokens) / sum(draft_s + T_target(step) + overhead_s)
    DSD form  = accepted tokens per step / (draft_s per step + T_target per step)

``draft_s`` (DSD's gamma x T_draft: the drafter's propose + accept, 0 for a database drafter that takes no
time) and ``overhead_s`` (inputs, the acceptance walk, KV-cache upkeep) are the run's own measured inputs,
as DSD takes the draft's latency as measured. Only the target's latency is predicted, at the step's
``verify_tokens`` (the shape actually run, root and padding included), from one of two tables measured
outside the run, looked up without fitting a line (the hardware need not be linear in the token count):

* calibration: the run's ``verify_latency.json``, timed at its start on the first question's prompt;
* leave-one-out: the mean ``verify_s`` per ``verify_tokens`` over the decoding steps of the *other* runs of
  the same model, device, dtype and threads (none when there is no other run; see ``same_latency`` for the
  other settings that must match), plus a context term: attention
  costs time in proportion to the context a pass attends to, so a step at context c is predicted as
  table(q) + slope * (c - mean context of the other runs' steps at q), with the slope fitted on the other
  runs' steps within each token count (measured on a 2-core CPU: about 26 us per context token for the
  embedded model, i.e. +16 ms at 600 tokens on a 60 ms pass).

The DSD form is the paper's own expression, without the overhead; beside the prediction it shows what the
overhead is worth. ``requirements`` asks what a run would need to match the fastest run of its model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.runs import flat_settings, read_run_json, read_summary, timed_steps, timing_flag
from specbench.decoding.budget import interpolate_latency
from specbench.errors import SpecbenchError
from specbench.measure.metrics import accepted_per_decoding_step
from specbench.results.readers import read_json_file
from specbench.run.identity import PLACEMENT_KEYS, REGIME_KEYS

log = logging.getLogger(__name__)

WAYS = {"calibration": "calib", "leave-one-out": "loo"}  # way of predicting T_target -> column prefix
HARDWARE_KEYS = ("device", "dtype", "threads")  # with the model: which runs share a latency table
# The other flattened settings (``analysis.runs.flat_settings``) that change how long a target pass takes, and
# so must also match for runs to share a latency table: the weights and model shape, the machine, the kernels
# (linear backend, torch and transformers versions), how the run was placed (processes, placement, devices and
# the kernels ``auto`` chose: ``specbench.run.identity``), and what a verify pass computes besides the forward pass
# (the top-k kept on the host, sampling instead of argmax). The drafter and the question set do not: the
# table is per verified-token count, and the context term covers the contexts.
LATENCY_KEYS = ("model_source", "weights_fingerprint", "environment.device_name", "environment.torch",
                "environment.transformers", "run.linear_backend", "run.target_top_k", "run.mismatch_top_k",
                "run.temperature", "run.top_p", *PLACEMENT_KEYS, *(f"run.{key}" for key in REGIME_KEYS))
LATENCY_PREFIXES = ("model_config.",)
TABLE_COLUMNS = ["model", "label", "timing", "run_dir", *HARDWARE_KEYS, "steps", "tokens_per_step", "draft_ms",
                 "verify_ms", "overhead_ms", "measured_tps",
                 "calib_target_ms", "calib_tps", "calib_dev",
                 "loo_target_ms", "loo_tps", "loo_dev", "loo_runs", "loo_outside", "loo_context_us",
                 "reference", "reference_target_ms", "dsd_form_tps", "trustworthy", "timing_warnings"]
# timing: "UNTRUSTED" for a run timed on a busy machine (summary.json's timing), "ok", or "unchecked"
SHOWN_COLUMNS = ["model", "label", "timing", "tokens_per_step", "draft_ms", "verify_ms", "calib_target_ms",
                 "loo_target_ms", "overhead_ms", "measured_tps", "calib_tps", "loo_tps", "calib_dev", "loo_dev",
                 "dsd_form_tps", "loo_outside"]  # what the command line and the report print


def read_run_facts(run_dir) -> dict:
    """What a prediction needs from a run directory besides its steps: device, dtype and threads from
    ``run.json`` (None when absent), the other settings that change a target pass's latency (``LATENCY_KEYS``,
    flattened, as far as recorded) and the calibration table from ``verify_latency.json`` (verified tokens ->
    seconds; empty when the run did not calibrate, or with a warning when that file is damaged)."""
    path = Path(run_dir)
    settings = read_run_json(path)
    environment = None
    if (path / "summary.json").is_file():  # schema 2 recorded the software and the device's name there
        environment = read_summary(path).get("environment")
    flat = flat_settings(settings, environment if isinstance(environment, dict) else None)
    latency = {key: value for key, value in flat.items() if key in LATENCY_KEYS or key.startswith(LATENCY_PREFIXES)}
    if settings:  # run.json records run.regime off eager only: a run without it ran eagerly, and never shares a
        latency.setdefault("run.regime", "eager")  # table with a compiled one
    return {**{key: settings.get(key) for key in HARDWARE_KEYS}, "latency_settings": latency,
            "calibration": read_calibration(path / "verify_latency.json")}


def read_calibration(latency_file: Path) -> dict[int, float]:
    """verify_latency.json's table (verified tokens -> seconds); empty when there is none, and, with a warning
    naming the file, when it is damaged: the run is then predicted by the leave-one-out table only."""
    if not latency_file.is_file():
        return {}
    try:
        measured = read_json_file(latency_file, "run's verify-latency calibration")["latency_s"]
        return {int(count): float(seconds) for count, seconds in measured.items()}
    except SpecbenchError as error:
        log.warning("%s: the run's calibration is left out", error)
    except (KeyError, TypeError, ValueError, AttributeError):
        log.warning("%s has no table of token counts and seconds under latency_s: the run's calibration is left out",
                    latency_file)
    return {}


def same_latency(facts: dict, other: dict) -> bool:
    """Whether two runs' target passes can share a latency table (``read_run_facts``' dicts): device, dtype and
    threads known and equal, and every other ``LATENCY_KEYS`` setting that both runs record equal. A run whose
    hardware is unknown (no run.json) shares with none: equal unknowns prove nothing."""
    if any(facts.get(key) is None or facts.get(key) != other.get(key) for key in HARDWARE_KEYS):
        return False
    mine, theirs = facts.get("latency_settings") or {}, other.get("latency_settings") or {}
    return all(mine[key] == theirs[key] for key in set(mine) & set(theirs))


def latency_lookup(table: dict[int, float], counts) -> np.ndarray:
    """Seconds of one target forward pass over each of ``counts`` tokens, from ``table`` (token count ->
    seconds), read as the draft budget reads its latencies (``interpolate_latency``: no line is fitted).

    >>> latency_lookup({1: 0.050, 3: 0.060, 11: 0.090}, [2, 11, 15]).round(4).tolist()
    [0.055, 0.09, 0.105]
    """
    grid = sorted(table)
    return interpolate_latency(np.array(grid, dtype=np.float64), np.array([table[count] for count in grid]), counts)


def latency_sums(decode: pd.DataFrame) -> pd.DataFrame:
    """Per run and ``verify_tokens`` over decoding steps: the summed ``verify_s`` (seconds) and the number of
    steps (steps), from which any set of runs' mean latency table is pooled without re-reading steps."""
    return decode.groupby(["run_dir", "verify_tokens"]).verify_s.agg(seconds="sum", steps="count").reset_index()


def pooled_latency_table(sums: pd.DataFrame, runs) -> dict[int, float]:
    """Mean measured ``verify_s`` per ``verify_tokens`` over every decoding step of ``runs`` (each step
    weighs the same), from ``latency_sums``; empty when ``runs`` is."""
    pooled = sums[sums.run_dir.isin(list(runs))].groupby("verify_tokens")[["seconds", "steps"]].sum()
    return {int(count): float(seconds / steps) for count, seconds, steps in pooled.itertuples()}


def context_model(decode: pd.DataFrame, runs) -> tuple[dict[int, float], float]:
    """From the decoding steps of ``runs``: the mean context length per ``verify_tokens``, and the slope
    (seconds per context token) of ``verify_s`` against context within each token count (least squares on the
    deviations from each count's means, pooled; 0 when the contexts do not vary)."""
    steps = decode[decode.run_dir.isin(list(runs))]
    if steps.empty:
        return {}, 0.0
    by_count = steps.groupby("verify_tokens")
    latency = steps.verify_s - by_count.verify_s.transform("mean")
    context = steps.context_len - by_count.context_len.transform("mean")
    spread = float((context * context).sum())
    slope = float((latency * context).sum()) / spread if spread > 0 else 0.0
    return {int(count): float(mean) for count, mean in by_count.context_len.mean().items()}, slope


def context_term(run: pd.DataFrame, mean_context: dict[int, float], slope: float) -> np.ndarray:
    """Per step of ``run``: slope * (its context length - the reference steps' mean context at its token count,
    interpolated between counts)."""
    if not mean_context or slope == 0.0:
        return np.zeros(len(run))
    counts = sorted(mean_context)
    reference = np.interp(run.verify_tokens, counts, [mean_context[count] for count in counts])
    return slope * (run.context_len.to_numpy(dtype=np.float64) - reference)


def measured_rate(run: pd.DataFrame) -> float:
    """Tokens/s of a run's decoding steps as measured: accepted tokens (bonus included) over the steps'
    draft + verify + overhead seconds."""
    return float(run.accepted_tokens.sum() / (run.draft_s + run.verify_s + run.overhead_s).sum())


def predicted_rate(run: pd.DataFrame, target_s: np.ndarray) -> float:
    """Tokens/s predicted for a run's decoding steps: accepted tokens over the steps' measured draft and
    overhead seconds plus ``target_s``, the predicted target latency of each step."""
    return float(run.accepted_tokens.sum() / (run.draft_s.sum() + target_s.sum() + run.overhead_s.sum()))


def dsd_form_rate(run: pd.DataFrame, target_s: np.ndarray) -> float:
    """DSD's own form: accepted tokens per decoding step over (mean draft seconds per step + mean predicted
    target seconds per step); the loop's overhead is left out, so it overshoots by overhead / (draft +
    target)."""
    return float(run.accepted_tokens.mean() / (run.draft_s.mean() + target_s.mean()))


def outside_share(table: dict[int, float], counts: pd.Series) -> float:
    """Share of ``counts`` that ``table`` does not hold, i.e. whose latency is interpolated or extrapolated."""
    return float((~counts.isin(list(table))).mean())


def run_prediction(run: pd.DataFrame, calibration: dict[int, float], others: dict[int, float],
                   others_context: np.ndarray | None = None) -> dict:
    """One run's row of ``model_table`` from its decoding steps, its calibration table and the leave-one-out
    table of the other runs (either may be empty: that way's columns are then NaN); ``others_context`` is the
    leave-one-out context term per step (``context_term``; None = no term)."""
    measured = measured_rate(run)
    row = {"steps": len(run), "tokens_per_step": accepted_per_decoding_step(run.accepted_tokens, run.step),
           "draft_ms": 1000 * run.draft_s.mean(), "verify_ms": 1000 * run.verify_s.mean(),
           "overhead_ms": 1000 * run.overhead_s.mean(), "measured_tps": measured,
           "loo_outside": outside_share(others, run.verify_tokens) if others else np.nan,
           "reference": "", "reference_target_ms": np.nan, "dsd_form_tps": np.nan}
    for way, table in (("calibration", calibration), ("leave-one-out", others)):
        prefix = WAYS[way]
        if not table:
            row.update({f"{prefix}_target_ms": np.nan, f"{prefix}_tps": np.nan, f"{prefix}_dev": np.nan})
            continue
        target_s = latency_lookup(table, run.verify_tokens)
        if way == "leave-one-out" and others_context is not None:
            target_s = target_s + others_context
        predicted = predicted_rate(run, target_s)
        row.update({f"{prefix}_target_ms": 1000 * target_s.mean(), f"{prefix}_tps": predicted,
                    f"{prefix}_dev": predicted / measured - 1})
        # leave-one-out comes second, so it is the reference whenever it exists
        row.update({"reference": way, "reference_target_ms": 1000 * target_s.mean(),
                    "dsd_form_tps": dsd_form_rate(run, target_s)})
    return row


def model_table(steps: pd.DataFrame, facts: dict[str, dict] | None = None) -> pd.DataFrame:
    """One row per run (columns TABLE_COLUMNS): tokens per decoding step (bonus included), draft, verify and
    overhead ms per step as measured, T_target ms per step as predicted each way, measured tokens/s and the
    tokens/s predicted each way with its deviation (predicted / measured - 1), and the DSD form with the
    reference T_target (leave-one-out, else calibration). loo_runs counts the runs that made a run's
    leave-one-out table (the other runs of its model that ``same_latency`` allows); loo_outside is the share
    of its steps whose token count that table lacks. timing flags a run timed on a busy machine
    ("UNTRUSTED"; its summary's warnings in timing_warnings): its numbers are kept, marked.

    ``facts`` maps run_dir to ``read_run_facts``' dict; by default it is read from each run directory. Runs
    whose steps have no per-step times (``analysis.runs.timed_steps``) have no row and are no one's peer."""
    steps = timed_steps(steps)
    if facts is None:
        facts = {run_dir: read_run_facts(run_dir) for run_dir in steps.run_dir.unique()}
    decode = steps[steps.step > 0]
    models = decode.groupby("run_dir").model.first()
    sums = latency_sums(decode)
    rows = []
    for (run_dir, model, label), run in decode.groupby(["run_dir", "model", "label"], sort=False):
        peers = [other for other in models.index if other != run_dir and models[other] == model
                 and same_latency(facts[run_dir], facts[other])]
        others = pooled_latency_table(sums, peers)
        mean_context, slope = context_model(decode, peers)
        trustworthy = run.trustworthy.iloc[0] if "trustworthy" in run else None
        rows.append({"model": model, "label": label, "timing": timing_flag(trustworthy), "run_dir": run_dir,
                     **{key: facts[run_dir][key] for key in HARDWARE_KEYS}, "loo_runs": len(peers),
                     "loo_context_us": 1e6 * slope,
                     **run_prediction(run, facts[run_dir]["calibration"], others,
                                      context_term(run, mean_context, slope)),
                     "trustworthy": trustworthy,
                     "timing_warnings": run.timing_warnings.iloc[0] if "timing_warnings" in run else ""})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def largest_deviations(table: pd.DataFrame) -> dict[str, float]:
    """Per way of predicting T_target, the largest absolute deviation over the runs it predicts (NaN when it
    predicts none)."""
    return {way: float(table[f"{prefix}_dev"].abs().max()) for way, prefix in WAYS.items()}


def deviation_summary(table: pd.DataFrame) -> str:
    """``largest_deviations`` as text: "calibration 0.4%, leave-one-out 1.2%" ("-" for a way with no run)."""
    return ", ".join(f"{way} {'-' if np.isnan(value) else f'{100 * value:.1f}%'}"
                     for way, value in largest_deviations(table).items())


def requirements(table: pd.DataFrame) -> pd.DataFrame:
    """For every run: the draft latency per step, or the accepted tokens per decoding step, that would make
    its predicted throughput (draft + reference T_target + overhead per step) equal the best measured one of
    its model, all else equal. For the fastest run itself these differ from its own values only by the
    model's error. A draft latency below zero means no draft speed can close the gap: acceptance must rise
    (``shown_requirements`` and ``requirement_notes`` say so in words). Runs with no predicted T_target get NaN."""
    rows = []
    for model, group in table.groupby("model"):
        best = group.loc[group.measured_tps.idxmax()]
        for row in group.itertuples():
            rest_s = (row.reference_target_ms + row.overhead_ms) / 1000
            needed_draft = row.tokens_per_step / best.measured_tps - rest_s
            needed_tokens = best.measured_tps * (row.draft_ms / 1000 + rest_s)
            rows.append({"model": model, "label": row.label, "best": best.label,
                         "measured_tps": row.measured_tps, "best_tps": best.measured_tps,
                         "draft_ms": row.draft_ms, "needed_draft_ms": 1000 * needed_draft,
                         "tokens_per_step": row.tokens_per_step, "needed_tokens_per_step": needed_tokens,
                         "acceptance_factor": needed_tokens / row.tokens_per_step})
    return pd.DataFrame(rows)


CANNOT = "cannot"  # shown instead of a needed draft time below zero: no draft speed closes that gap
BEST = "is the best"  # shown instead of the best run's own needed draft time (the model's error, not a need)


def draft_cannot_match(needs: pd.DataFrame) -> pd.Series:
    """Per row of ``requirements``: whether no draft latency, not even a draft that takes no time, would match the
    best (a needed draft time below zero), for every run but the best itself (whose own "need" is only the
    model's error)."""
    return (needs.needed_draft_ms < 0) & (needs.label != needs.best)


def requirement_notes(needs: pd.DataFrame) -> list[str]:
    """One sentence per run of ``requirements`` that no draft speed can bring to the best: why, and the acceptance
    that would."""
    notes = []
    for row in needs[draft_cannot_match(needs)].itertuples():
        notes.append(f"{row.model} {row.label}: no draft latency can match {row.best}'s {row.best_tps:.1f} tok/s. "
                     f"At {row.tokens_per_step:.2f} tokens per step, the target pass and the overhead alone take "
                     f"{-row.needed_draft_ms:.1f} ms per step longer than {row.best}'s pace allows, even with a draft "
                     "that takes no time; acceptance must rise instead, to "
                     f"{row.needed_tokens_per_step:.2f} tokens per step ({row.acceptance_factor:.2f}x) at the "
                     "present draft time.")
    return notes


def shown_requirements(needs: pd.DataFrame) -> pd.DataFrame:
    """``requirements`` for a reader: the needed draft time says CANNOT where no draft time can match the best
    (``draft_cannot_match``) and BEST for the best run itself, a number otherwise (NaN: nothing predicts the
    run's target time)."""
    shown = needs.astype({"needed_draft_ms": object})
    shown.loc[draft_cannot_match(needs), "needed_draft_ms"] = CANNOT
    shown.loc[needs.label == needs.best, "needed_draft_ms"] = BEST
    return shown


def requirements_text(table: pd.DataFrame) -> str:
    """What each run of ``model_table`` would need to match the best of its model, as the command line prints
    it: ``shown_requirements`` ("-" where nothing predicts a run's target time), then ``requirement_notes``."""
    needs = requirements(table)
    if needs.empty:
        return "(no runs)"
    shown = shown_requirements(needs)
    text = shown.to_string(index=False, na_rep="-", formatters={
        column: (lambda v: v if isinstance(v, str) else "-" if pd.isna(v) else f"{v:.3f}") for column in shown.columns})
    return "\n".join([text, *requirement_notes(needs)])


COST_PARTS = ("draft", "one_pass", "extra_verify", "overhead")  # ms per accepted token, summing to the total


def token_costs(questions: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Where an accepted token's time goes, per run label (the throughput model's terms per token), over the
    decoding steps (prefill excluded):

        draft         drafting ms per accepted token
        one_pass      what one autoregressive pass costs, per accepted token: AR ms per token / (accepted
                      tokens per step). It falls only as acceptance rises: the acceptance term.
        extra_verify  the verify time beyond that one pass, per accepted token: what verifying the draft's
                      tokens costs (on a GPU near zero; on a CPU it grows with every token verified)
        overhead      planning, inputs, acceptance walk and KV-cache upkeep, per accepted token

    The total is ms per accepted token; ``speedup_bound`` = AR ms per token / total is what the terms allow
    (the measured speedup also counts the prefill). AR ms per token is the run's paired baseline's, wall time
    over tokens. ``needed_tokens_per_step_2x`` is the acceptance a 2x speedup needs at this run's draft,
    verify and overhead times per step. Runs whose steps have no per-step times (``analysis.runs.timed_steps``)
    have no row."""
    decode = timed_steps(steps)
    decode = decode[decode.step > 0]
    rows = []
    for label, run in decode.groupby("label", sort=False):
        answered = questions[(questions.label == label) & questions.baseline_tokens.notna()]
        if answered.empty or not run.accepted_tokens.sum():
            continue
        ar_ms = 1000 * answered.baseline_seconds.sum() / answered.baseline_tokens.sum()
        accepted, count = float(run.accepted_tokens.sum()), len(run)
        per_step = {part: 1000 * run[f"{part}_s"].sum() / count for part in ("draft", "verify", "overhead")}
        costs = {"draft": per_step["draft"] * count / accepted, "one_pass": ar_ms * count / accepted,
                 "extra_verify": (per_step["verify"] - ar_ms) * count / accepted,
                 "overhead": per_step["overhead"] * count / accepted}
        total = sum(costs.values())
        rows.append({"label": label, "tokens_per_step": accepted / count, "verified_per_step": run.verify_tokens.mean(),
                     "ar_ms_per_token": ar_ms, **costs, "total": total, "speedup_bound": ar_ms / total,
                     "needed_tokens_per_step_2x": 2 * sum(per_step.values()) / ar_ms})
    return pd.DataFrame(rows)


def two_x_cannot(costs: pd.DataFrame) -> pd.Series:
    """Per row of ``token_costs``: whether the acceptance a 2x speedup needs is more than the tokens a step
    verifies, which no drafter can reach (a step accepts at most the draft tokens it verifies plus the bonus
    token, and the verified count holds the root as well)."""
    return costs.needed_tokens_per_step_2x > costs.verified_per_step


def token_cost_notes(costs: pd.DataFrame) -> list[str]:
    """One sentence per run of ``token_costs`` that cannot reach 2x at its draft size, and why."""
    return [f"{row.label}: 2x cannot be reached at this draft size: it would need {row.needed_tokens_per_step_2x:.2f} "
            f"accepted tokens per step, more than the {row.verified_per_step:.2f} a step verifies."
            for row in costs[two_x_cannot(costs)].itertuples()]


def shown_token_costs(costs: pd.DataFrame) -> pd.DataFrame:
    """``token_costs`` for a reader: the acceptance a 2x speedup needs says CANNOT where it exceeds the tokens a
    step verifies (``two_x_cannot``)."""
    if costs.empty:
        return costs
    shown = costs.astype({"needed_tokens_per_step_2x": object})
    shown.loc[two_x_cannot(costs), "needed_tokens_per_step_2x"] = CANNOT
    return shown
