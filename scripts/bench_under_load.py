"""Does a method's speedup survive load? Methods through vLLM at several concurrency levels on the same questions,
each beside vLLM's AR at the same level, in one job; then one table.

Run it with the vLLM environment's python:

    py=$(scripts/vllm_env.sh | tail -n 1)
    "$py" scripts/bench_under_load.py --out runs/bench-under-load --levels 1,4,16 --limit-per-task 3 \\
        --max-new-tokens 64

Each method is ``ENGINE:DRAFTER`` (``vllm-custom:hd-chains``: specbench's drafter inside vLLM's step;
``vllm:pld``: vLLM's own ngram for PLD's config) and runs as ``python -m specbench engine=ENGINE drafter=DRAFTER
engine.paired=false engine.concurrency=[LEVELS]`` into ``OUT/<engine>-<drafter>``, one after another (each run
measures AR and the method at every level after its own warm-up; a run directory that exists is resumed, so an
interrupted job continues where it stopped). The table gives per method and level: AR's and the method's output
tokens/s, the speedup, vLLM's mean acceptance length (MAL) and acceptance rate, how many requests were identical to
AR's, and for specbench's drafters inside vLLM what drafting cost: milliseconds per engine step and its share of the
level's wall time (drafting is on the engine's critical path). The host's CPU is named above it. --markdown FILE also
writes it as Markdown. Overrides after ``--`` go to every run (``-- engine.enforce_eager=true``).
Exit status: 0 done, 2 a user error (one line), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.interrupts import Interrupts
from specbench.reporting import reporting_user_errors  # standard library only

_interrupts = Interrupts("bench_under_load: interrupted before it started",
                         "bench_under_load: interrupted; re-running the same command resumes each method's run "
                         "where it stopped")
if __name__ == "__main__":
    _interrupts.arm()

DEFAULT_METHODS = ("vllm-custom:hd-chains,vllm-custom:rest,vllm-custom:pld,vllm-custom:samd-automata,vllm:pld,"
                   "vllm:suffix")


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated ENGINE:DRAFTER")
    parser.add_argument("--levels", default="1,4,16", help="comma-separated requests in flight")
    parser.add_argument("--limit-per-task", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="runs/bench-under-load")
    parser.add_argument("--markdown", default=None, help="also write the table to this Markdown file")
    parser.add_argument("--table-only", action="store_true", help="run nothing: the table of what OUT holds")
    parser.add_argument("overrides", nargs="*", help="configuration overrides for every run (after --)")
    args = parser.parse_args(argv)
    methods = []
    for item in args.methods.split(","):
        engine, _, drafter = item.partition(":")
        if engine not in ("vllm", "vllm-custom") or not drafter:
            parser.error(f"--methods: {item!r} is not ENGINE:DRAFTER with ENGINE vllm or vllm-custom")
        methods.append((engine, drafter))
    try:
        levels = [int(level) for level in args.levels.split(",")]
    except ValueError:
        parser.error(f"--levels: {args.levels!r} is not a comma-separated list of whole numbers")
    return args, methods, levels


def run(engine: str, drafter: str, levels: list[int], args, directory: Path) -> None:
    command = [sys.executable, "-m", "specbench", f"engine={engine}", f"drafter={drafter}", "engine.paired=false",
               f"engine.concurrency=[{','.join(map(str, levels))}]", f"task.limit_per_task={args.limit_per_task}",
               f"run.max_new_tokens={args.max_new_tokens}", f"hydra.run.dir={directory}", *args.overrides]
    print(f"bench_under_load: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(command)
    if done.returncode != 0:
        raise SpecbenchError(f"{engine}:{drafter} stopped (exit {done.returncode}); re-run the same command to resume "
                             "it")


def host() -> str:
    from specbench.measure.machine import cpu_model_and_flags

    model, flags = cpu_model_and_flags()
    vector = [flag for flag in ("avx2", "avx512f", "amx_tile") if flag in flags.split()]
    return f"{model or 'unknown CPU'}, {os.cpu_count()} cores, {' '.join(vector) or 'no AVX2'}"


def rows(directory: Path) -> list[dict]:
    """One row per level of a run directory: AR's and the method's lines side by side."""
    path = directory / "load.jsonl"
    if not path.is_file():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by = {(line["concurrency"], line["role"]): line for line in lines}
    found = []
    for level in sorted({concurrency for concurrency, _ in by}):
        ar, method = by.get((level, "baseline")), by.get((level, "method"))
        if ar is None or method is None:
            continue
        proposer = method.get("proposer") or {}
        draft_s = proposer.get("draft_s")
        found.append({
            "method": method["method"], "level": level, "ar": ar["output_tokens_per_s"],
            "tok_s": method["output_tokens_per_s"], "speedup": method["output_tokens_per_s"] / ar["output_tokens_per_s"],
            "mal": method.get("mean_acceptance_length"),
            "accept": (method["accepted_tokens"] / method["draft_tokens"]) if method.get("draft_tokens") else None,
            "identical": f"{method.get('identical_to_baseline')}/{method['requests']}",
            "ms_per_step": proposer.get("draft_ms_per_call"),
            "share": None if draft_s is None else draft_s / method["duration_s"],
        })
    return found


def table(found: list[dict]) -> list[str]:
    def number(value, pattern):
        return "-" if value is None else pattern.format(value)

    lines = ["| method | in flight | AR tok/s | tok/s | speedup | MAL | accept | identical | draft ms/step | "
             "draft share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in found:
        lines.append(f"| `{row['method']}` | {row['level']} | {row['ar']:.1f} | {row['tok_s']:.1f} | "
                     f"{row['speedup']:.2f}x | {number(row['mal'], '{:.2f}')} | {number(row['accept'], '{:.2f}')} | "
                     f"{row['identical']} | {number(row['ms_per_step'], '{:.2f}')} | "
                     f"{number(row['share'], '{:.1%}')} |")
    return lines


def main(argv=None) -> int:
    args, methods, levels = parse(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    for engine, drafter in methods:
        if not args.table_only:
            run(engine, drafter, levels, args, out / f"{engine}-{drafter}")
    found = [row for engine, drafter in methods for row in rows(out / f"{engine}-{drafter}")]
    text = [f"host: {host()}", "", *table(found)]
    print("\n".join(text))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_interrupts.run(reporting_user_errors("bench_under_load", main)))
