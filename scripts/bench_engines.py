"""One drafter config and one set of questions through both engines, specbench's loop and vLLM, in one job.

Run it with the vLLM environment's python (it holds both engines):

    py=$(scripts/vllm_env.sh | tail -n 1)
    "$py" scripts/bench_engines.py --drafters pld,sps,eagle3 --limit-per-task 1 --max-new-tokens 128

For each drafter, each engine in turn decodes every question by the method and by AR, back to back per question
(the order alternating as run.alternate_order does), after its own warm-up; one engine is loaded at a time. It
prints per method and engine: AR's tokens/s (how the specbench loop compares with a production engine on the same
machine), the method's tokens/s, the speedup, MAT and acceptance by draft position 1-4 (of the drafts that
reached each, ``metrics.acceptance_by_position``); then whether the two engines' outputs are equal (greedy), AR
against AR and method against method, each difference classified with specbench's mismatch diagnosis (near-tie:
both engines' top two tokens within the tolerance of float32, from their own logits / log-probabilities; violation
otherwise). --markdown FILE also writes the table as Markdown.

Timings are flagged when other processes kept cores busy while an engine decoded (vLLM's own engine processes are
this job's). Overrides after ``--`` go to every run's configuration (``-- model=tiny-random model.hidden_size=128``).
Exit status: 0 done, 2 a user error (one line), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from specbench.interrupts import Interrupts
from specbench.reporting import reporting_user_errors  # standard library only

_interrupts = Interrupts("bench_engines: interrupted before it started",
                         "bench_engines: interrupted; it saves nothing: re-running the same command starts again")
if __name__ == "__main__":
    _interrupts.arm()

ENGINES = ("specbench", "vllm")


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafters", default="pld,sps,eagle3", help="comma-separated drafter configs")
    parser.add_argument("--limit-per-task", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--tasks", default=None, help="comma-separated Spec-Bench tasks (default: all six)")
    parser.add_argument("--markdown", default=None, help="also write the table to this Markdown file")
    parser.add_argument("overrides", nargs="*", help="configuration overrides for every run (after --)")
    return parser.parse_args(argv)


def run_engine(engine_name: str, drafter: str, args) -> dict:
    """Every question by the method and AR through one engine: the answers per role and question, the contention
    seen, and what the engine is."""
    from specbench.config import check_config, choose_engine, compose
    from specbench.distributed import Processes
    from specbench.engines.base import BASELINE, METHOD, SkipQuestion
    from specbench.measure.machine import ContentionMeter
    from specbench.run.selection import TaskSelection
    from specbench.results.run_directory import RunDirectory
    from specbench.run.threads import choose_threads

    import torch

    overrides = [f"drafter={drafter}", f"engine={engine_name}", f"run.max_new_tokens={args.max_new_tokens}",
                 f"task.limit_per_task={args.limit_per_task}", *args.overrides]
    if args.tasks:
        overrides.append(f"task.tasks=[{args.tasks}]")
    if engine_name == "vllm":
        overrides = [item for item in overrides if not item.startswith("engine.")] + \
            [item for item in args.overrides if item.startswith("engine.")]
    else:
        overrides = [item for item in overrides if not item.startswith("engine.")]
    cfg = compose(overrides)
    settings = check_config(cfg)
    threads, _ = choose_threads(settings, None, 1)
    torch.set_num_threads(threads)
    selection = TaskSelection.of(cfg.task)
    questions = selection.read()
    engine_class, engine_settings = choose_engine(cfg)
    engine = engine_class.load(engine_settings, cfg.model, cfg.drafter, settings, Processes())
    questions = selection.fit(questions, engine.prompt_tokens)  # by prompt length, as a run selects them
    answers = {METHOD: {}, BASELINE: {}}
    skipped = []
    meter = ContentionMeter()
    busy = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-engines-") as scratch:
            pending = []
            for prompt in questions:
                try:
                    engine.check_fits(prompt)
                    pending.append(prompt)
                except SkipQuestion as skip:
                    skipped.append((prompt.question_id, skip.reason))
            pending = engine.warm_up(pending, RunDirectory(scratch, with_baseline=True), set(),
                                     lambda prompt, skip: skipped.append((prompt.question_id, skip.reason)))
            for index, prompt in enumerate(pending):
                roles = [METHOD, BASELINE] if index % 2 == 0 else [BASELINE, METHOD]
                meter.start()
                try:
                    decoded = {role: engine.answer(prompt, role) for role in roles}
                except SkipQuestion as skip:
                    skipped.append((prompt.question_id, skip.reason))
                    continue
                busy.append(meter.stop() or 0.0)
                for role, answer in decoded.items():
                    answers[role][prompt.question_id] = (prompt, answer)
                print(f"  {engine_name} {drafter}: question {prompt.question_id} done", file=sys.stderr)
        return {"answers": answers, "skipped": skipped, "busy": max(busy, default=0.0), "threads": threads,
                "tolerance": settings.tolerance(engine.dtype), "environment": engine.environment(),
                "method": settings.method_name(engine.drafter_name) + engine.method_suffix}
    finally:
        engine.close()


def figures(result: dict) -> dict:
    """tokens/s of each role (Spec-Bench: the mean over questions), the speedup, MAT and acceptance by position."""
    from specbench.engines.base import BASELINE, METHOD
    from specbench.measure import metrics

    rates = {role: [] for role in (METHOD, BASELINE)}
    for role in rates:
        for _, answer in result["answers"][role].values():
            rates[role].append(metrics.tokens_per_second([len(ids) for ids in answer.token_ids], answer.wall_times))
    lengths, depths = [], []
    for prompt, answer in result["answers"][METHOD].values():
        record = answer.to_record(prompt, "bench", None)
        lengths += record["choices"][0]["accept_lengths"]
        depths += record["specbench"]["draft_depths"]
    by_position = metrics.acceptance_by_position(lengths, depths) if lengths else []
    return {"ar_tok_s": metrics.mean_rate(rates[BASELINE]), "tok_s": metrics.mean_rate(rates[METHOD]),
            "speedup": metrics.speedup(rates[METHOD], rates[BASELINE]),
            "mat": metrics.mean_accepted_tokens(lengths) if lengths else None,
            "positions": [by_position[i] if i < len(by_position) else None for i in range(4)]}


def cross_engine(ours: dict, theirs: dict, role: str, tolerance: float) -> dict:
    """identical / near-tie / violation counts of ``role``'s answers across the two engines, per question both
    answered."""
    from specbench.measure.mismatch import diagnose

    counts = {"identical": 0, "near_tie": 0, "violation": 0}
    for question_id, (_, answer) in ours["answers"][role].items():
        if question_id not in theirs["answers"][role]:
            continue
        other = theirs["answers"][role][question_id][1]
        mismatch = diagnose(answer.token_ids, other.token_ids, answer.top, other.top, tolerance)
        counts["identical" if mismatch is None else mismatch.kind] += 1
    return counts


def cell(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from specbench.engines.base import BASELINE, METHOD

    rows = []
    environments = {}
    for drafter in [name.strip() for name in args.drafters.split(",") if name.strip()]:
        results = {}
        for engine_name in ENGINES:
            print(f"bench_engines: {drafter} on engine={engine_name}", file=sys.stderr)
            results[engine_name] = run_engine(engine_name, drafter, args)
            environments[engine_name] = results[engine_name]["environment"]
        tolerance = results["specbench"]["tolerance"]
        same = {role: cross_engine(results["specbench"], results["vllm"], role, tolerance)
                for role in (BASELINE, METHOD)}
        for engine_name, result in results.items():
            figure = figures(result)
            rows.append({"drafter": drafter, "engine": engine_name, "method": result["method"], **figure,
                         "questions": len(result["answers"][METHOD]), "busy": result["busy"],
                         "ar_same": same[BASELINE], "method_same": same[METHOD]})
    print_table(rows, environments, args)
    return 0


def same_cell(counts: dict) -> str:
    return f"{counts['identical']}/{counts['near_tie']}/{counts['violation']}"


HEADER = ("drafter", "engine", "questions", "AR tok/s", "tok/s", "speedup", "MAT", "acc@1", "acc@2", "acc@3", "acc@4",
          "AR same", "method same", "flag")


def table_rows(rows: list[dict]) -> list[list[str]]:
    lines = []
    for row in rows:
        flag = f"busy {row['busy']:.1f} cores" if row["busy"] >= 0.5 else ""
        lines.append([row["drafter"], row["engine"], str(row["questions"]), cell(row["ar_tok_s"], ".1f"),
                      cell(row["tok_s"], ".1f"), cell(row["speedup"], ".2f") + "x", cell(row["mat"], ".2f"),
                      *(cell(value, ".2f") for value in row["positions"]),
                      same_cell(row["ar_same"]), same_cell(row["method_same"]), flag])
    return lines


def print_table(rows: list[dict], environments: dict, args) -> None:
    lines = table_rows(rows)
    widths = [max(len(HEADER[i]), *(len(line[i]) for line in lines)) for i in range(len(HEADER))]
    print("  ".join(name.ljust(width) for name, width in zip(HEADER, widths)))
    for line in lines:
        print("  ".join(value.ljust(width) for value, width in zip(line, widths)))
    legend = ("AR same / method same: identical/near-tie/violation, the specbench loop's answers against vLLM's, "
              "question by question (greedy); acc@i: of the drafts that reached position i, the share that accepted a "
              "token there (acceptance_by_position, not vLLM's per_position_acceptance_rate over all drafts); flag: "
              "other processes kept cores busy (a flagged number is not a result)")
    print(legend)
    machine = environments.get("specbench", {})
    versions = (f"machine: {machine.get('device')}; python {machine.get('python')}, torch {machine.get('torch')}, "
                f"transformers {machine.get('transformers')}, {environments.get('vllm', {}).get('engine')}")
    print(versions)
    if args.markdown:
        from pathlib import Path

        text = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        text += ["| " + " | ".join(line) + " |" for line in lines]
        text += ["", legend + ".", "", versions + ".", ""]
        Path(args.markdown).write_text("\n".join(text))


if __name__ == "__main__":
    sys.exit(_interrupts.run(reporting_user_errors("bench_engines", main)))
