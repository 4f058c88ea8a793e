"""Every drafter on the same model and questions, each paired with the AR baseline per question.

    python scripts/bench_drafters.py --limit-per-task 4 --max-new-tokens 256 --budget --out runs/bench
    python scripts/bench_drafters.py --drafters pld hd hd+budget -- model=vicuna-7b task.path=question.jsonl
    python scripts/bench_drafters.py --corpus sharegpt --model-db-prompts sharegpt --out runs/bench-sharegpt

Each method runs as ``python -m specbench drafter=NAME`` would, into OUT/NAME (re-running resumes); a name
ending in ``+budget`` (or ``+pad``) is the drafter with specbench's draft budget (or shape padding) on, and
``--budget`` adds the ``+budget`` row of every drafter. Then one table per measure is printed, per task:
speedup (the fastest method of each task marked), mean accepted tokens (MAT), acceptance rate, questions
identical to AR (with how many of the others differ at a near-tie or by a violation), all read from each
run's summary.json, and tokens verified and drafting milliseconds per decoding step (prefill excluded) from
its steps.parquet. Every one is defined in ``specbench.measure.metrics``. Last, the accepted draft tokens by source
(for drafters that label their nodes) and where an accepted token's time goes, per method: the throughput
model's terms per accepted token (``analysis.throughput.token_costs``), which show what limits each method.

--corpus sets the statistics corpus of REST and SAM-Decoding (drafter.corpus) and HD (drafter.statistics_corpus);
--model-db-prompts the prompt set of HD's model database (drafter.model_db_build.prompts) and
--model-db-max-prompts how many of its prompts are answered (drafter.model_db_build.max_prompts).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("bench_drafters: interrupted before it started",
                         "bench_drafters: interrupted; finished questions are saved under --out (a run directory per"
                         " method): re-running the same command resumes")
if __name__ == "__main__":
    _interrupts.arm()

import pandas as pd  # noqa: E402  (after the interrupt handler, on purpose)

from analysis.runs import load_questions, load_steps  # noqa: E402
from analysis.tables import exactness_cell  # noqa: E402
from analysis.throughput import token_costs  # noqa: E402
from specbench.measure import metrics  # noqa: E402
from specbench.config import compose  # noqa: E402
from specbench.questions import ALL_TASKS  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402
from specbench.results.readers import read_answers  # noqa: E402
from specbench.runner import run_benchmark  # noqa: E402
from specbench.settings import TUNING_SUFFIXES  # noqa: E402

POSITIONS_SHOWN = 8  # columns of the per-position acceptance table
TUNINGS = {suffix: f"run.{key}=auto" for key, suffix in TUNING_SUFFIXES}  # "+budget" -> run.draft_budget=auto
FAITHFUL = ["pld", "pld-hd", "lookahead", "rest", "hd", "hd-chains", "recycling", "samd", "suffix", "eagle", "eagle2", "eagle3",
            "medusa", "hydra"]
MEASURES = (  # (summary key or column, format, title)
    ("speedup", "{:.2f}x", "speedup over AR (* fastest)"),
    ("mean_accepted_tokens", "{:.2f}", "mean accepted tokens (prefill included, bonus token included)"),
    ("acceptance_rate", "{:.3f}", "acceptance rate (accepted / drafted tokens)"),
    ("verified", "{:.1f}", "tokens verified per decoding step (root, draft and window nodes)"),
    ("draft_ms", "{:.3f}", "drafting latency per decoding step (ms)"),
    ("exactness", "{}", "questions identical to AR (of the others: near-ties, violations)"),
)


def per_step_means(run_dir: Path) -> dict:
    """Per task and overall: mean drafting milliseconds and mean tokens verified per decoding step (prefill
    excluded) of a run directory."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    task_of = {record["question_id"]: record["specbench"]["task"] for record in read_answers(run_dir)}
    groups = [(task, part) for task, part in steps.groupby(steps.question_id.map(task_of))] + [("overall", steps)]
    return {task: {"draft_ms": 1000 * metrics.draft_seconds_per_step(part.draft_s.tolist(), part.step.tolist()),
                   "verified": part[part.step > 0].verify_tokens.mean()}
            for task, part in groups}


