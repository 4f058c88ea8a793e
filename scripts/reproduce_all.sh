#!/usr/bin/env bash
# Every sweep, then one report over all of them in results/report.html. Extra arguments go to every sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
for experiment in hd_table beyond hd_ablation dsd_depth sampling; do
  scripts/reproduce_$experiment.sh "$@"
done
"$python" -m analysis report runs/experiments --out results/report.html
