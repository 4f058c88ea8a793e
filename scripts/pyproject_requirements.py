"""Print pyproject.toml's dependencies and its test extra, one a line: what the environments that scripts/vllm_env.sh
and scripts/latest_env.sh build must hold besides their own packages. Standard library only (Python 3.10 reads
TOML through pip's vendored parser), since it runs before anything is installed."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specbench.reporting import reporting_user_errors  # noqa: E402  # standard library only


def requirements(pyproject: Path) -> list[str]:
    """The ``dependencies`` of ``pyproject`` and its ``test`` extra, as written there."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return project["dependencies"] + project["optional-dependencies"]["test"]


def main() -> int:
    print("\n".join(requirements(REPO / "pyproject.toml")))
    return 0


if __name__ == "__main__":
    sys.exit(reporting_user_errors("pyproject_requirements", main)())
