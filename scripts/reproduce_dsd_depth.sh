#!/usr/bin/env bash
# Runs (or resumes) the dsd_depth sweep, then regenerates its table, figures and report in results/dsd_depth/.
#   scripts/reproduce_dsd_depth.sh                       # the embedded model on this machine
#   scripts/reproduce_dsd_depth.sh model=vicuna-7b task.path=question.jsonl hydra/launcher=slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -m specbench -m experiment=dsd_depth "$@"
out=results/dsd_depth
mkdir -p "$out"
"$python" -m analysis tables runs/experiments/dsd_depth --format md --out "$out/table.md"
"$python" -m analysis tables runs/experiments/dsd_depth --format latex --out "$out/table.tex"
"$python" -m analysis tables runs/experiments/dsd_depth --format csv --out "$out/table.csv"
"$python" -m analysis figures runs/experiments/dsd_depth --out "$out/figures"
"$python" -m analysis report runs/experiments/dsd_depth --out "$out/report.html"
