"""``python -m specbench [overrides]``: run one benchmark configuration (or a sweep with ``-m``)."""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.config import register_resolvers
from specbench.errors import SpecbenchError

register_resolvers()  # the configs interpolate ${method:...} and ${initials:...}

log = logging.getLogger("specbench")


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from specbench.records import format_summary_table, read_answers, violation_report
    from specbench.runner import run_benchmark

    output_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run_benchmark(cfg, output_dir)
    except SpecbenchError as error:
        print(f"specbench: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"\nspecbench: interrupted; finished questions are saved in {output_dir}; "
              "run the same command again to resume", file=sys.stderr)
        sys.exit(130)
    print(f"\n{summary['model']} / {summary.get('method', summary['drafter'])}  ({output_dir})")
    print(format_summary_table(summary))
    report = violation_report(summary, read_answers(output_dir))
    if report:
        print(f"\n{report}", file=sys.stderr)


if __name__ == "__main__":
    main()
