"""``python -m specbench [overrides]``: run one benchmark configuration (or a sweep with ``-m``).

Exit status: 0 done, 2 a user error (a bad setting, file or directory: one line on stderr, from specbench or
from Hydra's own config checks), 130 interrupted, 1 a bug (with its traceback).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from specbench.config import register_resolvers
from specbench.errors import SpecbenchError

register_resolvers()  # the configs interpolate ${method:...} and ${initials:...}

log = logging.getLogger("specbench")
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
USER_ERROR = 2
_task_started = False  # an error before the task starts is Hydra's: a config or run-directory problem


def record_hydra_config(cfg: DictConfig, run_path: Path) -> None:
    """Once the run directory passed every check and is locked: keep the composed config and the command-line
    overrides in it (.hydra/, as Hydra would; it is told not to, so that a refused run leaves the directory
    untouched) and log to its specbench.log from here on."""
    hydra_dir = run_path / ".hydra"
    hydra_dir.mkdir(exist_ok=True)
    OmegaConf.save(cfg, hydra_dir / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(HydraConfig.get().overrides.task)), hydra_dir / "overrides.yaml")
    handler = logging.FileHandler(run_path / "specbench.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    _run_log_handlers.append(handler)


_run_log_handlers: list[logging.Handler] = []  # closed when the job ends (a sweep runs jobs in one process)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    global _task_started
    _task_started = True
    from specbench.records import format_summary_table, read_answers, violation_report
    from specbench.runner import run_benchmark

    output_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run_benchmark(cfg, output_dir, on_open=lambda path: record_hydra_config(cfg, path))
    except SpecbenchError as error:
        print(f"specbench: error: {error}", file=sys.stderr)
        sys.exit(USER_ERROR)
    except KeyboardInterrupt:
        print(f"\nspecbench: interrupted; finished questions are saved in {output_dir}; "
              "run the same command again to resume", file=sys.stderr)
        sys.exit(130)
    finally:
        while _run_log_handlers:
            handler = _run_log_handlers.pop()
            logging.getLogger().removeHandler(handler)
            handler.close()
    print(f"\n{summary['model']} / {summary.get('method', summary['drafter'])}  ({output_dir})")
    print(format_summary_table(summary))
    report = violation_report(summary, read_answers(output_dir))
    if report:
        print(f"\n{report}", file=sys.stderr)


def cli() -> None:
    """``main`` with one exit status, USER_ERROR, for every user error: Hydra's own (an unknown group option, a
    key not in the config, a bad override, a run directory that cannot be created) are raised to here instead of
    printed by Hydra (which exits 1, like a bug), and reported like specbench's. HYDRA_FULL_ERROR=1 set by the
    user keeps Hydra's full tracebacks."""
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
        cause = error.__cause__
        detail = f"\n{cause}" if isinstance(cause, OmegaConfBaseException) and str(cause) not in str(error) else ""
        print(f"specbench: error: {error}{detail}", file=sys.stderr)
        sys.exit(USER_ERROR)
    except OSError as error:
        if _task_started:
            raise
        print(f"specbench: error: cannot create the run directory: {error.strerror}: {error.filename}; choose a "
              "writable hydra.run.dir (or hydra.sweep.dir)", file=sys.stderr)
        sys.exit(USER_ERROR)


if __name__ == "__main__":
    cli()
