"""``python -m specbench [overrides]``: run one benchmark configuration (or a sweep with ``-m``).

Exit status: 0 done, 2 a user error (a bad setting, file or directory, or a filesystem that refused a write: one
line on stderr, from specbench or from Hydra's own config checks), 130 interrupted (one line, from the first import
on), 1 a bug (with its traceback).
"""

from __future__ import annotations

import errno
import os
import sys

from specbench.interrupts import INTERRUPTED, Interrupts, follows_interrupt  # standard library only: imports fast

USER_ERROR = 2

_interrupts = Interrupts()
if __name__ == "__main__":
    _interrupts.arm()  # before the imports below, which take a second or more

import logging  # noqa: E402  (after the interrupt handler, on purpose)
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from specbench.config import register_resolvers  # noqa: E402
from specbench.errors import SpecbenchError, config_error_line
from specbench.reporting import user_error_line  # noqa: E402
from specbench.storage.atomic import write_atomically  # noqa: E402
from specbench.storage.refusal import os_error_of, raise_refusal, refusal_of, storage_refusal  # noqa: E402
from specbench.torchrun_errors import record_failure, say_user_error  # noqa: E402

register_resolvers()  # the configs interpolate ${method:...} and ${initials:...}

log = logging.getLogger("specbench")
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
_task_started = False  # an error before the task starts is Hydra's: a config or run-directory problem


def record_hydra_config(cfg: DictConfig, run_path: Path) -> None:
    """Once the run directory passed every check and is locked: keep the composed config and the command-line
    overrides in it (.hydra/, as Hydra would; it is told not to, so that a refused run leaves the directory
    untouched) and log to its specbench.log from here on. A filesystem that refuses these writes is one line;
    each file is whole or absent, since analysis labels runs by their overrides.yaml."""
    hydra_dir = run_path / ".hydra"
    try:
        hydra_dir.mkdir(exist_ok=True)
        _save_whole(cfg, hydra_dir / "config.yaml")
        _save_whole(OmegaConf.create(list(HydraConfig.get().overrides.task)), hydra_dir / "overrides.yaml")
        handler = logging.FileHandler(run_path / "specbench.log", encoding="utf-8")
    except OSError as error:
        raise_refusal(error)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    _run_log_handlers.append(handler)


def _save_whole(node, path: Path) -> None:
    """``OmegaConf.save`` written atomically (``storage.atomic``); a refused write is the one line naming ``path``."""
    write_atomically(path, lambda partial: OmegaConf.save(node, partial))


_run_log_handlers: list[logging.Handler] = []  # closed when the job ends (a sweep runs jobs in one process)


def _print_refusal(error: BaseException) -> bool:
    """Print the one line of a write the filesystem refused and return True; False for anything else."""
    os_error = os_error_of(error)
    where = os_error.filename if os_error is not None and os_error.filename else "a file the error does not name"
    refusal = refusal_of(error, where)
    if refusal is None:
        return False
    say_user_error(str(refusal))
    return True


def _report_interrupt(output_dir: str, opened: list) -> None:
    _interrupts.report(f"\nspecbench: interrupted; finished questions are saved in {output_dir}; run the same "
                       "command again to resume" if opened else "specbench: interrupted before the run started")
    sys.exit(INTERRUPTED)  # through Hydra's job to cli, which ends the process


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    global _task_started
    # torch and transformers first: an interrupt while they import ends the process at once, as nothing needs
    # cleaning up yet, instead of waiting for the import to be done (see Interrupts.unwind).
    try:
        from specbench.runner import run_benchmark
    except Exception as error:  # a broken install: its traceback in torchrun's summary too
        record_failure(error)
        raise

    _task_started = True
    _interrupts.task_started()
    output_dir = HydraConfig.get().runtime.output_dir
    opened = []  # the run directory, once it passed its checks: from then on answers are saved as they finish

    def on_open(path: Path) -> None:
        record_hydra_config(cfg, path)
        opened.append(path)

    try:
        summary = run_benchmark(cfg, output_dir, on_open=on_open)
    except SpecbenchError as error:
        say_user_error(str(error))  # under torchrun: said once, and one line in torchrun's summary
        sys.exit(USER_ERROR)
    except KeyboardInterrupt:
        _report_interrupt(output_dir, opened)
    except Exception as error:  # the last resort: a write refused where no code expected it is still one line
        if follows_interrupt(error):  # cleanup that the interrupt cut short failed in turn: still the interrupt
            _report_interrupt(output_dir, opened)
        if not _print_refusal(error):
            line = user_error_line(error)  # a refusal a library reports in its own exception, raised while handling
            if line is None:
                record_failure(error)  # a bug: its traceback in torchrun's summary too
                raise
            say_user_error(line)
        sys.exit(USER_ERROR)
    finally:
        while _run_log_handlers:
            handler = _run_log_handlers.pop()
            logging.getLogger().removeHandler(handler)
            handler.close()
    print_summary(summary, output_dir)


def print_summary(summary: dict, output_dir: str) -> None:
    """The run's summary table, and a loud paragraph for any losslessness violation, on the console: by rank 0
    alone under torchrun, since the other processes decoded beside it into a scratch folder whose numbers are not
    the run's (and would be shown under its directory)."""
    from specbench.models.placement import rank
    from specbench.results.console import format_summary_table, violation_report
    from specbench.results.readers import read_answers

    if rank() != 0:
        return
    print(f"\n{summary['model']} / {summary.get('method', summary['drafter'])}  ({output_dir})")
    print(format_summary_table(summary))
    report = violation_report(summary, read_answers(output_dir))
    if report:
        print(f"\n{report}", file=sys.stderr)


def cli() -> None:
    """``main`` with one exit status per outcome: USER_ERROR for every user error, INTERRUPTED for Ctrl-C at any
    moment (see ``Interrupts``). Hydra's own errors (an unknown group option, a key not in the config, a bad
    override, a run directory that cannot be created) are raised to here instead of printed by Hydra (which exits
    1, like a bug), and reported like specbench's. HYDRA_FULL_ERROR=1 set by the user keeps Hydra's full
    tracebacks."""
    try:
        _run_main()
    except KeyboardInterrupt:
        _interrupts.report(_interrupts.message)
    except SystemExit:
        if not _interrupts.reported:
            raise
    finally:
        _interrupts.shutting_down()
    if _interrupts.reported:
        _interrupts.leave()


def _run_main() -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors instead of printing them
    try:
        main()
    except (HydraException, OmegaConfBaseException) as error:
        if _task_started:
            raise
        say_user_error(config_error_line(error))  # one line, the choices in it
        sys.exit(USER_ERROR)
    except OSError as error:
        if _task_started:
            if not _print_refusal(error):
                raise
            sys.exit(USER_ERROR)
        # A run directory under a file (or a file where it should be) is the run directory's problem, said as such.
        refusal = None if error.errno in (errno.ENOTDIR, errno.EEXIST) else storage_refusal(error, what="create")
        if refusal is not None:
            say_user_error(str(refusal))
        else:
            say_user_error(f"cannot create the run directory: {error.strerror}: {error.filename}; choose a writable "
                           "hydra.run.dir (or hydra.sweep.dir)")
        sys.exit(USER_ERROR)


if __name__ == "__main__":
    cli()
