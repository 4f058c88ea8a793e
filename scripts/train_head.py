"""Train a draft head (eagle: EAGLE-1/EAGLE-2's; eagle3; medusa; hydra) for a model on its own answers to a prompt
set (by default specbench's head prompts), and save it where the drafter of that kind looks for it.

    python scripts/train_head.py --model smollm2-135m --kind eagle3
    python scripts/train_head.py --model smollm2-135m --kind eagle3 --draft-vocab-size 8192 --epochs 8
    python scripts/train_head.py --model smollm2-135m --kind eagle --out heads/smol-eagle
    python scripts/train_head.py --model tiny-random --kind eagle3 --feature-layers 0,1,2 --train-steps 0
    python scripts/train_head.py --model smollm2-135m --kind hydra
    python scripts/train_head.py --model qwen3-8b --kind eagle3 run.device=cuda   # the features and the training there

The head trains where the target runs (``run.device``), in float32, or on the host with ``--train-device cpu``; its
manifest's ``trained_on`` says where.
Without --out the head goes where the drafter looks for the same settings (the specbench cache), so a drafter
whose heads_by_model entry is ``{trained: {SETTINGS}}`` finds it built; the settings not given take the kind's
defaults (specbench.training.heads.recipe_of: the method's published recipe with specbench's differences, listed in
docs/fidelity.md), which are those of the drafters' entries for smollm2-135m: ``--kind eagle3`` alone builds the head
drafter=eagle3 uses, ``--kind eagle`` alone the one of drafter=eagle and eagle2, ``--kind medusa`` alone
drafter=medusa's, ``--kind hydra`` alone drafter=hydra's. Use another directory with drafter.head.path=DIR. An interrupted training resumes from its
checkpoint when the same command runs again.
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
_interrupts = Interrupts("train_head: interrupted before it started",
                         "train_head: interrupted; no head was saved: re-running the same command resumes the "
                         "training from its last checkpoint")
if __name__ == "__main__":
    _interrupts.arm()

from hydra.utils import instantiate  # noqa: E402  (after the interrupt handler, on purpose)

from specbench.config import compose  # noqa: E402
from specbench.artefacts.trained_head import TRAIN_DEVICES, build_trained_head, trained_head_directory  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402
from specbench.training import methods  # noqa: E402
from specbench.artefacts.target_answers import PROMPT_SETS  # noqa: E402
from specbench.training.heads import SCHEDULES, common_names, kind_defaults, recipe_of  # noqa: E402

DEFAULT_KIND = "eagle3"
HELP = {
    "train_steps": "optimizer steps (0 = an untrained head, built in a second; none = --epochs over the data)",
    "epochs": "passes over the training answers when --train-steps is none",
    "batch_sequences": "prompt + answer sequences per step",
    "lr": "AdamW peak learning rate",
    "schedule": f"learning rate after the warm-up: {', '.join(SCHEDULES)}",
    "warmup_steps": "steps of linear warm-up (none = --warmup-ratio of the steps)",
    "warmup_ratio": "share of the steps spent in linear warm-up",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "gradient clipping threshold (0 = none)",
    "grad_clip_by": "clip each gradient entry (value) or the global norm (norm)",
    "betas": "AdamW betas, e.g. 0.9,0.95",
    "seed": "seed of the head's initialisation and of the data order",
    "held_out": "prompts kept out of training to measure acceptance (0 = train on all)",
    "prompts": f"the prompt set answered: {', '.join(PROMPT_SETS)}, sharegpt[:FILE], hf:owner/name or a file",
    "max_new_tokens": "length of the model's answers",
    "sampled_answers": "answers sampled from the model per training prompt, added to its greedy ones",
    "sample_temperature": "temperature of those samples",
}
_INTEGER = ("train_steps", "warmup_steps", "batch_sequences", "seed", "held_out", "max_new_tokens", "sampled_answers")
_NULLABLE = ("train_steps", "warmup_steps")
_TEXT = ("schedule", "grad_clip_by", "prompts")


def flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def setting_value(kind: str, name: str, text: str):
    """A command-line value of setting ``name`` of a ``kind`` head in the setting's type (``none`` where null is
    allowed; lists comma-separated)."""
    module = methods.module(kind)
    method = module.METHOD_SETTINGS[kind]
    nullable = name in _NULLABLE or name in getattr(module, "NULLABLE", {}).get(kind, ())
    if text.lower() in ("none", "null") and nullable:
        return None
    if name in method:
        default = method[name]
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if isinstance(default, tuple):
            return [int(part) for part in text.split(",") if part.strip()]
        return type(default)(text) if isinstance(default, (int, float, str)) else text
    if name == "betas":
        return [float(part) for part in text.split(",")]
    if name in _TEXT:
        return text
    return int(text) if name in _INTEGER else float(text)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--kind", default=DEFAULT_KIND)
    kind = first.parse_known_args(argv)[0].kind
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a config in conf/model/ (the target)")
    parser.add_argument("--kind", choices=methods.KINDS, default=DEFAULT_KIND,
                        help="eagle (drafter=eagle, eagle2), eagle3, medusa or hydra; its own settings follow")
    defaults = kind_defaults(kind) if kind in methods.KINDS else {}
    for name in common_names():
        shown = f" (default for {kind}: {defaults[name]})" if name in defaults else ""
        parser.add_argument(flag(name), dest=name, default=None, metavar="VALUE", help=HELP[name] + shown)
    if kind in methods.KINDS:
        with _one_line():
            module = methods.module(kind)
        for name, default in module.METHOD_SETTINGS[kind].items():
            parser.add_argument(flag(name), dest=name, default=None, metavar="VALUE",
                                help=f"{kind}: {name} (default: {default})")
    parser.add_argument("--out", default=None, help="output directory (default: where the drafter looks)")
    parser.add_argument("--train-device", choices=TRAIN_DEVICES, default="target",
                        help="where the head trains: target (the target's device, run.device; default) or cpu "
                             "(the host: for a GPU without memory for the head beside the target); not part of the "
                             "head's settings")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.path=/ckpt run.device=cuda")
    return parser.parse_args(argv)


class _one_line:
    """A kind whose training module is missing is the script's one-line error, not a traceback."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, SpecbenchError):
            print(f"train_head: error: {error}", file=sys.stderr)
            sys.exit(2)
        return False


