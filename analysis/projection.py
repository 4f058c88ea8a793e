"""What a method would give on another device: a run's steps put through that device's verify curve.

Greedy acceptance depends on the model and the draft, not on the device that ran them (up to near-ties of the
dtype), so a run of a real model on a CPU says how many tokens each step verified and accepted; a GPU check of a
model of the same shape (scripts/gpu_check.py, row 6, which needs no real weights) says what a pass of q tokens
costs there. The throughput model of "Decoding Speculative Decoding" (``analysis.throughput.predicted_rate``:
accepted tokens over draft + T_target + overhead) then gives the method's tokens/s on that device, and AR's is one
token per t(1). The host's time per step (drafting, the loop's bookkeeping) was measured on the run's machine,
not the device's host, so it is bracketed: ``host free`` counts none of it (the speedup the curve and the
acceptance allow), ``host as measured`` counts the method's own as the run measured it and none for AR (a
lower bound on the speedup when the device's host is at least as fast).

    python -m analysis project runs/pld --curve gpu_check_6.json              # the fastest compiled curve in it
    python -m analysis project runs/ --curve gpu_check_6.json --mode eager
    python -m analysis project runs/ --curve runs/gpu-run/verify_latency.json  # a GPU run's own calibration
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.throughput import latency_lookup
from specbench.errors import SpecbenchError

log = logging.getLogger("analysis.projection")

CURVE_ROW = "6 verify ms"  # the GPU check row whose data holds the curves
SHAPE_TOLERANCE = 0.10  # a curve of a model reading more than 10% more or less per pass is of another shape
COLUMNS = ["model", "label", "questions", "mat", "outside", "ar_tps", "tps_host_free", "tps_host_measured",
           "speedup_host_free", "speedup_host_measured", "measured_speedup"]


@dataclass(frozen=True)
class Curve:
    """Seconds of one verify pass per token count on a device. ``bucketed``: a compiled target's (a pass runs at
    the smallest measured size that holds it), else an eager one's (interpolated between sizes)."""

    seconds: dict[int, float]
    bucketed: bool
    label: str
    bytes_per_pass: int | None = None

    def target_seconds(self, counts) -> np.ndarray:
        """Seconds of the passes of ``counts`` tokens each; a count past a bucketed curve's largest size is an
        error (that pass would not run there)."""
        counts = np.asarray(counts, dtype=np.int64)
        sizes = np.array(sorted(self.seconds), dtype=np.int64)
        if not self.bucketed:
            return latency_lookup(self.seconds, counts)
        beyond = int((counts > sizes[-1]).sum())
        if beyond:
            raise SpecbenchError(f"{beyond} steps verify more than {sizes[-1]} tokens, the largest size of the curve "
                                 f"({self.label}); give a curve with larger buckets, or --mode eager")
        buckets = sizes[np.searchsorted(sizes, counts)]
        return np.array([self.seconds[int(bucket)] for bucket in buckets])


def read_curve(path: str | Path, mode: str | None = None) -> Curve:
    """The curve in ``path``: a GPU check's JSON (row 6's ``data.curves``; ``mode`` one of its modes, by default
    the compiled mode with the fastest one-token pass) or a run's verify_latency.json (its calibration, read as an
    eager curve unless ``mode`` says otherwise). One line naming the file when it is neither."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SpecbenchError(f"--curve {path}: cannot be read as JSON ({error}); give a gpu_check --out file or a "
                             "run's verify_latency.json") from None
    if isinstance(document, dict) and isinstance(document.get("latency_s"), dict):
        seconds = _sizes(document["latency_s"], path)
        return Curve(seconds, bucketed=mode not in (None, "eager"), label=f"{path}")
    rows = document.get("rows") if isinstance(document, dict) else None
    found = [row.get("data") for row in rows or [] if isinstance(row, dict)
             and str(row.get("name", "")).startswith(CURVE_ROW) and isinstance(row.get("data"), dict)
             and isinstance(row["data"].get("curves"), dict)]
    if not found:
        raise SpecbenchError(f"--curve {path}: no verify curve in it (neither a run's verify_latency.json nor a "
                             "gpu_check --out file with row 6, scripts/gpu_check.py --rows 6)")
    data = found[0]
    curves = {name: _sizes(curve, path) for name, curve in data["curves"].items()}
    if mode is None:
        compiled = [name for name in curves if name != "eager"]
        mode = min(compiled, key=lambda name: curves[name][min(curves[name])]) if compiled else "eager"
    if mode not in curves:
        raise SpecbenchError(f"--mode {mode}: {path} has curves for {', '.join(curves)}; choose one of them")
    where = f"{data.get('device_name', 'a device')}, {data.get('dtype', '?')}, {mode}, {data.get('context', '?')} ctx"
    return Curve(curves[mode], bucketed=mode != "eager", label=f"{path.name}: {where}",
                 bytes_per_pass=data.get("bytes_per_pass"))


def _sizes(table: dict, path: Path) -> dict[int, float]:
    try:
        seconds = {int(size): float(value) for size, value in table.items()}
    except (TypeError, ValueError):
        raise SpecbenchError(f"--curve {path}: a size or a time in it is not a number") from None
    if not seconds or not all(size > 0 and np.isfinite(value) and value > 0 for size, value in seconds.items()):
        raise SpecbenchError(f"--curve {path}: its curve is empty or holds a size or time out of range")
    if 1 not in seconds:
        raise SpecbenchError(f"--curve {path}: its curve has no one-token pass, which AR's projection needs")
    return seconds


def project_question(steps: pd.DataFrame, curve: Curve) -> dict:
    """One question's decoding steps (step > 0 of every turn) through ``curve``: tokens, steps, and the seconds
    the method's target passes, its measured host time and AR's passes take on the curve's device."""
    decode = steps[steps.step > 0]
    tokens = int(decode.accepted_tokens.sum())
    target = curve.target_seconds(decode.verify_tokens)
    return {"tokens": tokens, "steps": len(decode), "target_s": float(target.sum()),
            "host_s": float((decode.draft_s + decode.overhead_s).sum()),
            "ar_s": tokens * float(curve.seconds[1])}


