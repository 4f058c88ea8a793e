"""Build a depth-pruned ("wide") draft from a model: keep some of its layers at full width, optionally
distil it against the model (KL on the model's next-token distributions over a corpus), and save a
checkpoint that drafter=draft_model / wide-pruned load.

    python scripts/prune_draft.py --model smollm2-135m --layers 6 --distill-tokens 100000
    python scripts/prune_draft.py --model smollm2-135m --layers 0,10,20,29 --out drafts/smol4
    python scripts/prune_draft.py --model tiny-random --layers 1 --selection first --distill-tokens 0

Without --out the checkpoint goes where drafter=wide-pruned looks for the same settings (the specbench
cache). Use another directory with drafter=draft_model drafter.model.path=DIR.
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
_interrupts = Interrupts("prune_draft: interrupted before it started",
                         "prune_draft: interrupted; no draft was saved: re-running the same command builds it again,"
                         " resuming from the target's answers generated so far (--corpus target-answers)")
if __name__ == "__main__":
    _interrupts.arm()

from hydra.utils import instantiate  # noqa: E402  (after the interrupt handler, on purpose)

from specbench.storage.publish import require_writable  # noqa: E402
from specbench.config import compose  # noqa: E402
from specbench.artefacts.pruned_draft import pruned_draft_directory  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402
from specbench.artefacts.pruned_draft import build_pruned_draft  # noqa: E402
from specbench.training.pruning import SELECTIONS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a config in conf/model/ (the model to prune)")
    parser.add_argument("--layers", default="6", help="how many layers to keep, or their indices (0,10,20,29)")
    parser.add_argument("--selection", choices=SELECTIONS, default="evenly", help="which layers, for a count")
    parser.add_argument("--distill-tokens", type=int, default=100000, help="distillation budget in tokens (0 = none)")
    parser.add_argument("--corpus", default="python-docs", help="distillation corpus: target-answers (the target's own chat answers to the built-in prompt set) "
                        "or a text corpus as for build_datastore.py (python-docs, files, hf:ID)")
    parser.add_argument("--block-size", type=int, default=256, help="tokens per training sequence")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (linear decay)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output directory (default: the cache used by wide-pruned)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.path=/ckpt run.device=cuda")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    layers = [int(i) for i in args.layers.split(",")] if "," in args.layers else int(args.layers)
    try:
        if args.out:  # before minutes of distillation, not when the draft is saved
            require_writable(args.out, hint="choose another --out")
        cfg = compose([f"model={args.model}", *args.overrides])
        target = instantiate(cfg.model, device=cfg.run.device, linear_backend=cfg.run.linear_backend)
        spec = {"layers": layers, "selection": args.selection, "distill_tokens": args.distill_tokens,
                "corpus": args.corpus}
        extra = {"block_size": args.block_size, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed}
        if (args.block_size, args.batch_size, args.lr, args.seed) != (256, 8, 3e-4, 0):
            spec.update(extra)
        out = Path(args.out) if args.out else pruned_draft_directory(target, spec, None)
        manifest = build_pruned_draft(target, out, layers, args.selection, args.distill_tokens, args.corpus, **extra)
    except SpecbenchError as error:
        print(f"prune_draft: error: {error}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"out": str(out), **manifest}, indent=2))


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("prune_draft", main))
