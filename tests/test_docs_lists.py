"""The pages that say they list every config, and the code map, list everything there is: a new drafter, model,
launcher, experiment or module that the docs do not name fails here, naming what is missing and where."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def config_names(group: str) -> list[str]:
    return sorted(path.stem for path in (ROOT / "conf" / group).glob("*.yaml"))


def page(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("group, where", [
    ("drafter", "docs/methods.md"),   # "Every config in conf/drafter/ is listed here"
    ("drafter", "README.md"),         # the method table, one line each
    ("model", "docs/usage.md"),       # "Models (conf/model/)"
    ("experiment", "docs/usage.md"),  # the sweeps
    ("hydra/launcher", "docs/clusters.md"),  # "Launchers (conf/hydra/launcher/)"
])
def test_every_config_of_a_group_is_named_on_its_page(group, where):
    text = page(where)
    missing = [name for name in config_names(group) if f"`{name}`" not in text and f"experiment={name}" not in text]
    assert config_names(group), f"conf/{group} holds no configs"
    assert not missing, f"{where} does not name these conf/{group} configs: {', '.join(missing)}"


def code_map() -> str:
    text = page("docs/development.md")
    return text[text.index("```") + 3: text.index("```", text.index("```") + 3)]


def drafter_modules(root: Path) -> set[str]:
    """The modules (``specbench/drafters/pld.py``) that conf/drafter/'s configs name as ``_target_``: the drafters,
    which docs/methods.md lists (by config) and the code map names as one folder."""
    targets = set()
    for path in (root / "conf" / "drafter").glob("*.yaml"):
        found = re.search(r"^_target_:\s*([\w.]+)", path.read_text(encoding="utf-8"), re.MULTILINE)
        if found:
            targets.add(found.group(1).rpartition(".")[0].replace(".", "/") + ".py")
    return targets


def unnamed_modules(root: Path, shown: str) -> list[str]:
    """The modules and packages of specbench/ and analysis/ under ``root`` that the code map ``shown`` does not
    name, but the drafters (a new drafter is named by its config on docs/methods.md's list, not here)."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", shown))
    drafters = drafter_modules(root)
    missing = []
    for package in ("specbench", "analysis"):
        for path in sorted((root / package).iterdir()):
            if path.name.startswith(("_", ".")) or path.name == "data":
                continue
            if path.is_dir() and (path / "__init__.py").exists():
                if f"{path.name}/" not in shown:
                    missing.append(f"{package}/{path.name}/")
                missing += [f"{package}/{path.name}/{module.name}" for module in sorted(path.glob("*.py"))
                            if module.stem != "__init__" and module.stem not in words
                            and f"{package}/{path.name}/{module.name}" not in drafters]
            elif path.suffix == ".py" and path.name not in shown and path.stem not in words:
                missing.append(f"{package}/{path.name}")
    return missing


def test_the_code_map_names_every_module_and_package():
    missing = unnamed_modules(ROOT, code_map())
    assert not missing, f"docs/development.md's code map does not name: {', '.join(missing)}"


def test_a_new_drafter_needs_no_line_of_the_code_map(tmp_path):
    """docs/development.md's "Adding a drafter": the drafter's module and its yaml, its keys in configuration.md and
    its line in docs/methods.md and the README, nothing else by hand. The code map names drafters as a folder; a
    helper module of that folder must still be named."""
    (tmp_path / "specbench" / "drafters").mkdir(parents=True)
    (tmp_path / "analysis").mkdir()
    for name in ("__init__.py", "brand_new.py", "helper.py"):
        (tmp_path / "specbench" / "drafters" / name).write_text("")
    (tmp_path / "conf" / "drafter").mkdir(parents=True)
    (tmp_path / "conf" / "drafter" / "brand-new.yaml").write_text("_target_: specbench.drafters.brand_new.BrandNew\n")
    assert unnamed_modules(tmp_path, code_map()) == ["specbench/drafters/helper.py"]
    (tmp_path / "conf" / "drafter" / "brand-new.yaml").unlink()  # no config names it: a module like any other
    assert unnamed_modules(tmp_path, code_map()) == ["specbench/drafters/brand_new.py", "specbench/drafters/helper.py"]


def test_the_lists_test_fails_for_a_config_the_docs_do_not_name(tmp_path, monkeypatch):
    # The check itself: a drafter config that no page names is reported by name.
    fake_root = tmp_path
    (fake_root / "conf" / "drafter").mkdir(parents=True)
    (fake_root / "conf" / "drafter" / "brand-new.yaml").write_text("name: brand-new\n")
    (fake_root / "docs").mkdir()
    (fake_root / "docs" / "methods.md").write_text("- `pld`: prompt lookup\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake_root)
    with pytest.raises(AssertionError, match="do(es)? not name these conf/drafter configs: brand-new"):
        test_every_config_of_a_group_is_named_on_its_page("drafter", "docs/methods.md")
