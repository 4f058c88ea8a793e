"""DSD's depth question at small scale: depth-pruned drafts of the target, each measured for draft latency
per token, acceptance and speedup over AR on the same questions.

    python scripts/bench_draft_depth.py --depths 2 4 6 8 --distill-tokens 100000 --limit-per-task 1

For each depth the draft keeps that many of the target's layers (evenly spaced, full width), distilled on
--distill-tokens tokens (cached: built once per setting, as scripts/prune_draft.py does), then runs as
drafter=draft_model into OUT/L<depth> (re-running resumes). The table gives the draft's parameters, its
latency per drafted token next to the target's, the share of drafted tokens accepted, the mean accepted
tokens per step (MAT) and the paired speedup.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("bench_draft_depth: interrupted before it started",
                         "bench_draft_depth: interrupted; pruned drafts already built and finished questions under "
                         "--out are kept: re-running the same command resumes")
if __name__ == "__main__":
    _interrupts.arm()

import numpy as np  # noqa: E402  (after the interrupt handler, on purpose)
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from hydra.utils import instantiate  # noqa: E402

from specbench.config import compose  # noqa: E402
from specbench.decoding.loop import Decoder  # noqa: E402
from specbench.targets.transformers import TransformersTarget  # noqa: E402
from specbench.artefacts.pruned_draft import build_pruned_draft, pruned_draft_directory  # noqa: E402
from specbench.runner import run_benchmark  # noqa: E402


def seconds_per_token(model, context_tokens: int = 256, tokens: int = 48) -> float:
    """Median time of a one-token forward pass on top of a ``context_tokens`` cache, measured by the library's
    fenced verify-latency loop (inputs on the model's device, the device synchronised around each pass)."""
    target = TransformersTarget(model)
    context = np.random.default_rng(0).integers(100, min(1000, target.vocab_size), context_tokens).tolist()
    decoder = Decoder(target, frozenset(), max_draft_tokens=1)
    return decoder.measure_verify_latency(context, [1], repeats=tokens)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--depths", nargs="+", type=int, default=[2, 4, 6, 8])
    parser.add_argument("--distill-tokens", type=int, default=100000)
    parser.add_argument("--corpus", default="python-docs", help="distillation corpus, as for prune_draft.py")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--limit-per-task", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/draft_depth")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cfg = compose([f"model={args.model}", *args.overrides])
    target = instantiate(cfg.model, device=cfg.run.device, linear_backend=cfg.run.linear_backend)
    target_seconds = seconds_per_token(target.weights.module)
    rows = []
    for depth in args.depths:
        spec = {"layers": depth, "selection": "evenly", "distill_tokens": args.distill_tokens, "corpus": args.corpus}
        directory = pruned_draft_directory(target, spec, None)
        if not (directory / "config.json").is_file():
            build_pruned_draft(target, directory, depth, "evenly", args.distill_tokens, args.corpus)
        from transformers import AutoModelForCausalLM

        from specbench.targets.kernels import use_linear_backend

        draft = AutoModelForCausalLM.from_pretrained(directory, dtype=target.dtype, attn_implementation="sdpa")
        draft = draft.to(target.device).eval()
        parameters = sum(p.numel() for p in draft.parameters())  # before oneDNN packs the linear weights away
        use_linear_backend(draft, cfg.run.linear_backend)
        draft_seconds = seconds_per_token(draft)
        name = f"pruned-L{depth}"
        summary = run_benchmark(compose([
            f"model={args.model}", "drafter=draft_model", f"drafter.name={name}", f"drafter.model.path={directory}",
            f"drafter.gamma={args.gamma}", f"run.max_new_tokens={args.max_new_tokens}",
            f"task.limit_per_task={args.limit_per_task}", *args.overrides,
        ]), str(Path(args.out) / f"L{depth}"))
        steps = pd.read_parquet(Path(args.out) / f"L{depth}" / "steps.parquet")
        steps = steps[steps.step > 0]
        overall = summary["tasks"]["overall"]
        rows.append({
            "draft": name, "layers": depth, "parameters_M": parameters / 1e6,
            "draft_ms_per_token": draft_seconds * 1000, "target_ms_per_token": target_seconds * 1000,
            "acceptance": (steps.accepted_tokens - 1).sum() / max(1, steps.draft_tokens.sum()),
            "MAT": overall["mean_accepted_tokens"], "speedup": overall["speedup"],
            "identical": f"{overall['identical_to_baseline']}/{overall['questions']}",
        })
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3f}"), flush=True)


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("bench_draft_depth", main))
