"""The papers' figures from run directories, as PNG and PDF; ``make_all`` draws every figure the data
supports and says which it skipped and why.

    HD paper style:  speedup per task for all drafters; MAT per task; latency breakdown per drafter;
                     HD ablation (database subsets and orders) and the share of accepted tokens per database
    DSD style:       draft latency vs depth and vs parameters; throughput vs acceptance; predicted (from
                     the calibration and leave-one-out) vs measured throughput
    under load:      speedup against concurrency per method, beside AR's output tokens/s per run (only when a
                     run has load.jsonl)

The figures of step times (latency breakdown, cost per token, the throughput model's, draft latency) leave out
the runs whose steps have no per-step times (``analysis.runs.timed_steps``).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.load import ar_throughput, has_load, load_table
from analysis.runs import NO_STEP_TIMES, run_settings, timed_steps
from analysis.tables import run_task_stats
from analysis.throughput import COST_PARTS, WAYS, deviation_summary, model_table, token_costs
from specbench.questions import ALL_TASKS
from specbench.results.readers import read_json_file

DATABASES = ("context", "model", "statistics")
# Why predicted_vs_measured is not drawn when no run's throughput is predicted (analysis.throughput's two ways).
NO_PREDICTION = ("no run's throughput is predicted: a prediction needs the run's own calibration "
                 "(verify_latency.json, measured with run.verify_padding=auto or run.draft_budget=auto) or another "
                 "run of its model timed alike (leave-one-out)")


def _save(figure, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    figure.tight_layout()
    for path in paths:
        figure.savefig(path, dpi=150, bbox_inches="tight")  # keeps legends placed beside the axes
    plt.close(figure)
    return paths


def method_style(label: str, labels) -> tuple:
    """(colour, hatch) of a method's bars: one colour per published method, shared by its tuned variants
    (``hd`` and ``hd+budget``), which are hatched, so a tuned row is never mistaken for the original."""
    bases = list(dict.fromkeys(str(name).split("+")[0].split(" ")[0] for name in labels))
    base = str(label).split("+")[0].split(" ")[0]
    palette = plt.get_cmap("tab10" if len(bases) <= 10 else "tab20")
    return palette(bases.index(base) % palette.N), ("///" if "+" in str(label) else None)


def _grouped_bars(ax, table: pd.DataFrame, ylabel: str, reference: float | None = None) -> None:
    """Bars per row (task), one colour per column (run label)."""
    width = 0.8 / max(1, table.shape[1])
    positions = np.arange(table.shape[0])
    for index, column in enumerate(table.columns):
        color, hatch = method_style(column, table.columns)
        ax.bar(positions + index * width, table[column].values, width, label=column, color=color, hatch=hatch,
               edgecolor="white" if hatch else None, linewidth=0)
    ax.set_xticks(positions + width * (table.shape[1] - 1) / 2)
    ax.set_xticklabels(table.index, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=0.8, linestyle="--")
    # Beside the axes, never over the bars: a legend inside covered the tallest bar.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _per_task(questions: pd.DataFrame, stat: str) -> pd.DataFrame:
    stats = run_task_stats(questions)
    table = stats.groupby(["task", "label"])[stat].mean().unstack("label")
    return table.reindex([t for t in (*ALL_TASKS, "overall") if t in table.index])


def speedup_per_task(questions, out):
    figure, ax = plt.subplots(figsize=(9, 4))
    _grouped_bars(ax, _per_task(questions, "speedup"), "speedup over AR", reference=1.0)
    ax.set_title("Speedup per task")
    return _save(figure, out, "speedup_per_task")


def mat_per_task(questions, out):
    figure, ax = plt.subplots(figsize=(9, 4))
    _grouped_bars(ax, _per_task(questions, "mat"), "mean accepted tokens per step", reference=1.0)
    ax.set_title("Mean accepted tokens per task")
    return _save(figure, out, "mat_per_task")


def latency_breakdown(steps, out):
    steps = timed_steps(steps)
    decode = steps[steps.step > 0]
    table = decode.groupby("label")[["draft_s", "verify_s", "overhead_s"]].mean() * 1000
    figure, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(table) + 2.0), 4))
    bottom = np.zeros(len(table))
    positions = np.arange(len(table))
    for column, name in (("draft_s", "draft"), ("verify_s", "verify"), ("overhead_s", "overhead")):
        ax.bar(positions, table[column], bottom=bottom, label=name)
        bottom += table[column].values
    ax.set_xticks(positions)
    ax.set_xticklabels(table.index, rotation=30, ha="right")  # long names slant instead of overlapping
    ax.set_ylabel("ms per step")
    ax.set_title("Latency per decoding step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(figure, out, "latency_breakdown")


def hd_ablation(questions, steps, out):
    hd_questions = questions[questions.drafter.str.startswith("hd")]
    overall = run_task_stats(hd_questions)
    overall = overall[overall.task == "overall"].groupby("label").speedup.mean().sort_values()
    decode = steps[(steps.step > 0) & steps.drafter.str.startswith("hd")]
    draft_accepted = decode.assign(tokens=decode.accepted_tokens - 1)
    share = draft_accepted[draft_accepted.source.isin(DATABASES)].groupby(["label", "source"]).tokens.sum().unstack(fill_value=0)
    share = share.div(share.sum(axis=1), axis=0).reindex(overall.index).fillna(0)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.5 * len(overall) + 2.5))
    left.barh(overall.index, overall.values)
    left.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    left.set_xlabel("overall speedup over AR")
    left.set_title("HD by database subset and order")
    start = np.zeros(len(share))
    for database in DATABASES:
        if database in share:
            right.barh(share.index, share[database], left=start, label=database)
            start += share[database].values
    right.set_xlabel("share of accepted draft tokens")
    right.set_title("Which database supplied them")
    right.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(figure, out, "hd_ablation")


def _draft_manifests(run_dirs) -> pd.DataFrame:
    """Pruned-draft facts (layers, parameters) of draft-model runs, from their run.json and the draft's
    manifest."""
    rows = []
    for run_dir in run_dirs:
        settings = run_settings(Path(run_dir))  # either run.json layout; {} without one
        model = (settings.get("drafter") or {}).get("model")
        path = model.get("path") if isinstance(model, dict) else None
        manifest = Path(path) / "specbench_draft.json" if path else None
        if manifest and manifest.is_file():
            facts = read_json_file(manifest, "pruned draft's manifest")
            rows.append({"run_dir": run_dir, "layers": len(facts["kept_layers"]), "parameters": facts["parameters"]})
    return pd.DataFrame(rows, columns=["run_dir", "layers", "parameters"])


def draft_depth(steps, out):
    steps = timed_steps(steps)
    drafts = _draft_manifests(steps.run_dir.unique())
    # The median over drafting steps: a step after steps the draft budget skipped also catches the draft up on
    # the tokens it missed, which says nothing about the draft's speed per token.
    drafting = steps[(steps.step > 0) & (steps.draft_tokens > 0)]
    per_token = (1000 * drafting.draft_s / drafting.draft_tokens).groupby(drafting.run_dir).median()
    table = drafts.assign(ms_per_token=drafts.run_dir.map(per_token)).dropna(subset=["ms_per_token"])
    table = table.sort_values("layers")
    by_depth = table.groupby("layers").agg(ms_per_token=("ms_per_token", "median"),
                                           parameters=("parameters", "median")).reset_index()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.scatter(table.layers, table.ms_per_token, alpha=0.6)
    left.plot(by_depth.layers, by_depth.ms_per_token, marker="o")
    left.set_xlabel("draft depth (layers)")
    left.set_ylabel("draft latency per token (ms)")
    left.set_title("Draft latency vs depth")
    right.scatter(table.parameters / 1e6, table.ms_per_token, alpha=0.6)
    right.plot(by_depth.parameters / 1e6, by_depth.ms_per_token, marker="o")
    for row in table.itertuples():
        right.annotate(f"{row.layers}L", (row.parameters / 1e6, row.ms_per_token), fontsize=8)
    right.set_xlabel("draft parameters (millions)")
    right.set_ylabel("draft latency per token (ms)")
    right.set_title("Draft latency vs size (full width)")
    return _save(figure, out, "draft_latency_depth")


def throughput_vs_acceptance(table, out):
    figure, ax = plt.subplots(figsize=(6, 4.5))
    labels = sorted(table.label.unique())
    for label, group in table.groupby("label"):
        color, hatch = method_style(label, labels)
        ax.scatter(group.tokens_per_step, group.measured_tps, label=label, color=color,
                   marker="^" if hatch else "o")  # a tuned variant: a triangle in its method's colour
    ax.set_xlabel("accepted tokens per decoding step (bonus included, prefill excluded)")
    ax.set_ylabel("measured tokens/s (decoding steps)")
    ax.set_title("Throughput vs acceptance")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(figure, out, "throughput_vs_acceptance")


def is_predicted(table: pd.DataFrame) -> pd.Series:
    """Per row of ``model_table``: whether either way predicts that run's throughput."""
    return table.calib_tps.notna() | table.loo_tps.notna()