def spec_of(args: argparse.Namespace) -> dict:
    """The settings given on the command line (the drafter's ``trained`` entry for the same head)."""
    spec = {}
    names = [*common_names(), *methods.module(args.kind).METHOD_SETTINGS[args.kind]]
    for name in names:
        text = getattr(args, name, None)
        if text is None:
            continue
        try:
            spec[name] = setting_value(args.kind, name, text)
        except ValueError:
            raise SpecbenchError(f"{flag(name)} {text!r} is not a valid value; it is "
                                 f"{HELP.get(name, f'the {args.kind} setting {name}')}") from None
    return spec


def main() -> None:
    args = parse()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        spec = spec_of(args)
        recipe_of(args.kind, spec)  # a recipe out of range is one line before the model loads
        cfg = compose([f"model={args.model}", *args.overrides])
        target = instantiate(cfg.model, device=cfg.run.device, linear_backend=cfg.run.linear_backend)
        out = Path(args.out) if args.out else trained_head_directory(target, args.kind, spec, None)
        manifest = build_trained_head(target, out, args.kind, train_device=args.train_device, **spec)
    except SpecbenchError as error:
        print(f"train_head: error: {error}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"out": str(out), **manifest}, indent=2))
    held, trained = manifest["held_out_acceptance"], manifest["train_acceptance"]
    if held["acceptance"]:
        rates = ", ".join(f"{k + 1}: {rate:.3f}" for k, rate in enumerate(held["acceptance"]))
        print(f"{args.kind} head for {target.name} in {out}; held-out acceptance per draft position ({rates}); "
              f"a greedy chain of {len(held['acceptance'])} gets {held['chain_tokens']:.2f} tokens accepted held "
              f"out, {trained['chain_tokens']:.2f} on as many training answers")
    else:
        print(f"{args.kind} head for {target.name} in {out} (acceptance not measured: untrained, or nothing held "
              f"out)")


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("train_head", main))
