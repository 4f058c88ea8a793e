"""scripts/module_tests.py and the table it makes, docs/development.md's "Where each module is tested": the table
in the docs is the script's output (it cannot drift), and every module is imported by a test file or says why not."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_tests():
    spec = importlib.util.spec_from_file_location("module_tests_under_test", ROOT / "scripts" / "module_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_in_the_docs_is_the_scripts_output():
    script = module_tests()
    document = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert script.HEADING in document.splitlines()
    assert script.with_section(document, script.section()) == document, (
        "docs/development.md's table is stale: run python scripts/module_tests.py --write")


def test_every_module_is_imported_by_a_test_file_or_says_why_not():
    script = module_tests()
    found = script.tested_in()
    untested = sorted(name for name, files in found.items() if not files and script.why_untested(name) is None)
    assert not untested, f"no test file imports {', '.join(untested)} (add a test, or a reason in module_tests.py)"
    assert all(reason.strip() for reason in script.UNTESTED_BY_IMPORT.values())
    stale = sorted(name for name in script.UNTESTED_BY_IMPORT if found.get(name, ["not a module"]))
    assert not stale, f"UNTESTED_BY_IMPORT lists {', '.join(stale)}, which tests import or which is no module"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_import_lines_are_resolved_to_the_modules_they_name(tmp_path):
    script = module_tests()
    write(tmp_path / "specbench" / "__init__.py", '"""no code: no row"""\n__version__ = "1"\n')
    write(tmp_path / "specbench" / "loop.py", "def run(): ...\n")
    write(tmp_path / "specbench" / "kit.py", "")
    write(tmp_path / "specbench" / "sub" / "__init__.py", "def value():\n    return 1\n")
    write(tmp_path / "specbench" / "sub" / "deep.py", "")
    write(tmp_path / "analysis" / "__init__.py", "")
    write(tmp_path / "analysis" / "alone.py", "")
    write(tmp_path / "tests" / "test_a.py", "from specbench import loop\nimport specbench.sub.deep as deep\n")
    write(tmp_path / "tests" / "test_b.py", "def test():\n    from specbench.sub import value\n")
    write(tmp_path / "tests" / "test_c.py",
          'PROGRAM = """\nfrom specbench.kit import thing\n"""\nPROSE = "import this and that, then run it"\n')
    assert script.modules(tmp_path) == ["analysis.alone", "specbench.kit", "specbench.loop", "specbench.sub",
                                        "specbench.sub.deep"]
    assert script.tested_in(tmp_path) == {"analysis.alone": [], "specbench.kit": ["test_c.py"],
                                          "specbench.loop": ["test_a.py"], "specbench.sub": ["test_b.py"],
                                          "specbench.sub.deep": ["test_a.py"]}
    table = script.table(tmp_path).splitlines()
    assert table[2] == "| `analysis.alone` | none: NOT TESTED |"
    assert table[3] == "| `specbench.kit` | `test_c.py` |"


def test_writing_the_section_replaces_it_alone_or_appends_it():
    script = module_tests()
    new = f"{script.HEADING}\n\nnew table\n"
    document = f"# Title\n\ntext\n\n{script.HEADING}\n\nold table\n\n## After\n\nkept\n"
    assert script.with_section(document, new) == f"# Title\n\ntext\n\n{new}\n## After\n\nkept\n"
    assert script.with_section("# Title\n\ntext\n", new) == f"# Title\n\ntext\n\n{new}"
    last = f"# Title\n\n{script.HEADING}\n\nold\n"
    assert script.with_section(last, new) == f"# Title\n\n{new}"


def test_the_script_prints_the_table():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "module_tests.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == module_tests().table()


def test_a_new_drafter_is_tested_through_its_config_without_a_reason_written(tmp_path):
    """A drafter module no test imports is tested by the contract tests through its conf/drafter/ config: the table
    says so without a hand-written reason (docs/development.md, "Adding a drafter"); any other module still needs
    a test or a reason."""
    script = module_tests()
    write(tmp_path / "specbench" / "__init__.py", "")
    write(tmp_path / "specbench" / "drafters" / "__init__.py", "def helper():\n    return 1\n")
    write(tmp_path / "specbench" / "drafters" / "brand_new.py", "class BrandNew: ...\n")
    write(tmp_path / "analysis" / "__init__.py", "")
    write(tmp_path / "conf" / "drafter" / "brand-new.yaml",
          "_target_: specbench.drafters.brand_new.BrandNew\nname: x\n")
    write(tmp_path / "conf" / "drafter" / "derived.yaml", "defaults:\n  - brand-new\n  - _self_\nname: derived\n")
    write(tmp_path / "tests" / "test_x.py", "")
    assert script.drafter_modules(tmp_path) == {"specbench.drafters.brand_new"}
    assert script.why_untested("specbench.drafters.brand_new", tmp_path) == script.DRAFTER
    assert script.why_untested("specbench.drafters", tmp_path) is None
    assert f"| `specbench.drafters.brand_new` | none: {script.DRAFTER} |" in script.table(tmp_path)
    assert "| `specbench.drafters` | none: NOT TESTED |" in script.table(tmp_path)