def predicted_vs_measured(table, out):
    """Each run's measured decoding tokens/s against the throughput model's prediction, with T_target from
    the run's calibration and from the other runs (leave-one-out); the runs neither way predicts are named on
    the figure. Nothing is drawn ([]) when no run is predicted (``make_all`` says why: NO_PREDICTION)."""
    if not is_predicted(table).any():
        return []
    figure, ax = plt.subplots(figsize=(5.5, 5))
    shown = []
    for way, prefix in WAYS.items():
        predicted = table.dropna(subset=[f"{prefix}_tps"])
        if predicted.empty:
            continue
        ax.scatter(predicted.measured_tps, predicted[f"{prefix}_tps"], label=way,
                   marker="o" if prefix == "calib" else "x")
        shown.append(predicted[f"{prefix}_tps"])
    reference = table.loo_tps.fillna(table.calib_tps)
    for label, measured, predicted in zip(table.label, table.measured_tps, reference):
        if not np.isnan(predicted):
            ax.annotate(label[:24], (measured, predicted), xytext=(4, 3), textcoords="offset points", fontsize=7)
    values = pd.concat([table.measured_tps[is_predicted(table)], *shown])
    ax.plot([values.min(), values.max()], [values.min(), values.max()], color="black", linewidth=0.8, linestyle="--")
    unpredicted = sorted(set(table.label[~is_predicted(table)]))
    if unpredicted:  # a run without a point is named, not silently missing
        ax.text(0.98, 0.02, "not predicted (no calibration, no run timed alike): " + ", ".join(unpredicted),
                transform=ax.transAxes, ha="right", va="bottom", fontsize=7, wrap=True)
    ax.set_xlabel("measured tokens/s (decoding steps)")
    ax.set_ylabel("predicted tokens/s (throughput model)")
    ax.set_title(f"Max deviation: {deviation_summary(table)}", fontsize=9)
    ax.legend(fontsize=7)
    return _save(figure, out, "predicted_vs_measured")