def method_overrides(method: str, corpus: str | None = None, model_db_prompts: str | None = None,
                     model_db_max_prompts: int | None = None) -> list[str]:
    """The Hydra overrides of a method name: the drafter config, then one override per tuning suffix."""
    drafter, tunings = method, []
    while drafter.endswith(tuple(TUNINGS)):
        suffix = next(suffix for suffix in TUNINGS if drafter.endswith(suffix))
        drafter, tunings = drafter[: -len(suffix)], [TUNINGS[suffix], *tunings]
    overrides = [f"drafter={drafter}", *tunings]
    if corpus and drafter in ("rest", "samd"):
        overrides.append(f"drafter.corpus={corpus}")
    if corpus and drafter.startswith("hd"):
        overrides.append(f"drafter.statistics_corpus={corpus}")
    if model_db_prompts and drafter.startswith("hd"):
        overrides.append(f"drafter.model_db_build.prompts={model_db_prompts}")
    if model_db_max_prompts and drafter.startswith("hd"):
        overrides.append(f"drafter.model_db_build.max_prompts={model_db_max_prompts}")
    return overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafters", nargs="+", default=FAITHFUL,
                        help="methods: drafter configs, optionally suffixed +budget / +pad")
    parser.add_argument("--budget", action="store_true", help="also run every drafter's +budget row")
    parser.add_argument("--corpus", default=None, help="statistics corpus of rest and hd (e.g. sharegpt)")
    parser.add_argument("--model-db-prompts", default=None, help="prompt set of hd's model database (e.g. sharegpt)")
    parser.add_argument("--model-db-max-prompts", type=int, default=None, help="first N prompts of that set")
    parser.add_argument("--limit-per-task", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/bench_drafters")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. model=vicuna-7b")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    methods = [name for drafter in args.drafters for name in ([drafter, drafter + "+budget"] if args.budget else [drafter])]
    rows, flagged = [], {}
    for name in methods:
        overrides = [*method_overrides(name, args.corpus, args.model_db_prompts, args.model_db_max_prompts),
                     f"run.max_new_tokens={args.max_new_tokens}", *args.overrides]
        if args.limit_per_task:
            overrides.append(f"task.limit_per_task={args.limit_per_task}")
        print(f"== {name}", flush=True)
        run_dir = Path(args.out) / name
        try:
            run_benchmark(compose(overrides), str(run_dir))
        except SpecbenchError as error:
            print(f"bench_drafters: error: {error}", file=sys.stderr)
            sys.exit(2)
        summary = json.loads((run_dir / "summary.json").read_text())
        timing = summary.get("timing") or {}
        if not timing.get("trustworthy", True):
            flagged[name] = timing.get("warnings", [])
        per_step = per_step_means(run_dir)
        for task, stats in summary["tasks"].items():
            # Summaries written before acceptance_rate, near_ties and violations existed lack them: shown as "-".
            exactness = exactness_cell(stats["questions"], stats.get("identical_to_baseline"),
                                       stats.get("near_ties"), stats.get("violations"))
            rows.append({"drafter": name, "task": task, "speedup": stats.get("speedup"),
                         "mean_accepted_tokens": stats.get("mean_accepted_tokens"),
                         "acceptance_rate": stats.get("acceptance_rate"),
                         "draft_ms": per_step.get(task, {}).get("draft_ms"),
                         "verified": per_step.get(task, {}).get("verified"),
                         "exactness": exactness})

    table = pd.DataFrame(rows)
    order = [task for task in (*ALL_TASKS, "overall") if task in set(table.task)]
    for measure, fmt, title in MEASURES:
        pivot = table.pivot(index="task", columns="drafter", values=measure).loc[order, methods]
        shown = pivot.map(lambda value: "-" if value is None or pd.isna(value) else fmt.format(value))
        if measure == "speedup":
            for task in order:
                speedups = pivot.loc[task].astype(float)
                if speedups.notna().any():
                    shown.loc[task, speedups.idxmax()] += " *"
        if measure == "speedup":
            shown.columns = [f"{name} (!)" if name in flagged else name for name in shown.columns]
        print(f"\n{title}\n{shown.to_string()}")
    for name, warnings in flagged.items():
        print(f"(!) {name}: timings untrustworthy, taken on a busy machine: {'; '.join(warnings[:3])}"
              + (" ..." if len(warnings) > 3 else ""))
    sources = pd.DataFrame({name: accepted_by_source(Path(args.out) / name) for name in methods}).T.fillna(0)
    labelled = [column for column in sources if column not in ("none", "no-match")]
    if labelled:
        shares = sources[labelled].div(sources.sum(axis=1), axis=0).loc[lambda t: t.sum(axis=1) > 0]
        print("\naccepted draft tokens by source (HD's databases; SAM-Decoding's and the hybrid's context, corpus "
              "and recycling; SuffixDecoding's request and responses trees; share of all accepted draft tokens)\n" + shares.map(lambda value: f"{value:.3f}").to_string())

    positions = pd.DataFrame({name: acceptance_by_position(Path(args.out) / name) for name in methods}).T
    if not positions.empty:
        print("\nacceptance per draft position (share of decoding steps whose draft reached position i that accepted "
              "a token there; trees: the accepted path's depth; metrics.acceptance_by_position)\n"
              + positions.iloc[:, :POSITIONS_SHOWN].map(lambda v: "-" if pd.isna(v) else f"{v:.2f}").to_string())

    run_dirs = [Path(args.out) / name for name in methods]
    costs = token_costs(load_questions(run_dirs), load_steps(run_dirs))
    print("\nwhere an accepted token's time goes (ms per accepted token, decoding steps; analysis.throughput."
          "token_costs):\none_pass = AR ms per token / accepted tokens per step (the acceptance term), extra_verify = "
          "verify time beyond one AR pass\n(the verify cost of the draft's tokens); speedup_bound = AR ms per token "
          "/ total; needed_tokens_per_step_2x: the acceptance a 2x speedup needs\n"
          + costs.set_index("label").to_string(float_format=lambda value: f"{value:.2f}"))


def acceptance_by_position(run_dir: Path) -> dict:
    """{position: acceptance} over a run's decoding steps (``metrics.acceptance_by_position``)."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    shares = metrics.acceptance_by_position(steps.accepted_tokens.tolist(), steps.draft_depth.tolist())
    return {position: share for position, share in enumerate(shares, start=1)}


def accepted_by_source(run_dir: Path) -> dict:
    """Accepted draft tokens (bonus excluded) per source over a run's decoding steps; the hybrid's labels that
    carry a match length (``context3``) count under their source (``context``)."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    steps = steps[steps.step > 0]
    source = steps.source.replace("", "none").str.replace(r"\d+$", "", regex=True)
    return (steps.accepted_tokens - 1).groupby(source).sum().to_dict()


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("bench_drafters", main))
