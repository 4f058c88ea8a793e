"""The same questions in both regimes of the target (run.regime=eager, Spec-Bench's; compiled, docs/regimes.md), in
one job, with the machine's floor beside them:

    .venv/bin/python scripts/bench_regimes.py          # pld, suffix, recycling+budget, hybrid+budget
    .venv/bin/python scripts/bench_regimes.py --methods pld,eagle3 --limit-per-task 2 -- model=tiny-random

Each (method, regime) is one ``python -m specbench`` run, every question decoded by the method and by AR back to
back in that regime, into a fixed directory under --out, so an interrupted job run again resumes (finished runs are
read back, not run again). One run at a time: the runs are the timings, and run alone. It prints, per method and
regime: AR's tokens/s and ms per pass, that pass over the machine's floor (the weights' bytes over the memory
bandwidth this machine shows, specbench.measure.floor), the verify cost t(q)/t(1) at the verify sizes the run saw,
the method's speedup over AR in the same regime and its MAT; then compiled AR over eager AR. With a vLLM environment
(scripts/vllm_env.sh --find) vLLM's AR on the same questions is a row too. The CPU model, its vector extensions and
the versions head the table. --markdown FILE also writes it as Markdown (docs/results.md keeps one).

A method is a drafter config with specbench's tunings after a plus: ``recycling+budget`` is drafter=recycling
run.draft_budget=auto. Overrides after ``--`` go to every run. Exit status: 0 done, 2 a user error (one line),
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from specbench.interrupts import Interrupts
from specbench.reporting import reporting_user_errors  # standard library only

_interrupts = Interrupts("bench_regimes: interrupted before it started",
                         "bench_regimes: interrupted; finished runs are kept under --out: run the same command again "
                         "to resume")
if __name__ == "__main__":
    _interrupts.arm()

ROOT = Path(__file__).resolve().parents[1]
REGIMES = ("eager", "compiled")
TUNINGS = {"budget": "run.draft_budget=auto", "pad": "run.verify_padding=auto"}
COST_SIZES = (2, 4, 8)  # the verify sizes whose t(q)/t(1) the table shows (the nearest size the run saw)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="pld,suffix,recycling+budget,hybrid+budget",
                        help="comma-separated methods: drafter configs, with +budget / +pad for specbench's tunings")
    parser.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated: eager, compiled")
    parser.add_argument("--limit-per-task", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_regimes"), help="where the runs are kept")
    parser.add_argument("--markdown", default=None, help="also write the table to this Markdown file")
    parser.add_argument("--no-vllm", action="store_true", help="leave out vLLM's AR row even when its environment "
                        "exists (it refuses what vLLM's kernels do not run: tiny-random's 16-dimension heads)")
    parser.add_argument("overrides", nargs="*", help="configuration overrides for every run (after --)")
    return parser.parse_args(argv)


def method_overrides(method: str) -> list[str]:
    """``recycling+budget`` -> [drafter=recycling, run.draft_budget=auto]; a one-line error for an unknown tuning."""
    from specbench.errors import SpecbenchError

    drafter, *tunings = method.split("+")
    unknown = [tuning for tuning in tunings if tuning not in TUNINGS]
    if not drafter or unknown:
        raise SpecbenchError(f"--methods: {method!r} is not a drafter config with +budget or +pad tunings")
    return [f"drafter={drafter}", *(TUNINGS[tuning] for tuning in tunings)]


def run_one(command: list[str], directory: Path) -> dict:
    """The summary of the run in ``directory``, running ``command`` there first unless it already finished."""
    from specbench.errors import SpecbenchError

    summary = directory / "summary.json"
    done = directory / "bench_regimes.done"
    if not done.is_file():
        print(f"\n$ {' '.join(command)}", file=sys.stderr, flush=True)
        result = subprocess.run([*command, f"hydra.run.dir={directory}"], cwd=ROOT)
        if result.returncode == 130:
            raise KeyboardInterrupt
        if result.returncode != 0:
            raise SpecbenchError(f"the run in {directory} failed (exit status {result.returncode}); its own line "
                                 "above says why")
        done.touch()
    return json.loads(summary.read_text())


def figures(summary: dict) -> dict:
    """What the table shows of one run's summary."""
    overall = summary["tasks"]["overall"]
    curve = summary.get("cost_curve") or {}
    relative = {int(size): value for size, value in (curve.get("relative_to_ar_pass") or {}).items()}
    cost = {}
    for size in COST_SIZES:
        seen = [each for each in relative if each >= size]
        if seen:
            nearest = min(seen)
            cost[size] = (nearest, relative[nearest])
    timing = summary.get("timing") or {}
    return {"ar_tokens_per_s": overall.get("baseline_tokens_per_s"), "tokens_per_s": overall.get("tokens_per_s"),
            "speedup": overall.get("speedup"), "mat": overall.get("mean_accepted_tokens"),
            "identical": f"{overall.get('identical_to_baseline')}/{overall.get('questions')}",
            "ar_pass_ms": 1000 * curve["ar_pass_s"] if curve.get("ar_pass_s") else None,
            "floor_ms": 1000 * curve["floor_s"] if curve.get("floor_s") else None,
            "over_floor": curve.get("ar_pass_over_floor"), "cost": cost,
            "compile_s": sum((summary.get("regime") or {}).get("compile_s", {}).values()) or None,
            "flagged": timing.get("trustworthy") is False}


