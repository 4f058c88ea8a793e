"""Train an EAGLE head (eagle: EAGLE-1/EAGLE-2's; eagle3) for a model on its own answers to specbench's built-in
prompt set, and save it where drafter=eagle / eagle2 / eagle3 look for it.

    python scripts/train_eagle.py --model smollm2-135m --kind eagle3
    python scripts/train_eagle.py --model smollm2-135m --kind eagle3 --draft-vocab 8192 --train-steps 900
    python scripts/train_eagle.py --model smollm2-135m --kind eagle --out heads/smol-eagle
    python scripts/train_eagle.py --model tiny-random --kind eagle3 --feature-layers 0,1,2 --train-steps 0

Without --out the head goes where the drafter looks for the same settings (the specbench cache), so a drafter
whose heads_by_model entry is ``{trained: {SETTINGS}}`` finds it built; the settings not given take the defaults
of specbench.training.eagle.Recipe, which are those of conf/drafter/eagle.yaml's and eagle3.yaml's entries for
smollm2-135m: ``--kind eagle3`` alone builds the head drafter=eagle3 uses, ``--kind eagle`` alone the one of
drafter=eagle and eagle2. Use another directory with drafter.head.path=DIR. An interrupted training resumes from
its checkpoint when the same command runs again.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import fields
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("train_eagle: interrupted before it started",
                         "train_eagle: interrupted; no head was saved: re-running the same command resumes the "
                         "training from its last checkpoint")
if __name__ == "__main__":
    _interrupts.arm()

from hydra.utils import instantiate  # noqa: E402  (after the interrupt handler, on purpose)

from specbench.config import compose  # noqa: E402
from specbench.artefacts.trained_head import build_trained_head, trained_head_directory  # noqa: E402
from specbench.training.eagle import DEFAULT_TRAIN_STEPS, KINDS, Recipe  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402

HELP = {
    "train_steps": "optimizer steps (0 = an untrained head, built in a second; default: "
                   f"{', '.join(f'{steps} for {kind}' for kind, steps in DEFAULT_TRAIN_STEPS.items())})",
    "batch_sequences": "prompt + answer sequences per step",
    "lr": "AdamW peak learning rate (linear warm-up, cosine decay)",
    "warmup_steps": "steps of linear warm-up",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "gradient clipping by value",
    "seed": "seed of the head's initialisation and of the data order",
    "held_out": "prompts kept out of training to measure acceptance (0 = train on all)",
    "sampled_answers": "answers sampled from the model per training prompt, added to its greedy ones",
    "sample_temperature": "temperature of those samples",
    "feature_layers": "target layers the head reads, e.g. 2,15,27 (none = the kind's default)",
    "draft_vocab_size": "eagle3: draft vocabulary size (none = the target's whole vocabulary)",
    "ttt_steps": "eagle3: training-time-test unroll steps",
    "ttt_decay": "eagle3: loss weight decay per unroll step",
    "p_weight": "eagle: weight of the token loss",
    "v_weight": "eagle: weight of the feature regression",
    "noise": "eagle: uniform feature noise",
}


def setting_value(name: str, text: str):
    """A command-line value of Recipe setting ``name`` in the setting's type (``none`` where null is allowed)."""
    if text.lower() in ("none", "null") and name in ("feature_layers", "draft_vocab_size"):
        return None
    if name == "feature_layers":
        return [int(part) for part in text.split(",") if part.strip()]
    default = next(field.default for field in fields(Recipe) if field.name == name)
    return float(text) if isinstance(default, float) else int(text)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a config in conf/model/ (the target)")
    parser.add_argument("--kind", choices=KINDS, default="eagle3", help="eagle (drafter=eagle, eagle2) or eagle3")
    for field in fields(Recipe):
        flags = [f"--{field.name.replace('_', '-')}"] + (["--draft-vocab"] if field.name == "draft_vocab_size" else [])
        default = "" if field.default is None and field.name == "train_steps" else f" (default: {field.default})"
        parser.add_argument(*flags, dest=field.name, default=None, metavar="VALUE", help=HELP[field.name] + default)
    parser.add_argument("--out", default=None, help="output directory (default: where the drafter looks)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.path=/ckpt run.device=cuda")
    return parser.parse_args(argv)


def spec_of(args: argparse.Namespace) -> dict:
    """The settings given on the command line (the drafter's ``trained`` entry for the same head)."""
    spec = {}
    for field in fields(Recipe):
        text = getattr(args, field.name)
        if text is None:
            continue
        try:
            spec[field.name] = setting_value(field.name, text)
        except ValueError:
            raise SpecbenchError(f"--{field.name.replace('_', '-')} {text!r} is not a valid value; it is the "
                                 f"{HELP[field.name]}") from None
    return spec


def main() -> None:
    args = parse()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        spec = spec_of(args)
        cfg = compose([f"model={args.model}", *args.overrides])
        target = instantiate(cfg.model, device=cfg.run.device, linear_backend=cfg.run.linear_backend)
        out = Path(args.out) if args.out else trained_head_directory(target, args.kind, spec, None)
        manifest = build_trained_head(target, out, args.kind, **spec)
    except SpecbenchError as error:
        print(f"train_eagle: error: {error}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"out": str(out), **manifest}, indent=2))
    held = manifest["held_out"]
    if held["acceptance"]:
        rates = ", ".join(f"{k + 1}: {rate:.3f}" for k, rate in enumerate(held["acceptance"]))
        print(f"{args.kind} head for {target.name} in {out}; held-out acceptance per draft position ({rates}); "
              f"a greedy chain of {len(held['acceptance'])} gets {held['chain_tokens']:.2f} tokens accepted")
    else:
        print(f"{args.kind} head for {target.name} in {out} (acceptance not measured: untrained, or nothing held "
              f"out)")


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("train_eagle", main))
