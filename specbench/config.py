"""Composing specbench's Hydra configuration outside ``python -m specbench`` (scripts, tests)."""

from __future__ import annotations

import difflib
import functools
import inspect
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.utils import _locate
from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.settings import method_name

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
    group is checked by ``RunSettings.from_config``.
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
