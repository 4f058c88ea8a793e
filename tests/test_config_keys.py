"""Unknown keys in the model, drafter and task groups (config.check_group_keys): refused in one line with the
group's valid keys and a suggestion; no config option, nor any combination of them, has a key its group refuses
(moved from test_errors.py)."""

import itertools

import pytest
from conftest import one_line
from omegaconf import OmegaConf

from specbench.config import check_group_keys, compose, group_options
from specbench.errors import SpecbenchError


def check_compositions(overrides) -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from specbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for override in overrides:
            check_group_keys(hydra_compose(config_name="config", overrides=override))


def test_no_config_option_has_a_key_its_group_refuses():
    """Each model, drafter and task config, composed with the defaults of the others, and each experiment, passes
    check_group_keys (a group node's keys come from its own option only; the full product is tested as slow)."""
    overrides = [[f"{group}={option}"] for group in ("model", "drafter", "task") for option in group_options(group)]
    overrides += [[f"experiment={experiment}"] for experiment in group_options("experiment")]
    check_compositions(overrides)


@pytest.mark.slow
def test_no_combination_of_configs_has_a_key_its_group_refuses():
    """Every combination of model, drafter and task configs passes check_group_keys (735 compositions, a minute or two)."""
    combinations = itertools.product(group_options("model"), group_options("drafter"), group_options("task"))
    check_compositions([[f"model={m}", f"drafter={d}", f"task={t}"] for m, d, t in combinations])


def test_an_unknown_task_key_is_refused_with_the_valid_ones():
    with pytest.raises(SpecbenchError) as error:
        check_group_keys(compose(["+task.limit=5"]))
    assert one_line(error) == ("unknown setting(s) task.limit; the task group has: limit_per_task, max_prompt_tokens, "
                               "min_prompt_tokens, name, path, tasks (did you mean task.limit_per_task?)")


@pytest.mark.parametrize("model", group_options("model"))
def test_an_unknown_model_key_is_refused(model):
    with pytest.raises(SpecbenchError, match=r"^unknown setting\(s\) model\.foo; the model group has: .*\bname\b"):
        check_group_keys(compose([f"model={model}", "+model.foo=1"]))


@pytest.mark.parametrize("drafter", group_options("drafter"))
def test_an_unknown_drafter_key_is_refused(drafter):
    with pytest.raises(SpecbenchError, match=r"^unknown setting\(s\) drafter\.foo; the drafter group has: .*\bname\b"):
        check_group_keys(compose([f"drafter={drafter}", "+drafter.foo=1"]))


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(SpecbenchError, match=r"\(did you mean drafter\.num_draft_tokens\?\)$"):
        check_group_keys(compose(["drafter=pld", "+drafter.num_draft_token=5"]))


def test_the_arguments_the_runner_passes_point_to_the_run_group():
    """The runner passes run.device and run.linear_backend to the loader: a model.device would be ignored."""
    for key, value in (("device", "cpu"), ("linear_backend", "aten")):
        with pytest.raises(SpecbenchError, match=rf"^model\.{key} is set by the run group; use run\.{key}=\.\.\. instead$"):
            check_group_keys(compose(["model=tiny-random", f"+model.{key}={value}"]))


def test_a_target_that_does_not_exist_is_refused():
    with pytest.raises(SpecbenchError, match=r"^drafter\._target_=specbench\.drafters\.nope\.Nope cannot be used"):
        check_group_keys(compose(["drafter._target_=specbench.drafters.nope.Nope"]))


def test_a_target_with_kwargs_takes_any_key():
    cfg = compose(["+drafter.anything=1"])
    OmegaConf.update(cfg, "drafter._target_", "logging.basicConfig")  # basicConfig(**kwargs)
    check_group_keys(cfg)