def project_run(steps: pd.DataFrame, curve: Curve) -> dict:
    """A run's questions through ``curve``: Spec-Bench's speedup (mean tokens/s over the questions against AR's
    mean), bracketed by the host's time (see the module's docstring)."""
    rows = [project_question(group, curve) for _, group in steps.groupby("question_id", sort=False)]
    rows = [row for row in rows if row["tokens"] > 0]
    if not rows:
        raise SpecbenchError("no decoding step with accepted tokens to project")
    ar = np.mean([row["tokens"] / row["ar_s"] for row in rows])
    free = np.mean([row["tokens"] / row["target_s"] for row in rows])
    measured = np.mean([row["tokens"] / (row["target_s"] + row["host_s"]) for row in rows])
    tokens, decode_steps = sum(row["tokens"] for row in rows), sum(row["steps"] for row in rows)
    return {"questions": len(rows), "mat": tokens / decode_steps if decode_steps else float("nan"), "ar_tps": ar,
            "tps_host_free": free, "tps_host_measured": measured, "speedup_host_free": free / ar,
            "speedup_host_measured": measured / ar}


def projection_table(steps: pd.DataFrame, questions: pd.DataFrame, curve: Curve,
                     bytes_per_pass: dict[str, int | None] | None = None) -> pd.DataFrame:
    """One row per run of ``steps``: its projection through ``curve`` beside its measured speedup (from
    ``questions``, ``analysis.runs``' question rows). A run whose model reads more than SHAPE_TOLERANCE more or
    less per pass than the curve's (``bytes_per_pass``: run_dir -> its summary's figure) gets a warning."""
    rows = []
    for run_dir, run in steps.groupby("run_dir", sort=False):
        mine = (bytes_per_pass or {}).get(run_dir)
        if mine and curve.bytes_per_pass and abs(mine / curve.bytes_per_pass - 1) > SHAPE_TOLERANCE:
            log.warning("run %s reads %.2f GB per pass and the curve's model %.2f GB: the projection assumes a "
                        "model of the curve's shape", run_dir, mine / 1e9, curve.bytes_per_pass / 1e9)
        sizes = max(curve.seconds)
        outside = float((run.verify_tokens[run.step > 0] > sizes).mean()) if not curve.bucketed else 0.0
        answered = questions[questions.run_dir == run_dir]
        measured = (answered.tokens_per_s.mean() / answered.baseline_tokens_per_s.mean()
                    if len(answered) and "baseline_tokens_per_s" in answered else float("nan"))
        rows.append({"model": run.model.iloc[0], "label": run.label.iloc[0], **project_run(run, curve),
                     "outside": outside, "measured_speedup": measured})
    return pd.DataFrame(rows, columns=COLUMNS)


def projection_text(table: pd.DataFrame, curve: Curve) -> str:
    shown = table.rename(columns={"mat": "MAT", "outside": "past_curve", "measured_speedup": "measured_here"})
    lines = [f"projected through {curve.label} ({'bucketed: a pass runs at the smallest size that holds it' if curve.bucketed else 'interpolated between sizes'}; "
             f"t(1) {curve.seconds[1] * 1e3:.2f} ms)",
             shown.to_string(index=False, float_format=lambda v: f"{v:.2f}"),
             "",
             "host free: the target's passes alone (the speedup the curve and the acceptance allow); host as measured: "
             "the method's drafting and bookkeeping\nas this run measured them on its own machine, AR's none (a lower "
             "bound where the device's host is no slower). measured_here: the run's own speedup on its machine.\n"
             "Acceptance is the run's: on the device, a different dtype may break near-ties the other way. The "
             "curve was measured at one context length; past_curve: the share of steps verifying more tokens "
             "than the curve measured (extrapolated)."]
    return "\n".join(lines)
