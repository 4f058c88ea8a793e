#!/usr/bin/env python
"""docs/fidelity.md's section "Trained heads: specbench's recipe against each method's": for every kind of head the
trainer knows (specbench/training/methods.py), a table of each setting of the method's published recipe (its
module's PUBLISHED, with SOURCES), specbench's default (specbench.training.heads.recipe_of) and why they differ
(methods.DIFFERENCES), so the table cannot drift from the code.

    python scripts/recipe_tables.py            # print the section
    python scripts/recipe_tables.py --write    # replace it in docs/fidelity.md

A kind whose training module is not in this specbench has no table. tests/test_train_heads.py fails while the
section in the docs is not this script's output.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specbench.reporting import reporting_user_errors  # noqa: E402  # standard library only
from specbench.storage.atomic import write_atomically  # noqa: E402

HEADING = "## Trained heads: specbench's recipe against each method's"
INTRO = """\
A head trained for a target with no published head (`{trained: {...}}`, `scripts/train_head.py`) is specbench's
own, not the authors': one trainer (`specbench/training/heads.py`) runs each kind's hooks (its loss, head and
format, `specbench/training/<method>.py`) with a recipe that starts from the method's published one and departs
from it only where that cannot run here; each departure has its reason in `specbench/training/methods.py`
(`DIFFERENCES`). The tables are written by `scripts/recipe_tables.py` from the code (tests/test_train_heads.py fails
while they are stale). Settings the method does not have (`held_out`, `prompts`, `max_new_tokens`,
`sampled_answers`, `seed`) are specbench's alone and are listed by `python scripts/train_head.py --kind KIND --help`.
A head trains where its target ran (`run.device`: the CPU, or a GPU with `run.device=cuda`), in float32; its
manifest's `trained_on` names the device, and `scripts/gpu_check.py`'s row 5 checks a GPU's training against the
host's, step by step (docs/gpu.md).
"""
REPOSITORIES = {"eagle": "SafeAILab/EAGLE", "eagle3": "SafeAILab/EAGLE", "medusa": "FasterDecoding/Medusa",
                "hydra": "zankner/Hydra", "longspec": "sail-sg/LongSpec, stage 1"}


def present(kind: str) -> bool:
    from specbench.training import methods

    return importlib.util.find_spec(methods.MODULES[kind]) is not None


def shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(shown(item) for item in value) + ")" if value else "the kind's own"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def rows(kind: str) -> list[tuple[str, str, str, str]]:
    """(setting, the method's value and source, specbench's, why) for each setting of the kind's published recipe
    and each of specbench's differences."""
    from specbench.training import methods
    from specbench.training.heads import common_names, recipe_of

    module = methods.module(kind)
    published, sources = module.PUBLISHED[kind], module.SOURCES[kind]
    differences = methods.DIFFERENCES.get(kind, {})
    recipe = recipe_of(kind, {})
    names = list(published) + [name for name in differences if name not in published]
    table = []
    for name in names:
        theirs = f"{shown(published[name])} ({sources[name]})" if name in published else "none"
        if name in recipe.method:
            ours = recipe.method[name]
        elif name in common_names():
            ours = getattr(recipe, name)
        else:
            ours = differences[name][0] if name in differences else published[name]
        why = differences[name][1] if name in differences else "the method's"
        table.append((name, theirs, shown(ours), why))
    return table


def section() -> str:
    from specbench.training import methods

    parts = [HEADING, "", INTRO]
    for kind in methods.KINDS:
        if not present(kind):
            continue
        parts += [f"### `{kind}` ({REPOSITORIES[kind]})", "", "| setting | method's | specbench's | why |",
                  "|---|---|---|---|"]
        parts += [f"| {name} | {theirs} | {ours} | {why} |" for name, theirs, ours, why in rows(kind)]
        parts.append("")
    return "\n".join(parts)


def with_section(document: str, new_section: str) -> str:
    """``document`` with its HEADING section (up to the next heading of its level or above) replaced by
    ``new_section``; a document without one gets it before its "## SuffixDecoding" section."""
    lines = document.splitlines(keepends=True)
    starts = [index for index, line in enumerate(lines) if line.rstrip("\n") == HEADING]
    if starts:
        start = starts[0]
        end = next((index for index in range(start + 1, len(lines)) if lines[index].startswith(("# ", "## "))),
                   len(lines))
    else:
        start = end = next(index for index, line in enumerate(lines) if line.startswith("## SuffixDecoding"))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + new_section + ("\n" + tail if tail else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the section in docs/fidelity.md")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(section())
        return 0
    docs = ROOT / "docs" / "fidelity.md"
    text = with_section(docs.read_text(encoding="utf-8"), section())
    write_atomically(docs, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    print(f"recipe_tables: wrote the recipe tables into {docs.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(reporting_user_errors("recipe_tables", main)())
