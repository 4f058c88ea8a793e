"""Composing specbench's Hydra configuration outside ``python -m specbench`` (scripts, tests)."""

from __future__ import annotations

import atexit
import difflib
import functools
import inspect
import os
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.utils import _locate
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.long_context.prompt_length import check_prompt_bounds
from specbench.questions import check_selection
from specbench.errors import SpecbenchError
from specbench.settings import RunSettings, method_name

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
# Keys Hydra's instantiate reads itself rather than passing to the target.
INSTANTIATE_KEYS = frozenset({"_target_", "_recursive_", "_convert_", "_partial_", "_args_"})
# Arguments the runner passes to a group's target itself, beside the config's keys.
RUNNER_ARGUMENTS = {"model": ("device", "linear_backend"), "drafter": ()}


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The run configuration that ``python -m specbench <overrides>`` would use."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def group_options(group: str) -> list[str]:
    """Names of the configs in a config group (``drafter`` -> ["ar", "pld", ...])."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def check_group_keys(cfg: DictConfig) -> None:
    """Refuse, by name, keys of the ``model``, ``drafter`` and ``task`` nodes that nothing reads.

    Hydra accepts ``+task.limit=5`` or ``+drafter.foo=1`` without complaint; left alone, such a key is silently
    ignored (task) or fails later as a TypeError inside instantiate (model, drafter). A ``model`` or ``drafter``
    key is valid when its ``_target_`` takes a parameter of that name (a target with ``**kwargs`` takes any);
    a ``task`` key when some ``conf/task/*.yaml`` sets it. Meant to run before anything is loaded; the ``run``
    group is checked by ``RunSettings.from_config``. The values: ``check_group_values``; both: ``check_config``.
    """
    for group, runner_arguments in RUNNER_ARGUMENTS.items():
        node = cfg.get(group)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        try:
            target = _locate(node._target_)  # as instantiate finds it; hydra.utils.get_method also logs the failure
        except Exception as error:  # no such module or attribute
            reason = " ".join(str(error).split())
            raise SpecbenchError(f"{group}._target_={node._target_} cannot be used ({reason})") from None
        if not callable(target):
            raise SpecbenchError(f"{group}._target_={node._target_} is not callable")
        try:
            parameters = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature: nothing to check the keys against
            continue
        if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
            continue
        passed_by_runner = sorted(set(node) & set(runner_arguments))
        if passed_by_runner:  # the runner's value would win silently
            key = passed_by_runner[0]
            raise SpecbenchError(f"{group}.{key} is set by the run group; use run.{key}=... instead")
        valid = {parameter.name for parameter in parameters
                 if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
        _refuse_unknown(group, set(node) - INSTANTIATE_KEYS, valid - set(runner_arguments))
    task = cfg.get("task")
    if isinstance(task, DictConfig):
        _refuse_unknown("task", set(task), task_keys())


def check_config(cfg: DictConfig) -> RunSettings:
    """Every check a composed configuration gets before anything is loaded: its keys (``check_group_keys``),
    then its values (``check_group_values``); the run's settings, checked."""
    check_group_keys(cfg)
    return check_group_values(cfg)


def check_group_values(cfg: DictConfig) -> RunSettings | None:
    """Refuse, with one line naming key, value and valid range, values that would fail only once something is
    loaded or decoding: the ``run`` group against its schema (``RunSettings.check``); the model's arguments
    against its loader's own check, where the loader has one (``check_arguments``, e.g. tiny-random's shapes);
    the run's token counts against a context the model config states (``model.max_context``); the engine's
    settings, the drafter it runs and the run settings it honours, by the engine's own check (``choose_engine``);
    the task group's selection and prompt-length bounds. Drafter values are checked by the drafters themselves.
    Loads nothing. Returns the run settings (None for a configuration without a run group)."""
    settings = RunSettings.from_config(cfg.run) if isinstance(cfg.get("run"), DictConfig) else None
    model = cfg.get("model")
    if isinstance(model, DictConfig) and "_target_" in model:
        arguments = {key: value for key, value in OmegaConf.to_container(model, resolve=True).items()
                     if key not in INSTANTIATE_KEYS}
        check = getattr(_locate(model._target_), "check_arguments", None)
        if check is not None:
            check(**arguments)
        context = arguments.get("max_context")
        if settings is not None and isinstance(context, int) and not isinstance(context, bool):
            settings.check_context(context, f"model.max_context={context}")
    if isinstance(cfg.get("engine"), DictConfig) and isinstance(cfg.get("drafter"), DictConfig):
        choose_engine(cfg)
    task = cfg.get("task")
    if isinstance(task, DictConfig):
        tasks = task.get("tasks")
        if not isinstance(tasks, ListConfig) or not all(isinstance(name, str) for name in tasks):
            raise SpecbenchError(f"task.tasks must be a list of task names such as [qa, rag], got {tasks!r}")
        check_selection(list(tasks), task.get("limit_per_task"))
        check_prompt_bounds(task.get("min_prompt_tokens"), task.get("max_prompt_tokens"))
    return settings


def choose_engine(cfg: DictConfig):
    """The engine class the ``engine`` group's ``_target_`` names (a ``specbench.engines.base.Engine``) and its
    settings as that class checked them against the drafter and run groups (``Engine.check_config``), before
    anything loads: (class, ``EngineSettings``). A configuration composed without an engine group gets the default
    one (conf/config.yaml's). A target that is no engine, or a name that is not its engine's, is one line naming
    the engines there are."""
    node = cfg.get("engine")
    if not isinstance(node, DictConfig):
        node = OmegaConf.load(CONF_DIR / "engine" / f"{default_option('engine')}.yaml")
    values = OmegaConf.to_container(node, resolve=True)
    choices = "choose engine=" + " or engine=".join(group_options("engine"))
    target = values.get("_target_")
    try:
        engine = _locate(target) if isinstance(target, str) else None
    except Exception as error:  # no such module or attribute
        raise SpecbenchError(f"engine._target_={target} cannot be used ({' '.join(str(error).split())}); "
                             f"{choices}") from None
    # The class is recognised by what the runner calls on it: config.py stands below the engines it chooses.
    if not (isinstance(engine, type) and isinstance(getattr(engine, "name", None), str)
            and callable(getattr(engine, "check_config", None)) and callable(getattr(engine, "load", None))):
        raise SpecbenchError(f"engine._target_={target} is not an engine (a specbench.engines.base.Engine); {choices}")
    if values.get("name") != engine.name:
        raise SpecbenchError(f"engine.name={values.get('name')!r} is not the name of {target} (engine={engine.name}); "
                             f"{choices}")
    settings = {key: value for key, value in values.items() if key not in INSTANTIATE_KEYS}
    drafter, run = (OmegaConf.to_container(cfg[group], resolve=True) if isinstance(cfg.get(group), DictConfig) else {}
                    for group in ("drafter", "run"))
    return engine, engine.check_config(settings, drafter, run)


@functools.cache
def default_option(group: str) -> str:
    """The config of ``group`` that conf/config.yaml's defaults list picks (``engine`` -> "specbench")."""
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if isinstance(entry, DictConfig) and group in entry:
            return str(entry[group])
    raise KeyError(f"conf/config.yaml picks no default for the {group} group")


def option_values(group: str, name: str) -> dict:
    """The top-level values config ``conf/<group>/<name>.yaml`` composes to, read from the files without composing
    (a few milliseconds, where composing every drafter config takes seconds), interpolations left as written: its
    own over those its defaults list brings from other configs of its group, in the order Hydra applies them (the
    config itself at its ``_self_`` entry, at the end when it has none)."""
    node = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
    entries = [entry for entry in node.get("defaults", []) if isinstance(entry, str)]
    if "_self_" not in entries:
        entries.append("_self_")
    values = {}
    for entry in entries:
        if entry == "_self_":
            own = OmegaConf.to_container(node, resolve=False)
            values.update({key: value for key, value in own.items() if key != "defaults"})
        else:
            values.update(option_values(group, entry))
    return values


@functools.cache
def option_target(group: str, name: str) -> str | None:
    """The ``_target_`` config ``conf/<group>/<name>.yaml`` composes to (``option_values``); None when neither it nor
    a config its defaults list brings has one."""
    return option_values(group, name).get("_target_")


@functools.cache
def task_keys() -> frozenset[str]:
    """The keys the task configs (``conf/task/*.yaml``) set, ``defaults`` aside."""
    keys = set()
    for file in (CONF_DIR / "task").glob("*.yaml"):
        keys.update(OmegaConf.load(file).keys())
    return frozenset(keys - {"defaults"})


def _refuse_unknown(group: str, keys: set, valid: set) -> None:
    unknown = sorted(str(key) for key in keys - valid)
    if not unknown:
        return
    guesses = [guess for key in unknown for guess in _closest(key, sorted(valid))]
    hint = f" (did you mean {', '.join(f'{group}.{key}' for key in guesses)}?)" if guesses else ""
    raise SpecbenchError(f"unknown setting(s) {', '.join(f'{group}.{key}' for key in unknown)}; the {group} group "
                         f"has: {', '.join(sorted(valid))}{hint}")


def _closest(key: str, valid: list[str]) -> list[str]:
    """The valid key a misspelt or shortened ``key`` most likely meant, if any: limit -> limit_per_task."""
    return difflib.get_close_matches(key, valid, n=1) or [name for name in valid if name.startswith(key)][:1]


def register_resolvers() -> None:
    """Interpolations the configs use (registered once, on import):

    ``${method:${drafter.name},${run.draft_budget},${run.verify_padding},${engine.name},${run.regime}}``  the
        name results are shown under (``hd+budget``, ``pld@compiled``), for run and sweep directories;
    ``${initials:${drafter.order}}``  the initials of a list, joined: [context, model] -> "CM" (HD's ablation
        names its cells by the databases asked, in order).
    """
    if not OmegaConf.has_resolver("method"):
        OmegaConf.register_new_resolver("method", lambda name, budget="off", padding="off", engine="specbench",
                                        regime="eager": method_name(name, str(budget), str(padding), str(regime))
                                        + ("" if engine == "specbench" else f"@{engine}"))
    if not OmegaConf.has_resolver("initials"):
        OmegaConf.register_new_resolver("initials", lambda items: "".join(str(item)[:1].upper() for item in items))


register_resolvers()


def missing_directories(path: str | Path) -> list[Path]:
    """``path``, made absolute as Hydra makes a job's directory, and those of its parents that do not exist yet,
    deepest first: what ``mkdir(parents=True)`` would create."""
    path = Path(os.path.abspath(str(path)))
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


class NewRunDirectories(Callback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): a run refused before it starts leaves behind no
    directory that it created.

    Hydra creates a job's directory (``hydra.run.dir``, or a sweep cell under ``hydra.sweep.dir``) and any
    missing parents before specbench sees the configuration, so a refusal (a bad setting, an unloadable model)
    finds it there, empty. This notes which of those directories do not exist yet, before Hydra creates them,
    and when the process ends removes each one that is still empty, deepest first. At the process's end rather
    than the job's, since a refusal leaves the task by ``sys.exit``, which Hydra's ``on_job_end`` never sees.
    ``rmdir`` removes only an empty directory, so a run that wrote anything keeps its own; one that existed
    before is never a candidate. A sweep's own directory stays (Hydra writes multirun.yaml into it).
    """

    def __init__(self):
        self._new: set[Path] = set()
        self._sweep_dir: Path | None = None
        self._sweep_entries: frozenset[str] = frozenset()  # what the sweep directory held when the sweep began
        self._registered = False

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._note(missing_directories(config.hydra.run.dir))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        # A cell's directory is only known once its job's configuration is composed, after Hydra created it:
        # a cell is new when its first path part was not in the sweep directory when the sweep began.
        self._sweep_dir = Path(os.path.abspath(str(config.hydra.sweep.dir)))
        self._sweep_entries = frozenset(os.listdir(self._sweep_dir)) if self._sweep_dir.is_dir() else frozenset()

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        if self._sweep_dir is None:
            return
        try:
            parts = Path(config.hydra.runtime.output_dir).relative_to(self._sweep_dir).parts
        except ValueError:  # a launcher that puts cells elsewhere: nothing known, nothing removed
            return
        if parts and parts[0] not in self._sweep_entries:
            self._note([self._sweep_dir.joinpath(*parts[:depth]) for depth in range(len(parts), 0, -1)])

    def _note(self, directories: list[Path]) -> None:
        self._new.update(directories)
        if directories and not self._registered:
            atexit.register(self.remove_empty)
            self._registered = True

    def remove_empty(self) -> None:
        """Remove, deepest first, each noted directory that is (still) empty."""
        for directory in sorted(self._new, key=lambda path: len(path.parts), reverse=True):
            try:
                directory.rmdir()
            except OSError:  # not empty (the run wrote there), already gone, or not ours to remove
                pass