def cost_per_token(questions, steps, out):
    """Milliseconds per accepted token split into the throughput model's terms (``token_costs``), against
    what autoregressive decoding pays per token (1x) and half of it (2x): the tallest part is what limits a
    method."""
    table = token_costs(questions, steps)
    if table.empty:
        return []
    figure, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(table) + 2.5), 4.2))
    positions = np.arange(len(table))
    bottom = np.zeros(len(table))
    names = {"draft": "drafting", "one_pass": "one AR pass / accepted tokens per step (acceptance)",
             "extra_verify": "verifying the draft's tokens (verify cost per token)", "overhead": "overhead"}
    for part in COST_PARTS:
        values = table[part].clip(lower=0).to_numpy()  # a pass cheaper than the baseline's mean shows as 0
        ax.bar(positions, values, bottom=bottom, label=names[part])
        bottom += values
    ar = table.ar_ms_per_token.mean()
    ax.axhline(ar, color="black", linestyle="--", linewidth=0.8, label="AR per token (1x)")
    ax.axhline(ar / 2, color="black", linestyle=":", linewidth=0.8, label="2x")
    ax.set_xticks(positions)
    ax.set_xticklabels(table.label, rotation=30, ha="right")
    ax.set_ylabel("ms per accepted token")
    ax.set_title("Where an accepted token's time goes")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(figure, out, "cost_per_token")


