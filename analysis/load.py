"""Runs under load (``engine.concurrency``): per model, method and concurrency, AR's and the method's output
tokens/s, the speedup between them, requests/s, time to first token and time per output token with their
percentiles over requests, the engine's acceptance figures and the outputs identical to AR's, from the
load.jsonl of every run (``specbench.results.load``; read by ``analysis.runs.load_runs`` into
``LoadedRuns.load``, so a run is counted once however it is reached).

    from analysis.load import load_table, render_load
    table = load_table(load_runs(["runs/"]).load)   # one row per (model, method, concurrency)

The speedup is the method's output tokens/s over AR's at the same concurrency, of the same run: a level whose
AR (baseline) line is missing has no speedup, never one made up from another level or run. Repeats of one
configuration (runs sharing a model and label, ``analysis.runs``) are averaged, a figure only when every run
has it; the identical outputs and the requests are summed over them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.tables import SHOWN_POSITIONS, TIMING_UNTRUSTED, _latex_text, timing_cell

KEYS = ["model", "label", "concurrency"]
PERCENTILES = ("p50", "p90", "p99")
TTFT = tuple(f"ttft_{p}_ms" for p in PERCENTILES)
TPOT = tuple(f"tpot_{p}_ms" for p in ("mean", *PERCENTILES))
# vLLM's per-position acceptance rate (load.jsonl's per_position_acceptance_rate: of all drafts), positions 1 to 4; the
# acceptance table's position_i (summary.json's acceptance_by_position) divides by the drafts that reached i instead.
POSITIONS = tuple(f"per_position_rate_{p}" for p in range(1, SHOWN_POSITIONS + 1))
# The per-level figures, method's and AR's (ar_ prefix), averaged over repeated runs.
MEANS = ("ar_tokens_per_s", "tokens_per_s", "speedup", "ar_requests_per_s", "requests_per_s",
         *(f"ar_{name}" for name in TTFT), *TTFT, *(f"ar_{name}" for name in TPOT), *TPOT,
         "mean_acceptance_length", *POSITIONS, "draft_ms_per_step", "draft_share")
COUNTS = ("identical", "requests")  # summed over repeated runs
RUN_LEVEL_COLUMNS = ["run_dir", *KEYS, "trustworthy", *MEANS, *COUNTS]

HEADERS = {
    "model": "model", "label": "method", "timing": "timing", "concurrency": "concurrency", "runs": "runs",
    "ar_tokens_per_s": "AR tok/s", "tokens_per_s": "tok/s", "speedup": "speedup",
    "ar_requests_per_s": "AR req/s", "requests_per_s": "req/s",
    **{f"ar_{name}": f"AR TTFT {name.split('_')[1]} ms" for name in TTFT},
    **{name: f"TTFT {name.split('_')[1]} ms" for name in TTFT},
    **{f"ar_{name}": f"AR TPOT {name.split('_')[1]} ms" for name in TPOT},
    **{name: f"TPOT {name.split('_')[1]} ms" for name in TPOT},
    "mean_acceptance_length": "mean acceptance length (vLLM)",
    **{name: f"accepted at position {name.rsplit('_', 1)[1]} of all drafts" for name in POSITIONS},
    "identical": "identical to AR",
    "draft_ms_per_step": "draft ms per step", "draft_share": "drafting share of the time",
}
LOAD_LEGEND = (
    "Per concurrency (requests kept in flight), AR and the method each serving every question in one engine. "
    "tok/s: output tokens over the level's wall time; speedup: the method's tok/s over AR's at the same "
    "concurrency; req/s: requests completed per second; TTFT: time to first token, from submission; TPOT: time "
    "per output token after the first; mean, p50, p90, p99 over requests; mean acceptance length (vLLM): 1 + "
    "accepted draft tokens per draft; accepted at position i of all drafts: the drafts that accepted a token at "
    "position i over all drafts (vLLM's per-position acceptance rate, from the engine's counts; the acceptance "
    "table's accepted at position i divides by the drafts that reached i instead); identical to AR: requests "
    "whose tokens equal AR's at the same concurrency; draft ms per step and drafting share of the time "
    "(engine=vllm-custom): the milliseconds specbench's drafter took inside each of vLLM's steps, and its seconds "
    "over the level's wall time (drafting is on the engine's critical path); "
    "-: not known (no AR line at that level, or a figure the engine did not record)")


def _number(value) -> float:
    """A level's figure as a float: NaN for None (or anything that is not a number)."""
    if value is None or isinstance(value, bool):
        return np.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return np.nan


def _ms(value) -> float:
    return 1000 * _number(value)


def _figures(line: pd.Series | None, prefix: str) -> dict:
    """One role's figures at one level (``prefix`` "ar_" for AR), all NaN when the role has no line."""
    if line is None:
        line = pd.Series(dtype=object)
    return {f"{prefix}tokens_per_s": _number(line.get("output_tokens_per_s")),
            f"{prefix}requests_per_s": _number(line.get("requests_per_s")),
            **{f"{prefix}{name}": _ms(line.get(f"ttft_s_{name.split('_')[1]}")) for name in TTFT},
            **{f"{prefix}{name}": _ms(line.get(f"tpot_s_{name.split('_')[1]}")) for name in TPOT}}


