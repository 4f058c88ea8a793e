"""Which ``Target`` a loader builds: the model config's ``target`` node names the class (``_target_``, with
``_partial_: true``, since the loader builds it once the weights are in, with the loaded model as its first
argument) and its settings, if it takes any. Every ``conf/model/*.yaml`` names the transformers target::

    target:
      _target_: specbench.targets.transformers.TransformersTarget
      _partial_: true

so another backend (a compiled one, say) is one ``Target`` subclass and ``model.target._target_=its.Class``.

The node reaches a loader in three forms, all taken here: Hydra's instantiate has already made it a
``functools.partial`` of the class (``python -m specbench``, scripts); it is still a mapping (a config read with
PyYAML, as the test kit and the GPU check read tiny-random's, without Hydra); or it is None (a loader called from
Python), meaning the transformers target. Nothing here imports Hydra or, until a class is located, torch.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping

from specbench.errors import SpecbenchError

DEFAULT_TARGET = "specbench.targets.transformers.TransformersTarget"
# What run.regime=compiled builds in its place (never named by a model config: the regime is a run setting, shown in
# the method's name).
COMPILED_TARGET = "specbench.targets.compiled.CompiledTarget"
# The Target implementations specbench has, named in a refusal as the valid choices.
KNOWN_TARGETS = (DEFAULT_TARGET, "specbench.targets.reference.ReferenceTarget")
# The node every model config carries: what a run.json without model_config.target ran (see recorded_target).
DEFAULT_NODE = {"_target_": DEFAULT_TARGET, "_partial_": True}
# Keys Hydra's instantiate reads itself: not settings of the class.
_INSTANTIATE_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
_CHOICES = f"choose a Target class such as {' or '.join(KNOWN_TARGETS)} (docs/targets.md)"


def locate(path: str):
    """The object a dotted path names (``package.module.Name``), as Hydra's ``_target_`` resolves it, without
    Hydra: the longest importable module prefix, then attributes. An ImportError or AttributeError says what is
    missing."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only a missing prefix means "try a shorter one"; a module that exists but fails inside is reported.
            if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
                raise
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(f"no module named {parts[0]!r}")


def target_class(node) -> type:
    """The ``Target`` subclass a ``model.target`` node (a mapping) names, or a one-line SpecbenchError naming the
    bad value and the valid choices: no ``_target_``, not importable, not a class, not a ``Target``, or without
    ``_partial_: true``."""
    from specbench.decoding.target import Target

    if not isinstance(node, Mapping) or not isinstance(node.get("_target_"), str):
        raise SpecbenchError(f"model.target must name a Target class ({{_target_: {DEFAULT_TARGET}, _partial_: "
                             f"true}}), got {node!r}; {_CHOICES}")
    path = node["_target_"]
    try:
        found = locate(path)
    except (ImportError, AttributeError) as error:
        reason = " ".join(str(error).split())
        raise SpecbenchError(f"model.target._target_={path} cannot be imported ({type(error).__name__}: "
                             f"{reason}); {_CHOICES}") from None
    if not (inspect.isclass(found) and issubclass(found, Target)):
        raise SpecbenchError(f"model.target._target_={path} is not a Target (a subclass of "
                             f"specbench.decoding.target.Target); {_CHOICES}")
    if node.get("_partial_") is not True:
        raise SpecbenchError(f"model.target._partial_ must be true (the loader builds {found.__name__} with the "
                             f"loaded model), got {node.get('_partial_')!r}")
    return found


def target_settings(node: Mapping) -> dict:
    """The keyword arguments a ``model.target`` node gives its class (its keys but Hydra's own)."""
    return {key: value for key, value in node.items() if key not in _INSTANTIATE_KEYS}


def check_target(target=None) -> None:
    """Refuse, in one line, a ``model.target`` that no loader could build (``target_class``) or a setting its
    class does not take (naming the ones it does); None (the transformers target) passes. The loaders'
    ``check_arguments`` call it, so ``config.check_group_values`` refuses it before anything loads."""
    if target is None:
        return
    found = target_class(target)
    settings = set(target_settings(target))
    parameters = list(inspect.signature(found.__init__).parameters.values())[2:]  # self, the model
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return
    taken = {parameter.name for parameter in parameters
             if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    unknown = sorted(settings - taken)
    if unknown:
        raise SpecbenchError(f"unknown setting(s) {', '.join(f'model.target.{key}' for key in unknown)}; "
                             f"{found.__name__} takes {', '.join(sorted(taken)) or 'none'}")


def target_builder(target=None) -> Callable:
    """What builds the Target from the loaded model: the transformers target for None, the class a mapping node
    names with its settings (checked by ``check_target``), or the callable Hydra made of the node (a partial of
    the class). A loader asks for it before reading any weights, so that a wrong class is refused at once."""
    if target is None:
        from specbench.targets.transformers import TransformersTarget

        return TransformersTarget
    if isinstance(target, Mapping):
        check_target(target)
        return functools.partial(target_class(target), **target_settings(target))
    if callable(target):
        made_of = getattr(target, "func", target)  # Hydra's partial of the class, or a class given from Python
        if inspect.isclass(made_of) and not issubclass(made_of, _target_base()):
            raise SpecbenchError(f"model.target names {made_of.__module__}.{made_of.__qualname__}, which is not a "
                                 f"Target (a subclass of specbench.decoding.target.Target); {_CHOICES}")
        return target
    raise SpecbenchError(f"model.target must name a Target class ({{_target_: {DEFAULT_TARGET}, _partial_: true}}), "
                         f"got {target!r}; {_CHOICES}")


def _target_base() -> type:
    from specbench.decoding.target import Target

    return Target


def build_target(target, model):
    """The Target of the loaded ``model``, as ``target`` (a ``model.target`` node in any of its forms) says; a
    built object that is not a ``Target`` is refused in one line."""
    from specbench.decoding.target import Target

    built = target_builder(target)(model)
    if not isinstance(built, Target):
        raise SpecbenchError(f"model.target built a {type(built).__name__}, not a Target (a subclass of "
                             f"specbench.decoding.target.Target); {_CHOICES}")
    return built


def recorded_target(node) -> dict | None:
    """``model.target`` as run.json records it: None (not recorded) for the transformers target without settings,
    which every run directory written before the model config named its Target ran, so those still resume and
    compare equal; the node itself for any other."""
    return None if node is None or dict(node) == DEFAULT_NODE else dict(node)


def regime_target(node, regime: str, buckets, mode: str) -> dict:
    """What the loader is given besides the model config to build the target of ``regime`` (``run.regime``): nothing
    for eager (the model config's own ``model.target``); for compiled, the compiled target with its settings, which
    needs the model config's target to be the transformers one it compiles. A model config naming the compiled
    target itself is refused, since its results would then be shown as eager ones."""
    target = None if node is None else node.get("target")
    named = target.get("_target_") if isinstance(target, Mapping) else None
    if named == COMPILED_TARGET:
        raise SpecbenchError(f"model.target._target_={COMPILED_TARGET} is chosen by run.regime=compiled, which also "
                             "names the results (method@compiled); leave model.target as conf/model has it")
    if regime == "eager":
        return {}
    if recorded_target(target) is not None:
        raise SpecbenchError(f"run.regime=compiled compiles the transformers target, but model.target names "
                             f"{named or target!r}; choose one of the two")
    return {"target": {"_target_": COMPILED_TARGET, "_partial_": True, "buckets": list(buckets), "mode": mode}}
