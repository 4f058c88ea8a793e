#!/usr/bin/env python
"""Where each module is tested: for every module of specbench/ and analysis/, the files under tests/ that import it,
as the markdown table of docs/development.md's section "Where each module is tested".

    python scripts/module_tests.py            # print the table
    python scripts/module_tests.py --write    # replace the table in docs/development.md with it

A test file "imports" a module when one of its import lines names it: ``import a.b``, ``from a.b import c``
(module ``a.b.c`` where that is a module, else ``a.b``), at the top, inside a function (a lazy import tests the
module as much) or inside a Python program the test writes out as a string and runs. A package whose
``__init__.py`` holds nothing but its docstring and constants has nothing to test and no row. A module no test file imports is
allowed only if UNTESTED_BY_IMPORT below gives the reason, or if it is a drafter (the ``_target_`` of a conf/drafter/
config, which the contract tests build), and the table shows why (tests/test_module_tests.py checks that, and that
the table in the docs is this one).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specbench.reporting import reporting_user_errors  # noqa: E402  # standard library only

PACKAGES = ("specbench", "analysis")
HEADING = "## Where each module is tested"
INTRO = """\
Every module of specbench/ and analysis/ and the test files under tests/ that import it, made by
`scripts/module_tests.py` (run it with `--write` after moving a module: tests/test_module_tests.py fails while this
table is stale, and for a module no test imports unless the script says why). What tests share is in
`specbench/testing.py`, the test kit that scripts/gpu_check.py uses too (the tiny model, the greedy reference, the
isolated cache, the drafter factory, the counting Target), and in tests/conftest.py (pytest's fixtures over it,
and the helpers only tests use)."""

# Modules that no test file imports, and why each is still tested or needs no test of its own. A module leaves this
# list as soon as a test imports it (the test fails on a stale entry).
UNTESTED_BY_IMPORT = {
    # Reached through the module that uses it, where the tests look at what a user sees.
    "specbench.models.loaded": "LoadedModel is what every loader returns: tested through the loaders' models "
                               "(the tiny fixture; test_target_weights.py, test_target_models.py)",
    "specbench.results.left_out": "the one warning per file naming left-out lines: tested through the readers "
                                  "(test_result_lines.py, test_damaged_files.py)",
    "specbench.results.validation": "what a line must hold: tested through the readers and the analysis inputs "
                                    "(test_result_lines.py, test_analysis_inputs.py)",
    "specbench.storage.refusal": "the one wording of a refused write: tested through every writer's refusal "
                                 "(test_storage.py, test_atomic.py, test_damaged_files.py)",
}


# Why a drafter's module needs no test importing it: the tests build every config of conf/drafter/ through its
# _target_, so a new drafter is tested from the moment its yaml exists (docs/development.md, "Adding a drafter").
DRAFTER = ("a drafter: the contract tests build every conf/drafter/ config through its _target_ (test_contract.py, "
           "test_sampling.py, test_config.py)")


def drafter_modules(root: Path = ROOT) -> set[str]:
    """The modules conf/drafter/'s configs name as ``_target_`` (``specbench.drafters.pld``), read from the files."""
    modules = set()
    for path in (root / "conf" / "drafter").glob("*.yaml"):
        found = re.search(r"^_target_:\s*([\w.]+)", path.read_text(encoding="utf-8"), re.MULTILINE)
        if found:
            modules.add(found.group(1).rpartition(".")[0])
    return modules


def why_untested(name: str, root: Path = ROOT) -> str | None:
    """Why module ``name`` needs no test file importing it (UNTESTED_BY_IMPORT, or a drafter), or None."""
    if name in UNTESTED_BY_IMPORT:
        return UNTESTED_BY_IMPORT[name]
    return DRAFTER if name in drafter_modules(root) else None


def module_name(path: Path, root: Path = ROOT) -> str:
    """``specbench/decoding/loop.py`` -> ``specbench.decoding.loop``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def holds_no_code(path: Path) -> bool:
    """Whether ``path`` is nothing but its docstring and constants (``__version__ = "0.1.0"``)."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, (ast.Expr, ast.Assign)) and isinstance(node.value, ast.Constant) for node in body)


def modules(root: Path = ROOT) -> list[str]:
    """Every module of PACKAGES under ``root``, sorted, but packages whose ``__init__.py`` holds no code."""
    paths = [path for package in PACKAGES for path in (root / package).rglob("*.py") if "__pycache__" not in path.parts]
    return sorted(module_name(path, root) for path in paths
                  if not (path.name == "__init__.py" and holds_no_code(path)))


def _programs(tree: ast.AST) -> list[ast.AST]:
    """The Python programs written out as strings in ``tree`` (a test's subprocess script), parsed."""
    programs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                programs.append(ast.parse(node.value))
            except SyntaxError:  # prose, a shell command: not a program
                continue
    return programs


def imported(source: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source``'s import lines name (see the module's docstring)."""
    found = set()
    tree = ast.parse(source)
    nodes = [node for program in (tree, *_programs(tree)) for node in ast.walk(program)]
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # ``from a.b import function`` names module a.b
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def tested_in(root: Path = ROOT) -> dict[str, list[str]]:
    """For every module, the files under tests/ (relative to tests/, sorted) that import it."""
    known = set(modules(root))
    found: dict[str, list[str]] = {name: [] for name in sorted(known)}
    tests = root / "tests"
    for path in sorted(tests.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        for name in imported(path.read_text(encoding="utf-8"), known):
            found[name].append(path.relative_to(tests).as_posix())
    return found


def table(root: Path = ROOT) -> str:
    """The markdown table: one row per module, its test files, or why it has none (``why_untested``)."""
    rows = ["| module | test files that import it |", "| --- | --- |"]
    for name, files in tested_in(root).items():
        where = ", ".join(f"`{file}`" for file in files) or f"none: {why_untested(name, root) or 'NOT TESTED'}"
        rows.append(f"| `{name}` | {where} |")
    return "\n".join(rows) + "\n"


def section(root: Path = ROOT) -> str:
    return f"{HEADING}\n\n{INTRO}\n\n{table(root)}"


def with_section(document: str, new_section: str) -> str:
    """``document`` with its HEADING section (up to the next heading of its level or above, or the end) replaced
    by ``new_section``, or with it appended where there is none."""
    lines = document.splitlines(keepends=True)
    starts = [index for index, line in enumerate(lines) if line.rstrip("\n") == HEADING]
    if not starts:
        return document.rstrip("\n") + "\n\n" + new_section
    start = starts[0]
    end = next((index for index in range(start + 1, len(lines)) if lines[index].startswith(("# ", "## "))),
               len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + new_section + ("\n" + tail if tail else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the table in docs/development.md")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(table())
        return 0
    docs = ROOT / "docs" / "development.md"
    docs.write_text(with_section(docs.read_text(encoding="utf-8"), section()), encoding="utf-8")
    print(f"module_tests: wrote the table of {len(modules())} modules into {docs.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(reporting_user_errors("module_tests", main)())
