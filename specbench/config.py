"""Composing specbench's Hydra configuration outside ``python -m specbench`` (scripts, tests)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from specbench.settings import method_name

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The run configuration that ``python -m specbench <overrides>`` would use."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def group_options(group: str) -> list[str]:
    """Names of the configs in a config group (``drafter`` -> ["ar", "pld", ...])."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def register_resolvers() -> None:
    """Interpolations the configs use (registered once, on import):

    ``${method:${drafter.name},${run.draft_budget},${run.verify_padding}}``  the name results are shown under
        (``hd+budget``), for run and sweep directories;
    ``${initials:${drafter.order}}``  the initials of a list, joined: [context, model] -> "CM" (HD's ablation
        names its cells by the databases asked, in order).
    """
    if not OmegaConf.has_resolver("method"):
        OmegaConf.register_new_resolver("method", lambda name, budget="off", padding="off":
                                        method_name(name, str(budget), str(padding)))
    if not OmegaConf.has_resolver("initials"):
        OmegaConf.register_new_resolver("initials", lambda items: "".join(str(item)[:1].upper() for item in items))


register_resolvers()