def _concurrency_axis(ax, concurrencies) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted({int(value) for value in concurrencies})
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(tick) for tick in ticks])
    ax.set_xlabel("concurrency (requests in flight)")


def speedup_vs_concurrency(load: pd.DataFrame, out: Path) -> list[Path]:
    """Left: each method's speedup over AR against concurrency (``analysis.load.load_table``; a level without
    an AR line has no point). Right: AR's output tokens/s against concurrency, one line per run, the
    throughput the speedups are measured against."""
    table = load_table(load).reset_index()
    models = table.model.nunique()
    labels = sorted(table.label.unique())
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (model, label), group in table.dropna(subset=["speedup"]).groupby(["model", "label"], sort=True):
        color, hatch = method_style(label, labels)
        left.plot(group.concurrency, group.speedup, marker="o", color=color, linestyle="--" if hatch else "-",
                  label=label if models == 1 else f"{model} {label}")
    left.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    _concurrency_axis(left, table.concurrency)
    left.set_ylabel("speedup over AR (output tokens/s)")
    left.set_title("Speedup under load")
    ar = ar_throughput(load)
    for (run_dir, model), group in ar.groupby(["run_dir", "model"], sort=True):
        right.plot(group.concurrency, group.ar_tokens_per_s, marker="o", label=f"{model}: {Path(run_dir).name}")
    _concurrency_axis(right, table.concurrency)
    right.set_ylabel("AR output tokens/s")
    right.set_title("AR throughput under load")
    for ax, empty in ((left, table.speedup.isna().all()), (right, ar.empty)):
        if empty:
            ax.text(0.5, 0.5, "no level with an AR line", transform=ax.transAxes, ha="center", va="center")
        else:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(figure, out, "speedup_vs_concurrency")


def make_all(questions: pd.DataFrame, steps: pd.DataFrame, out: Path,
             load: pd.DataFrame | None = None) -> tuple[list[Path], list[str]]:
    """Every figure the runs support; returns (files written, reasons for figures skipped). ``load``
    (``LoadedRuns.load``) adds speedup_vs_concurrency when a run has load.jsonl (nothing is said otherwise)."""
    written, skipped = [], []
    if has_load(load):
        written += speedup_vs_concurrency(load, out)
    if questions.empty:
        return written, ["no runs with answers"]
    written += speedup_per_task(questions, out)
    written += mat_per_task(questions, out)
    timed = timed_steps(steps)
    if not timed.empty:
        written += latency_breakdown(timed, out)
        written += cost_per_token(questions, timed, out)
        table = model_table(timed)
        written += throughput_vs_acceptance(table, out)
        if is_predicted(table).any():
            written += predicted_vs_measured(table, out)
        else:
            skipped.append(f"predicted_vs_measured: {NO_PREDICTION}")
    elif not steps.empty:
        skipped.append(f"figures of step times: no run has them ({NO_STEP_TIMES})")
    if not steps.empty:
        hd = steps[steps.drafter.str.startswith("hd")]
        if not hd.empty:
            written += hd_ablation(questions, steps, out)
        else:
            skipped.append("hd_ablation: no HD runs")
        if not _draft_manifests(timed.run_dir.unique()).empty:
            written += draft_depth(timed, out)
        else:
            skipped.append("draft_latency_depth: no runs with pruned drafts (scripts/bench_draft_depth.py)")
    else:
        skipped.append("step-level figures: no steps.parquet")
    return written, skipped