def run_levels(load: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, concurrency) of ``load`` (``LoadedRuns.load``): RUN_LEVEL_COLUMNS, AR's figures from
    the level's baseline line, the method's from its method line, NaN for a line that is missing."""
    rows = []
    if load.empty:
        return pd.DataFrame(columns=RUN_LEVEL_COLUMNS)
    for (run_dir, concurrency), level in load.groupby(["run_dir", "concurrency"], sort=False):
        lines = {line.role: line for _, line in level.iterrows()}
        baseline, method = lines.get("baseline"), lines.get("method")
        first = level.iloc[0]
        row = {"run_dir": run_dir, "model": first.model, "label": first.label, "concurrency": int(concurrency),
               "trustworthy": first.get("trustworthy"), **_figures(baseline, "ar_"), **_figures(method, "")}
        row["speedup"] = (row["tokens_per_s"] / row["ar_tokens_per_s"]
                          if row["ar_tokens_per_s"] > 0 and not np.isnan(row["tokens_per_s"]) else np.nan)
        shares = method.get("per_position_acceptance_rate") if method is not None else None
        shares = list(shares) if isinstance(shares, (list, tuple, np.ndarray)) else []
        row.update({name: _number(shares[index]) if index < len(shares) else np.nan
                    for index, name in enumerate(POSITIONS)})
        row["mean_acceptance_length"] = _number(method.get("mean_acceptance_length")) if method is not None else np.nan
        # identical_to_baseline is None when the baseline's level was missing: unknown, not 0
        row["identical"] = _number(method.get("identical_to_baseline")) if method is not None else np.nan
        row["requests"] = _number(method.get("requests")) if method is not None else np.nan
        row["draft_ms_per_step"] = _number(method.get("proposer_draft_ms_per_call")) if method is not None else np.nan
        row["draft_share"] = (_number(method.get("proposer_draft_s")) / _number(method.get("duration_s"))
                              if method is not None else np.nan)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=RUN_LEVEL_COLUMNS)
    return frame.sort_values(["model", "label", "concurrency", "run_dir"], kind="stable").reset_index(drop=True)


def _all_or_nothing(values: pd.Series, how: str) -> float:
    """The mean or sum over repeated runs, NaN when any run lacks the figure."""
    if values.isna().any():
        return np.nan
    return float(values.mean() if how == "mean" else values.sum())


def load_table(load: pd.DataFrame) -> pd.DataFrame:
    """Rows (model, label, concurrency), sorted; columns timing (``analysis.tables.timing_cell``), MEANS (the
    mean over the configuration's runs), COUNTS (summed) and runs. Empty when no run has load.jsonl."""
    levels = run_levels(load)
    if levels.empty:
        return pd.DataFrame(columns=["timing", *MEANS, *COUNTS, "runs"],
                            index=pd.MultiIndex.from_arrays([[], [], []], names=KEYS))
    grouped = levels.groupby(KEYS, sort=True)
    table = pd.DataFrame({
        **{column: grouped[column].agg(_all_or_nothing, "mean") for column in MEANS},
        **{column: grouped[column].agg(_all_or_nothing, "sum") for column in COUNTS},
        "runs": grouped.size()})
    table.insert(0, "timing", grouped.trustworthy.agg(lambda flags: timing_cell(list(flags))))
    return table


def has_load(load: pd.DataFrame | None) -> bool:
    """Whether any run of ``load`` (``LoadedRuns.load``) has a level."""
    return load is not None and not load.empty


def _cell(column: str, value, requests=None) -> str:
    if isinstance(value, str):
        return value
    if value is None or pd.isna(value):
        return "-"
    if column == "identical":
        return f"{int(value)}/{int(requests)}" if requests is not None and not pd.isna(requests) else f"{int(value)}"
    if column in ("concurrency", "runs"):
        return str(int(value))
    if column == "speedup":
        return f"{value:.2f}x"
    if column.endswith("tokens_per_s"):
        return f"{value:.1f}"
    if column.endswith("_ms"):
        return f"{value:.1f}"
    if column == "draft_share":
        return f"{value:.1%}"
    return f"{value:.2f}"


def load_cells(table: pd.DataFrame) -> pd.DataFrame:
    """``load_table`` as text cells (model, label, concurrency as columns): tok/s and ms with one decimal,
    speedups as "1.70x", identical outputs as "k/n", "-" where unknown; the timing column only when a run's
    timings are flagged, the requests only inside "k/n"."""
    shown = table.reset_index()
    if not shown.timing.astype(str).str.startswith(TIMING_UNTRUSTED).any():
        shown = shown.drop(columns="timing")
    cells = {}
    for column in shown.columns:
        if column == "requests":
            continue
        cells[column] = [_cell(column, value, requests) for value, requests in zip(shown[column], shown.requests)]
    return pd.DataFrame(cells)


def render_load(table: pd.DataFrame, fmt: str) -> str:
    """Markdown, LaTeX or CSV (numeric, every column) of ``load_table``; the text formats end with the legend."""
    if fmt == "csv":
        return table.reset_index().to_csv(index=False)
    cells = load_cells(table)
    cells.columns = [HEADERS.get(column, column) for column in cells.columns]
    if fmt == "md":
        lines = ["| " + " | ".join(cells.columns) + " |", "|" + "|".join("---" for _ in cells.columns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)]
        return "\n".join([*lines, "", LOAD_LEGEND]) + "\n"
    if fmt == "latex":
        escaped = cells.map(_latex_text)
        escaped.columns = [_latex_text(column) for column in cells.columns]
        return escaped.to_latex(index=False, escape=False) + f"\\par\\noindent {_latex_text(LOAD_LEGEND)}\n"
    raise ValueError(f"unknown format {fmt!r}: md, latex or csv")


def ar_throughput(load: pd.DataFrame) -> pd.DataFrame:
    """Per run (run_dir, model, label) and concurrency, AR's output tokens/s: the curve the speedups stand on."""
    levels = run_levels(load)
    return levels.dropna(subset=["ar_tokens_per_s"])[["run_dir", "model", "label", "concurrency", "ar_tokens_per_s"]]
