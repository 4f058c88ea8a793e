"""scripts/structure.py measures what issue 31's redesign is judged by; the package keeps the figures it reached."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def structure():
    spec = importlib.util.spec_from_file_location("structure_script", ROOT / "scripts" / "structure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_its_upward_imports_and_the_layers_are_counted(tmp_path):
    root = write(tmp_path, {
        "specbench/__init__.py": "",
        "specbench/base.py": "import os\n",
        "specbench/store/__init__.py": "",
        "specbench/store/files.py": "from specbench import base\n",
        "specbench/store/locks.py": "from . import files\n",
        "specbench/top.py": "def run(cfg):\n    from specbench.store.locks import x\n    from specbench import loop\n",
        "specbench/loop.py": "from specbench.top import run\n",
    })
    figures = structure().measure(root)
    assert figures["modules"] == 5 and figures["packages"] == 2 and figures["modules_at_package_root"] == 3
    assert figures["import_cycles"] == [["specbench.loop", "specbench.top"]]
    assert figures["imports_upward"] == ["specbench.loop -> specbench.top", "specbench.top -> specbench.loop"]
    assert figures["import_layers"] == 4  # base <- files <- locks <- {top, loop}
    assert figures["functions_taking_cfg"] == 1 and figures["modules_taking_cfg"] == {"specbench.top": ["run"]}


def test_two_folders_leaning_on_each_other_are_a_folder_cycle_without_a_module_cycle(tmp_path):
    root = write(tmp_path, {
        "specbench/__init__.py": "",
        "specbench/answers.py": "from specbench.stores.lookup import table\n",
        "specbench/stores/__init__.py": "",
        "specbench/stores/lookup.py": "table = 1\n",
        "specbench/stores/build.py": "from specbench import answers\n",
    })
    figures = structure().measure(root)
    assert figures["import_cycles"] == []
    assert figures["folder_cycles"] == [["specbench.answers", "specbench.stores"]]


def test_a_root_without_the_package_is_one_line_and_exit_2(tmp_path):
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "structure.py"), "--root", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"structure: error: {tmp_path} holds no specbench/ package; pass --root a checkout of specbench")
