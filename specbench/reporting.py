"""The one line a user sees for an error they caused, and the wrapper every entry point and script runs its main in.

Above ``errors``, ``storage.refusal`` and ``torchrun_errors`` (all standard library only, like this module): a refused write is
recognised wherever a library raised it, so the refusal module is needed here, and it builds its lines as
``SpecbenchError``s itself."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from specbench.errors import USER_ERROR, SpecbenchError, config_error_line
from specbench.storage.refusal import refusal_in_chain
from specbench.torchrun_errors import say_user_error


def user_error_line(error: BaseException) -> str | None:
    """The one line for ``error`` if the user's input or environment caused it: a SpecbenchError, a config the
    composer refused, a write the filesystem refused wherever it was raised (a full disk inside torch's, numpy's
    or pyarrow's save; a cache path through a file), naming the path where the error does; None for a bug, which
    keeps its traceback."""
    if isinstance(error, SpecbenchError):
        return str(error)
    line = config_error_line(error)
    if line is not None:
        return line
    refusal = refusal_in_chain(error)
    return None if refusal is None else str(refusal)


def reporting_user_errors(program: str, main: Callable) -> Callable:
    """``main`` that ends with ``program: error: <one line>`` on stderr and exit status USER_ERROR for every error
    ``user_error_line`` recognises, and lets any other exception (a bug, an interrupt) through. Every entry point
    and script wraps its main in it (tests/test_errors.py lists them)::

        sys.exit(interrupts.run(reporting_user_errors("build_datastore", main)))
    """

    @functools.wraps(main)
    def reporting(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as error:
            from specbench.interrupts import follows_interrupt

            line = None if follows_interrupt(error) else user_error_line(error)
            if line is None:
                raise
            say_user_error(line, program)  # under torchrun (gpu_check's tensor-parallel row): once, by rank 0
            sys.exit(USER_ERROR)

    return reporting
