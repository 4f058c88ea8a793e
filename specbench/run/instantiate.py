"""Building the objects a config group names (``_target_``) with Hydra."""

from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from specbench.errors import SpecbenchError


def build(node: DictConfig, **kwargs):
    """``hydra.utils.instantiate``, letting a user-facing error from the constructor through unwrapped."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        while cause is not None and not isinstance(cause, SpecbenchError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise
