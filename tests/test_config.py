"""Every config composes, every target resolves, and every knob is documented."""

import re
from pathlib import Path

import pytest
from hydra.utils import get_method, instantiate
from omegaconf import OmegaConf

from specbench.config import compose, group_options
from specbench.drafters.base import Drafter

GROUPS = ("model", "drafter", "task", "run")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_and_its_target_resolves(group):
    options = group_options(group)
    assert options
    for option in options:
        cfg = compose([f"{group}={option}"])
        node = cfg[group]
        if "_target_" in node:
            assert callable(get_method(node._target_))


@pytest.mark.parametrize("name", group_options("drafter"))
def test_every_drafter_instantiates_with_its_name(name):
    drafter = instantiate(compose([f"drafter={name}"]).drafter)
    assert isinstance(drafter, Drafter) and drafter.name == name


def test_task_configs_select_one_task_each():
    for task in group_options("task"):
        cfg = compose([f"task={task}"]).task
        assert cfg.name == task
        assert list(cfg.tasks) == ([cfg.name] if task != "spec_bench" else list(cfg.tasks))


def leaf_keys(node, prefix=""):
    for key, value in node.items():
        if key == "_target_":
            continue
        if isinstance(value, dict):
            yield from leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_every_config_knob_is_documented():
    text = DOCS.read_text()
    missing = set()
    for group in GROUPS:
        for option in group_options(group):
            node = OmegaConf.to_container(compose([f"{group}={option}"])[group], resolve=False)
            for key in leaf_keys(node):
                if not re.search(rf"`{group}\.{re.escape(key)}`", text):
                    missing.add(f"{group}.{key}")
    assert not missing, f"undocumented in docs/configuration.md: {sorted(missing)}"
