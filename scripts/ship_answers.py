"""Write the answers that specbench ships for a model, so that a first use on a fresh machine installs them instead
of generating them: with ``--prompts built-in`` (the default; specbench/data/answers-<model>.json and its
.jsonl.gz) the target's greedy answers to the prompts HD's model database is built from by default, at HD's
max_new_tokens, as ``drafter=hd`` looks them up; with ``--prompts head`` (answers-<model>--head.json and its
.jsonl.gz) its answers to specbench's head prompts at the trained heads' max_new_tokens (256), as every
``{trained: {...}}`` head with the default prompt set looks them up.

    python scripts/ship_answers.py --model smollm2-135m --seconds 1057
    python scripts/ship_answers.py --model smollm2-135m --prompts head --seconds SECONDS

The answers come from the cache (generated first if missing: about 18 minutes on 2 cores for smollm2-135m's
built-in set, about 27 minutes for the head prompts). ``--seconds`` records how long their generation took, for the
manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

_interrupts = Interrupts("ship_answers: interrupted before it started",
                         "ship_answers: interrupted; the answers generated so far are kept: re-running resumes")
if __name__ == "__main__":
    _interrupts.arm()

import torch  # noqa: E402  (after the interrupt handler, on purpose)
import transformers  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import specbench  # noqa: E402
from specbench.storage.publish import require_writable  # noqa: E402
from specbench.config import compose  # noqa: E402
from specbench.artefacts.model_database import model_db_prompt_set  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402
from specbench.artefacts.target_answers import SHIPPED_ANSWERS_DIR, write_shipped_answers  # noqa: E402
from specbench.datastores.prompts import HEAD_PROMPTS, MODEL_DB_PROMPTS  # noqa: E402
from specbench.artefacts.target_answers import resolve_prompt_set  # noqa: E402
from specbench.training.heads import recipe_of  # noqa: E402

LICENSE = ("the greedy answers of SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) to specbench's own prompts "
           "(specbench/data/{file}); model output shipped under the model's Apache-2.0 license")
PROMPT_SETS = ("built-in", "head")


def machine() -> str:
    """The CPU model (from /proc/cpuinfo where there is one), its usable cores and the OS."""
    name = platform.processor() or "CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()} {name}, {len(os.sched_getaffinity(0))} usable cores, {platform.system()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a config in conf/model/")
    parser.add_argument("--seconds", type=float, default=None, help="how long the generation took")
    parser.add_argument("--conditions", default=None, help="how it ran (threads, other load), for the manifest")
    parser.add_argument("--out", default=str(SHIPPED_ANSWERS_DIR), help="where to write (default: the package data)")
    parser.add_argument("--prompts", choices=PROMPT_SETS, default="built-in",
                        help="built-in (HD's model database) or head (the trained heads' prompts)")
    args = parser.parse_args()
    try:
        require_writable(args.out, hint="choose another --out")  # before the answers' generation (minutes)
        cfg = compose([f"model={args.model}", "drafter=hd"])
        build = OmegaConf.to_container(cfg.drafter.model_db_build, resolve=True)
        if args.prompts == "head":
            recipe = recipe_of("eagle3", {})  # every kind's default prompt set and answer length
            prompts, max_new_tokens, file = resolve_prompt_set(recipe.prompts), recipe.max_new_tokens, HEAD_PROMPTS
            batch_size, by = 8, f"scripts/train_head.py --model {args.model}"
        else:
            prompts, _ = model_db_prompt_set(build)  # exactly the prompts drafter=hd answers
            max_new_tokens, file, batch_size = build["max_new_tokens"], MODEL_DB_PROMPTS, build["batch_size"]
            by = "scripts/build_model_db.py --model " + args.model
        target = instantiate(cfg.model, device=cfg.run.device, linear_backend=cfg.run.linear_backend)
        generated = {"machine": machine(), "python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "specbench": specbench.__version__,
                     "dtype": str(target.dtype).removeprefix("torch."), "batch_size": batch_size,
                     "seconds": args.seconds, "conditions": args.conditions,
                     "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "by": by}
        manifest = write_shipped_answers(target, prompts, max_new_tokens, Path(args.out), generated,
                                         LICENSE.format(file=file.name), cfg.drafter.cache_dir,
                                         "head" if args.prompts == "head" else None)
    except SpecbenchError as error:
        print(f"ship_answers: error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"ship_answers: {manifest['answers']} answers ({manifest['answer_tokens']} tokens) of {args.model}, key "
          f"{manifest['key']}, written to {args.out}")


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("ship_answers", main))
