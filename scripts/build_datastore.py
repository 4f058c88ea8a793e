"""Build a token datastore (suffix array) for REST and HD's statistics database.

    python scripts/build_datastore.py --model smollm2-135m --corpus python-docs --out DIR
    python scripts/build_datastore.py --model vicuna-7b --corpus data/ultrachat.jsonl --out DIR
    python scripts/build_datastore.py --model vicuna-7b --corpus hf:stingning/ultrachat --out DIR

The corpus is tokenized with the target model's tokenizer (the model's weights are not needed beyond
loading it) and saved with a manifest naming the corpus, its size and the tokenizer. Use it with
drafter.datastore=DIR (REST) or drafter.statistics_db=DIR (HD). Without --out, it goes where
``datastore=auto`` looks for it, in the specbench cache (keyed by the corpus files' content; a damaged one
there is rebuilt). --out replaces a datastore already in DIR.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("build_datastore: interrupted before it started",
                         "build_datastore: interrupted; no datastore was written: re-running the same command builds"
                         " it again")
if __name__ == "__main__":
    _interrupts.arm()

from hydra.utils import instantiate  # noqa: E402  (after the interrupt handler, on purpose)

from specbench.storage.cache import cache_root  # noqa: E402
from specbench.storage.publish import require_writable  # noqa: E402
from specbench.config import compose  # noqa: E402
from specbench.artefacts.statistics_datastore import build_datastore, statistics_datastore  # noqa: E402
from specbench.datastores.corpus import DEFAULT_CORPUS  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a config in conf/model/ (its tokenizer is used)")
    parser.add_argument("--corpus", default=DEFAULT_CORPUS,
                        help="python-docs, comma-separated text/jsonl files or directories, or hf:owner/name[:split]")
    parser.add_argument("--out", default=None, help="output directory (default: the cache used by datastore=auto)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.path=/ckpt")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.out:
            require_writable(Path(args.out), "choose a writable --out")
        target = instantiate(compose([f"model={args.model}", *args.overrides]).model, device="cpu", linear_backend="aten")
        if args.out:
            build_datastore(target, args.corpus, Path(args.out), cache_root(None))
        else:
            statistics_datastore(target, "auto", args.corpus)
    except SpecbenchError as error:
        print(f"build_datastore: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("build_datastore", main))
