"""Composing specbench's Hydra configuration outside ``python -m specbench`` (scripts, tests)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The run configuration that ``python -m specbench <overrides>`` would use."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def group_options(group: str) -> list[str]:
    """Names of the configs in a config group (``drafter`` -> ["ar", "pld", ...])."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))
