"""Errors that reach the user as one line, without a traceback."""

from __future__ import annotations

import sys

USER_ERROR = 2  # the exit status of every error a user can cause, from every entry point and script


class SpecbenchError(Exception):
    """A problem with the user's input or environment, explained in the message.

    The entry point prints the message alone and exits with status 2; anything else that escapes is a bug and
    keeps its traceback.
    """


def damage_reason(error: BaseException) -> str:
    """What a reading library said about a damaged file, fit for the middle of one line: the first line of its
    message (numpy, pyarrow and safetensors write several), else the exception's name. Readers of the files
    specbench wrote catch any Exception from the library, since each raises its own kinds for a cut, foreign or
    garbled file (zipfile.BadZipFile, EOFError, zlib.error, RecursionError for deep JSON, ...)."""
    text = getattr(error, "strerror", None) if isinstance(error, OSError) else None
    first = (text or str(error)).strip().splitlines()
    return first[0] if first else type(error).__name__


# ---- one line for every error a user can cause, in every entry point ---------------------------------------------


def config_error_line(error: BaseException) -> str | None:
    """The one line of a config the composer refused (a group option or config file it cannot find, a key not in
    the config, an override it cannot parse), with the valid choices where Hydra lists them; None for any other
    error. Hydra and OmegaConf are looked up only if already imported (analysis never imports them)."""
    hydra_errors, omegaconf_errors = sys.modules.get("hydra.errors"), sys.modules.get("omegaconf.errors")
    if hydra_errors is not None and isinstance(error, hydra_errors.MissingConfigException):
        missing = error.missing_cfg_file
        if error.options and missing and "/" in missing:
            group, name = missing.rsplit("/", 1)
            return f"{group}={name}: no such config in conf/{group}/; choose one of {', '.join(error.options)}"
    kinds = tuple(module.__dict__[name] for module, name in ((hydra_errors, "HydraException"),
                                                            (omegaconf_errors, "OmegaConfBaseException"))
                  if module is not None)
    if not kinds or not isinstance(error, kinds):
        return None
    text = str(error).split("Config search path:")[0]
    cause = error.__cause__
    if omegaconf_errors is not None and isinstance(cause, omegaconf_errors.OmegaConfBaseException) \
            and str(cause) not in text:
        text += f" ({cause})"
    return " ".join(text.split())
