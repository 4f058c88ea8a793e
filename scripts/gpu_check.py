#!/usr/bin/env python
"""One command that checks specbench on the machine at hand and prints a PASS/FAIL table (docs/gpu.md).

    python3 scripts/gpu_check.py                   # the GPU if torch sees one, else the CPU (smaller sizes)
    python3 scripts/gpu_check.py --device cpu --quick --out check.json
    python3 scripts/gpu_check.py --out "$OUT/gpu_check.json"   # on the device tool's machine: $OUT comes back

The rows and what each checks are ``specbench.device_check``'s (its docstring, docs/gpu.md): (1) float32
losslessness of every drafter config, (2) float16 / bfloat16 against AR, (3) a 7B-shaped model's memory, verify
latencies, round trips, step shares and the loop's verify against its own pass, (4) device_map and tensor
parallelism against one device, (5) head training on the device against the host. This script parses the
arguments, runs the chosen rows in a throw-away cache and prints the table (and --out, its JSON). Exit status 0
iff no row FAILs.

Drafter configs are composed with hydra as the tests compose them: on a bare GPU machine install the wheels that
``scripts/gpu_bundle.sh`` prepares (hydra-core, omegaconf, antlr4, pydivsufsort, gguf; the command it prints installs
them). Without hydra, rows 1-2 are FAIL with the reason and the rest still runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specbench.reporting import reporting_user_errors  # noqa: E402  # standard library only
from specbench.interrupts import Interrupts  # noqa: E402

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("gpu_check: interrupted before it started",
                         "gpu_check: interrupted; no table was printed, and no --out file written")
if __name__ == "__main__":
    _interrupts.arm()

import torch  # noqa: E402

from specbench import testing  # noqa: E402  # the tests' kit: tiny model, greedy reference, cache, counting target
from specbench.device_check import ROW_GROUPS, Check, Row, run_rows, tensor_parallel_worker  # noqa: E402

MADE_CACHES: list[Path] = []  # removed by main's finally


def isolated_cache() -> Path:
    """Databases the drafters build go to a throw-away cache, their corpus replaced by the tests' small text
    (as tests/conftest.py does), so no row downloads anything or reads the user's cache; recorded in MADE_CACHES
    the moment it exists (with Ctrl-C held back), since main's finally removes only those."""
    return testing.isolated_cache("specbench-gpu-check-", share_models=False, on_made=MADE_CACHES.append)


# ---- the command ---------------------------------------------------------------------------------------------


def resolve(device: str) -> torch.device:
    """``--device`` as ``run.device`` resolves it (one line and exit 2 when torch cannot give it)."""
    from specbench.errors import SpecbenchError
    from specbench.models.devices import resolve_device

    try:
        return resolve_device(device)
    except SpecbenchError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def environment(device: torch.device) -> str:
    import transformers

    parts = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    if device.type == "cuda":
        parts.append(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})")
    else:
        parts.append(f"cpu, {torch.get_num_threads()} threads")
    return ", ".join(parts)


def row_groups(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in ROW_GROUPS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(ROW_GROUPS)}, comma-separated")
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (the test, CI)")
    parser.add_argument("--out", help="also write the table as JSON to this file")
    parser.add_argument("--rows", default=",".join(ROW_GROUPS), type=row_groups,
                        help=f"the rows to run, a comma list of {', '.join(ROW_GROUPS)} (default: all; "
                             "tp: the tensor-parallel row of group 4)")
    parser.add_argument("--tp-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        isolated_cache()
        if args.tp_worker:
            return tensor_parallel_worker(args.device, args.out)
        device = resolve(args.device)
        check = Check(device, args.quick, worker=Path(__file__).resolve())
        began = time.perf_counter()
        print(f"gpu_check on {environment(device)}{' (quick)' if args.quick else ''}", flush=True)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False  # float32 losslessness is checked against float32 math
            torch.backends.cudnn.allow_tf32 = False
        run_rows(check, args.rows)
        wall = time.perf_counter() - began
        print_table(check.rows, wall)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"environment": environment(device), "quick": args.quick,
                                                  "wall_s": wall, "rows": [asdict(row) for row in check.rows]},
                                                 indent=1))
        return 1 if any(row.status == "FAIL" for row in check.rows) else 0
    finally:
        for cache in MADE_CACHES:
            shutil.rmtree(cache, ignore_errors=True)


def print_table(rows: list[Row], wall: float) -> None:
    width = max(len(row.name) for row in rows)
    print(f"\n{'check':<{width}}  result  seconds  detail")
    print(f"{'-' * width}  ------  -------  ------")
    for row in rows:
        print(f"{row.name:<{width}}  {row.status:<6}  {row.seconds:7.1f}  {row.detail}")
    counts = {status: sum(row.status == status for row in rows) for status in ("PASS", "FAIL", "SKIP")}
    print(f"\n{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in {wall:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(_interrupts.run(reporting_user_errors("gpu_check", main)))
