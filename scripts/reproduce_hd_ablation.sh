#!/usr/bin/env bash
# Runs (or resumes) the hd_ablation sweep, then regenerates its table, figures and report in results/hd_ablation/.
#   scripts/reproduce_hd_ablation.sh                       # the embedded model on this machine
#   scripts/reproduce_hd_ablation.sh model=vicuna-7b task.path=question.jsonl hydra/launcher=slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -m specbench -m experiment=hd_ablation "$@"
out=results/hd_ablation
mkdir -p "$out"
"$python" -m analysis tables runs/experiments/hd_ablation --format md --out "$out/table.md"
"$python" -m analysis tables runs/experiments/hd_ablation --format latex --out "$out/table.tex"
"$python" -m analysis tables runs/experiments/hd_ablation --format csv --out "$out/table.csv"
"$python" -m analysis figures runs/experiments/hd_ablation --out "$out/figures"
"$python" -m analysis report runs/experiments/hd_ablation --out "$out/report.html"