def vllm_python() -> str | None:
    found = subprocess.run([str(ROOT / "scripts" / "vllm_env.sh"), "--find"], capture_output=True, text=True)
    return found.stdout.strip().splitlines()[-1] if found.returncode == 0 and found.stdout.strip() else None


def cell(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(rows: list[tuple[str, str, dict]]) -> list[str]:
    header = ["method", "regime", "AR tok/s", "AR ms/pass", "over floor", *(f"t({q})/t(1)" for q in COST_SIZES),
              "speedup", "MAT", "identical", "compile s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, regime, found in rows:
        costs = [f"{found['cost'][q][1]:.2f}" + ("" if found["cost"][q][0] == q else f" (q={found['cost'][q][0]})")
                 if q in found["cost"] else "-" for q in COST_SIZES]
        flag = " (flagged: a busy machine)" if found["flagged"] else ""
        lines.append("| " + " | ".join([method, regime + flag, cell(found["ar_tokens_per_s"], ".1f"),
                                        cell(found["ar_pass_ms"], ".1f"), cell(found["over_floor"], ".2f") + ("x" if found["over_floor"] else ""),
                                        *costs, cell(found["speedup"], ".2f") + "x", cell(found["mat"], ".2f"),
                                        found["identical"], cell(found["compile_s"], ".0f")]) + " |")
    return lines


def host_lines(summary: dict) -> list[str]:
    from specbench.measure.machine import cpu_model_and_flags

    model, flags = cpu_model_and_flags()
    vectors = " ".join(sorted(flag for flag in flags.split() if flag.startswith(("avx", "amx", "sse4", "fma", "neon"))))
    environment = summary.get("environment", {})
    curve = summary.get("cost_curve") or {}
    floor_ms, megabytes, bandwidth = (curve.get(key) and curve[key] * scale for key, scale in
                                      (("floor_s", 1e3), ("bytes_per_pass", 1e-6), ("bandwidth_bytes_per_s", 1e-9)))
    return [f"Host: {model or 'unknown CPU'} ({os.cpu_count()} cores visible; vector extensions: {vectors or 'none'})",
            f"Software: torch {environment.get('torch')}, transformers {environment.get('transformers')}, "
            f"python {environment.get('python')}; floor {cell(floor_ms, '.1f')} ms a pass ({cell(megabytes, '.0f')} MB "
            f"at {cell(bandwidth, '.1f')} GB/s)"]


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    regimes = [regime for regime in args.regimes.split(",") if regime]
    from specbench.errors import SpecbenchError

    bad = [regime for regime in regimes if regime not in REGIMES]
    if bad:
        raise SpecbenchError(f"--regimes: {bad[0]!r} is not a regime; choose from {', '.join(REGIMES)}")
    methods = [method for method in args.methods.split(",") if method]
    common = [f"task.limit_per_task={args.limit_per_task}", f"run.max_new_tokens={args.max_new_tokens}",
              *args.overrides]
    out = Path(args.out)
    rows, summary = [], None
    for method in methods:
        overrides = method_overrides(method)
        for regime in regimes:
            summary = run_one([sys.executable, "-m", "specbench", *overrides, f"run.regime={regime}", *common],
                              out / regime / method)
            rows.append((method, regime, figures(summary)))
    python = None if args.no_vllm else vllm_python()
    if python is not None and "eager" in regimes:
        vllm = run_one([python, "-m", "specbench", "engine=vllm", "drafter=pld", *common], out / "vllm" / "pld")
        rows.append(("ar (vLLM's)", "vllm", figures(vllm)))
    lines = host_lines(summary) + [""] + table(rows)
    ar = {regime: [found["ar_tokens_per_s"] for _, each, found in rows if each == regime and found["ar_tokens_per_s"]]
          for regime in REGIMES}
    if ar["eager"] and ar["compiled"]:
        eager, compiled = (sum(values) / len(values) for values in (ar["eager"], ar["compiled"]))
        lines += ["", f"compiled AR over eager AR: {compiled / eager:.2f}x ({compiled:.1f} against {eager:.1f} tok/s, "
                      f"the mean over the runs)"]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_interrupts.run(reporting_user_errors("bench_regimes", main)))
