#!/usr/bin/env bash
# Runs (or resumes) the hd_table sweep, then regenerates its table, figures and report in results/hd_table/.
#   scripts/reproduce_hd_table.sh                       # the embedded model on this machine
#   scripts/reproduce_hd_table.sh model=vicuna-7b task.path=question.jsonl hydra/launcher=slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -m specbench -m experiment=hd_table "$@"
out=results/hd_table
mkdir -p "$out"
"$python" -m analysis tables runs/experiments/hd_table --format md --out "$out/table.md"
"$python" -m analysis tables runs/experiments/hd_table --format latex --out "$out/table.tex"
"$python" -m analysis tables runs/experiments/hd_table --format csv --out "$out/table.csv"
"$python" -m analysis figures runs/experiments/hd_table --out "$out/figures"
"$python" -m analysis report runs/experiments/hd_table --out "$out/report.html"
