#!/usr/bin/env bash
# Runs (or resumes) the sampling sweep, then regenerates its table, figures and report in results/sampling/.
#   scripts/reproduce_sampling.sh                       # the embedded model on this machine
#   scripts/reproduce_sampling.sh model=vicuna-7b task.path=question.jsonl hydra/launcher=slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -m specbench -m experiment=sampling "$@"
out=results/sampling
mkdir -p "$out"
"$python" -m analysis tables runs/experiments/sampling --format md --out "$out/table.md"
"$python" -m analysis tables runs/experiments/sampling --format latex --out "$out/table.tex"
"$python" -m analysis tables runs/experiments/sampling --format csv --out "$out/table.csv"
"$python" -m analysis figures runs/experiments/sampling --out "$out/figures"
"$python" -m analysis report runs/experiments/sampling --out "$out/report.html"
