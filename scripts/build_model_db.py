"""Build HD's model database: n-grams the target model tends to generate, by document frequency over its
greedy answers to a prompt set that is disjoint from the evaluation questions.

    python scripts/build_model_db.py --model smollm2-135m
    python scripts/build_model_db.py --model vicuna-7b --prompts hf:OpenAssistant/oasst1 --out DIR
    python scripts/build_model_db.py --prompts sharegpt drafter.model_db_build.max_prompts=512

Prompts sharing a word 8-gram with the evaluation questions (task.path, or the built-in sample) are left out.

Without --out, the database goes where ``drafter.model_db=auto`` looks for it (for the same settings, prompt
and question files by content; a damaged one there is rebuilt). Use a directory elsewhere with
drafter.model_db=DIR; --out replaces a database already in DIR.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("build_model_db: interrupted before it started",
                         "build_model_db: interrupted; the target's answers generated so far are kept: re-running "
                         "the same command resumes from them")
if __name__ == "__main__":
    _interrupts.arm()

from hydra.utils import instantiate  # noqa: E402  (after the interrupt handler, on purpose)

from specbench.storage.publish import require_writable  # noqa: E402
from specbench.config import compose  # noqa: E402
from specbench.artefacts.model_database import build_model_db, model_db  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a config in conf/model/")
    parser.add_argument("--prompts", default=None,
                        help="prompt set: a jsonl/text file, sharegpt, hf:OpenAssistant/oasst1 (default: the built-in set)")
    parser.add_argument("--out", default=None, help="output directory (default: where model_db=auto looks)")
    parser.add_argument("overrides", nargs="*",
                        help="extra Hydra overrides, e.g. drafter.model_db_build.max_new_tokens=256 run.device=cuda")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = compose([f"model={args.model}", "drafter=hd", *args.overrides])
        hd = cfg.drafter
        settings = dict(hd.model_db_build)
        if args.prompts:
            settings["prompts"] = args.prompts
        if args.out:
            require_writable(Path(args.out), "choose a writable --out")
        target = instantiate(cfg.model, device=cfg.run.device, linear_backend=cfg.run.linear_backend)
        if args.out:
            build_model_db(target, Path(args.out), settings, 1, hd.draft_length, hd.cache_dir)
        else:
            model_db(target, "auto", 1, hd.draft_length, hd.per_key_capacity, settings, hd.cache_dir)
    except SpecbenchError as error:
        print(f"build_model_db: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("build_model_db", main))
