#!/usr/bin/env bash
# Runs (or resumes) one experiment's sweep, then regenerates its table (md, tex, csv), figures and report
# in results/EXPERIMENT/. Extra arguments are Hydra overrides for the sweep.
#   scripts/reproduce.sh hd_table
#   scripts/reproduce.sh hd_table model=vicuna-7b task.path=question.jsonl hydra/launcher=slurm
set -euo pipefail
cd "$(dirname "$0")/.."
experiment=$1
shift
python=${PYTHON:-.venv/bin/python}
"$python" -m specbench -m "experiment=$experiment" "$@"
runs=runs/experiments/$experiment
out=results/$experiment
mkdir -p "$out"
for format in md latex csv; do
  "$python" -m analysis tables "$runs" --format "$format" --out "$out/table.${format/latex/tex}" > /dev/null
done
"$python" -m analysis figures "$runs" --out "$out/figures"
"$python" -m analysis report "$runs" --out "$out/report.html"
