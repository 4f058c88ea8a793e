"""Every config composes, every target resolves, and every knob is documented."""

import re
from pathlib import Path

import pytest
from hydra.utils import get_method, instantiate
from omegaconf import OmegaConf

from specbench.config import compose, group_options
from specbench.decoding.contract import Drafter

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
    from specbench.questions import LONGBENCH_TASKS, MULTILINGUAL_TASKS, TASKS

    groups = {"spec_bench": list(TASKS), "multilingual": list(MULTILINGUAL_TASKS),  # the three whole benchmarks
              "longbench": list(LONGBENCH_TASKS)}
    for task in group_options("task"):
        cfg = compose([f"task={task}"]).task
        assert cfg.name == task
        assert list(cfg.tasks) == groups.get(task, [task])


def undocumented_keys(node, prefix, text):
    """Keys (dotted) that docs/configuration.md does not name; a documented key covers what is under it."""
    for key, value in node.items():
        if key in ("_target_", "defaults"):
            continue
        name = f"{prefix}.{key}"
        if re.search(rf"`{re.escape(name)}`", text):
            continue
        if isinstance(value, dict):
            yield from undocumented_keys(value, name, text)
        else:
            yield name


def test_every_config_knob_is_documented():
    text = DOCS.read_text()
    missing = set()
    for group in GROUPS:
        for option in group_options(group):
            node = OmegaConf.to_container(compose([f"{group}={option}"])[group], resolve=False)
            missing.update(undocumented_keys(node, group, text))
    assert not missing, f"undocumented in docs/configuration.md: {sorted(missing)}"


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes_a_resumable_sweep(experiment):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from specbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    assert experiment in cfg.hydra.sweep.dir and "${now" not in str(cfg.hydra.sweep.dir)
    assert cfg.hydra.sweeper.params


def test_the_run_schema_and_the_run_config_have_the_same_keys():
    """conf/run/default.yaml and specbench.settings.RunSettings must not drift apart."""
    import dataclasses

    from specbench.settings import RunSettings

    node = OmegaConf.to_container(compose([]).run, resolve=True)
    assert set(node) == {field.name for field in dataclasses.fields(RunSettings)}
    assert RunSettings.from_config(node) == RunSettings()


def test_unknown_run_keys_are_named():
    from specbench.errors import SpecbenchError
    from specbench.settings import RunSettings

    with pytest.raises(SpecbenchError, match="unknown setting.*run.max_new_token;"):
        RunSettings.from_config({"max_new_token": 5})


def test_missing_directories_are_the_ones_mkdir_would_create(tmp_path):
    from specbench.config import missing_directories

    assert missing_directories(tmp_path / "a" / "b") == [tmp_path / "a" / "b", tmp_path / "a"]
    assert missing_directories(tmp_path) == []


def test_the_new_directories_callback_removes_only_new_empty_ones(tmp_path, monkeypatch):
    """A run noted before Hydra's mkdir; at the process's end its new directories go while empty, deepest first,
    and one that existed before or holds a file stays."""
    from specbench.config import NewRunDirectories

    registered = []
    monkeypatch.setattr("specbench.config.atexit.register", registered.append)
    (tmp_path / "old").mkdir()
    callback = NewRunDirectories()
    callback.on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "old" / "new" / "run")}}}))
    (tmp_path / "old" / "new" / "run").mkdir(parents=True)
    assert registered == [callback.remove_empty]
    callback.remove_empty()
    assert [path.name for path in tmp_path.iterdir()] == ["old"] and list((tmp_path / "old").iterdir()) == []

    kept = NewRunDirectories()
    kept.on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "wrote" / "run")}}}))
    (tmp_path / "wrote" / "run").mkdir(parents=True)
    (tmp_path / "wrote" / "run" / "run.json").write_text("{}")
    kept.remove_empty()
    assert (tmp_path / "wrote" / "run" / "run.json").is_file()


def test_a_sweep_cell_that_was_there_is_not_noted(tmp_path, monkeypatch):
    from specbench.config import NewRunDirectories

    monkeypatch.setattr("specbench.config.atexit.register", lambda function: None)
    sweep = tmp_path / "sweep"
    (sweep / "old_cell").mkdir(parents=True)
    callback = NewRunDirectories()
    callback.on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    for cell in ("old_cell", "new_cell"):
        (sweep / cell).mkdir(exist_ok=True)
        callback.on_job_start(OmegaConf.create({"hydra": {"runtime": {"output_dir": str(sweep / cell)}}}))
    callback.remove_empty()
    assert sorted(path.name for path in sweep.iterdir()) == ["old_cell"]
