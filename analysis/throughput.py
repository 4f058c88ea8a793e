"""The simplified throughput model of "Decoding Speculative Decoding" (Yan, Agarwal, Venkataraman):

    throughput = accepted tokens per step / (draft latency per step + target latency(verified tokens))

where the draft latency per step is gamma x the draft's latency per token (0 for database drafters). The
target's latency is fitted, per model and device, as a line in the number of verified tokens over every
recorded step; the draft latency and the accepted tokens come from each run's step records. The fit is then
checked against each run's measured decoding throughput (the paper reports at most 3.5% deviation), and
used to ask what a draft would need to match the best one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def fit_verify_latency(steps: pd.DataFrame) -> tuple[float, float]:
    """Least-squares (intercept seconds, seconds per verified token) of verify_s against verify_tokens over
    decoding steps (the prefill excluded)."""
    decode = steps[steps.step > 0]
    if decode.verify_tokens.nunique() < 2:
        return float(decode.verify_s.mean()), 0.0
    slope, intercept = np.polyfit(decode.verify_tokens.astype(float), decode.verify_s.astype(float), 1)
    return float(intercept), float(slope)


def model_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: accepted tokens per step, draft and verify seconds per step (measured, and the fitted target
    latency at the run's verified-token counts), measured and predicted tokens/s and their deviation."""
    rows = []
    for model, per_model in steps.groupby("model"):
        intercept, slope = fit_verify_latency(per_model)
        for (run_dir, label), run in per_model[per_model.step > 0].groupby(["run_dir", "label"]):
            accepted = run.accepted_tokens.mean()
            draft = run.draft_s.mean()
            fitted_verify = intercept + slope * run.verify_tokens.mean()
            measured = run.accepted_tokens.sum() / (run.draft_s + run.verify_s + run.overhead_s).sum()
            predicted = accepted / (draft + fitted_verify)
            rows.append({"model": model, "label": label, "run_dir": run_dir, "mat": accepted,
                         "draft_ms": 1000 * draft, "verify_ms": 1000 * run.verify_s.mean(),
                         "fitted_verify_ms": 1000 * fitted_verify, "overhead_ms": 1000 * run.overhead_s.mean(),
                         "verify_tokens": run.verify_tokens.mean(), "measured_tps": measured,
                         "predicted_tps": predicted, "deviation": predicted / measured - 1,
                         "fit_intercept_ms": 1000 * intercept, "fit_ms_per_token": 1000 * slope})
    return pd.DataFrame(rows)


def requirements(table: pd.DataFrame) -> pd.DataFrame:
    """For every run: the draft latency per step, or the accepted tokens per step, that would make its
    predicted throughput equal the best measured one of its model (all else equal). For the fastest run
    itself these differ from its own values only by the model's error. A draft latency below zero means no
    draft speed can close the gap: acceptance must rise."""
    rows = []
    for model, group in table.groupby("model"):
        best = group.loc[group.measured_tps.idxmax()]
        for row in group.itertuples():
            verify = row.fitted_verify_ms / 1000
            needed_draft = row.mat / best.measured_tps - verify
            needed_mat = best.measured_tps * (row.draft_ms / 1000 + verify)
            rows.append({"model": model, "label": row.label, "best": best.label,
                         "measured_tps": row.measured_tps, "best_tps": best.measured_tps,
                         "draft_ms": row.draft_ms, "needed_draft_ms": 1000 * needed_draft,
                         "mat": row.mat, "needed_mat": needed_mat,
                         "acceptance_factor": needed_mat / row.mat})
    return pd.DataFrame(rows)
