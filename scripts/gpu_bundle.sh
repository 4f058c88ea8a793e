#!/usr/bin/env bash
# Prepare, on a machine with network, the wheels that scripts/gpu_check.py needs on a bare GPU machine that has
# torch, transformers, accelerate, numpy, pandas, pyarrow, numba and PyYAML but not specbench's configuration and
# datastore packages (hydra-core, omegaconf, antlr4, pydivsufsort, gguf), and no network.
#
#   scripts/gpu_bundle.sh [DIR] [PYTHON_VERSION]      (defaults: shared-gpu-bundle, 3.12)
#
# DIR is git-ignored but travels with the working tree when named in `carry` (it is a few MiB, far under 64 MiB).
# The versions are the ones this venv runs, so the GPU machine composes exactly the configs the tests compose.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-shared-gpu-bundle}
PYVER=${2:-3.12}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p "$DIR"
rm -f "$DIR"/*.whl
# pure-python wheels and the compiled suffix-array wheel, for the GPU machine's Python, without dependencies
# (pydivsufsort unpinned: its newest releases have no manylinux2014 wheel, which runs on any glibc >= 2.17)
"$PY" -m pip download --quiet --only-binary :all: --python-version "$PYVER" --platform manylinux2014_x86_64 \
    --no-deps -d "$DIR" \
    "hydra-core==$(version hydra-core)" "omegaconf==$(version omegaconf)" \
    "pydivsufsort>=0.0.14" "gguf==$(version gguf)"
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 pins) is published as an sdist only: build its wheel here
"$PY" -m pip wheel --quiet --no-deps "antlr4-python3-runtime==$(version antlr4-python3-runtime)" -w "$DIR"
echo "bundle $DIR ($(du -sh "$DIR" | cut -f1)):"
ls -l "$DIR"/*.whl | awk '{printf "  %9d  %s\n", $5, $NF}'
cat <<USAGE

On the GPU machine (run tool: carry ["$DIR"]), from the repository root:
  pip install --no-index --no-deps $DIR/*.whl && python scripts/gpu_check.py --out gpu_check.json
USAGE
