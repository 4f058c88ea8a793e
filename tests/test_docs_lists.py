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


def test_the_code_map_names_every_module_and_package():
    shown = code_map()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", shown))
    missing = []
    for package in ("specbench", "analysis"):
        for path in sorted((ROOT / package).iterdir()):
            if path.name.startswith(("_", ".")) or path.name == "data":
                continue
            if path.is_dir() and (path / "__init__.py").exists():
                if f"{path.name}/" not in shown:
                    missing.append(f"{package}/{path.name}/")
                missing += [f"{package}/{path.name}/{module.name}" for module in sorted(path.glob("*.py"))
                            if module.stem != "__init__" and module.stem not in words]
            elif path.suffix == ".py" and path.name not in shown and path.stem not in words:
                missing.append(f"{package}/{path.name}")
    assert not missing, f"docs/development.md's code map does not name: {', '.join(missing)}"


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
