#!/usr/bin/env bash
# Prepare, on a machine with network, the wheels that scripts/gpu_check.py needs on a bare GPU machine that has
# torch, transformers, accelerate, numpy, pandas, pyarrow, numba and PyYAML but not specbench's configuration and
# datastore packages (hydra-core, omegaconf, antlr4, pydivsufsort, gguf), and no network.
#
#   scripts/gpu_bundle.sh [DIR] [PYTHON_VERSION] [GLIBC]      (defaults: shared-gpu-bundle, 3.12, 2.39)
#
# GLIBC: the GPU machine's glibc (`ldd --version` there; the device tool's image, Ubuntu 24.04 with Python 3.12.3,
# has 2.39). Wheels built for any manylinux up to it are accepted: manylinux2014 (glibc 2.17) and the newer
# manylinux_2_N tags that recent releases publish only (manylinux_2_28 and later).
#
# DIR is git-ignored but travels with the working tree when named in `carry` (it is a few MiB, far under 64 MiB).
# The versions are the ones this venv runs, so the GPU machine composes exactly the configs the tests compose.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-shared-gpu-bundle}
PYVER=${2:-3.12}
GLIBC=${3:-2.39}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p "$DIR"
rm -f "$DIR"/*.whl
# Every manylinux tag the GPU machine's glibc runs: pip matches --platform tags exactly, so each is named, newest
# first (pip takes the newest release that has a wheel for any of them).
case "$GLIBC" in 2.[0-9]|2.[0-9][0-9]) ;; *) echo "gpu_bundle.sh: GLIBC=$GLIBC is not a glibc version like 2.39" >&2; exit 2;; esac
PLATFORMS=()
for minor in $(seq "${GLIBC#2.}" -1 17); do PLATFORMS+=(--platform "manylinux_2_${minor}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# pure-python wheels and the compiled suffix-array wheel, for the GPU machine's Python, without dependencies
# (pydivsufsort unpinned: its newest releases publish manylinux_2_28 wheels, older ones manylinux2014)
"$PY" -m pip download --quiet --only-binary :all: --python-version "$PYVER" "${PLATFORMS[@]}" \
    --no-deps -d "$DIR" \
    "hydra-core==$(version hydra-core)" "omegaconf==$(version omegaconf)" \
    "pydivsufsort>=0.0.14" "gguf==$(version gguf)"
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 pins) is published as an sdist only: build its wheel here
"$PY" -m pip wheel --quiet --no-deps "antlr4-python3-runtime==$(version antlr4-python3-runtime)" -w "$DIR"
# Row 6 (the compiled regime) needs transformers 5.24 or later; the image's is older. This venv's transformers and
# what it depends on, in a folder of their own, installed apart and put on the path for row 6's run only (a newer
# hub and its HTTP stack beside the image's torch must not touch rows 1-5). numpy stays the image's.
rm -rf "$DIR/transformers" && mkdir -p "$DIR/transformers"
"$PY" -m pip download --quiet --only-binary :all: --python-version "$PYVER" "${PLATFORMS[@]}" \
    -d "$DIR/transformers" "transformers==$(version transformers)"
rm -f "$DIR"/transformers/numpy-*.whl
echo "bundle $DIR ($(du -sh "$DIR" | cut -f1)):"
ls -l "$DIR"/*.whl | awk '{printf "  %9d  %s\n", $5, $NF}'
echo "  and $DIR/transformers/: $(ls "$DIR"/transformers/*.whl | wc -l) wheels, $(du -sh "$DIR/transformers" | cut -f1) (transformers $(version transformers) for row 6)"
cat <<USAGE

On the GPU machine (run tool: carry ["$DIR"]), from the repository root (the tool brings back only what is
written under \$OUT):
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $DIR/*.whl && PYTHONPATH=/tmp/site python3 scripts/gpu_check.py --rows 1,2,3,4,tp,5 --out "\$OUT/gpu_check.json"
and row 6, the compiled regime, under the bundled transformers:
  python3 -m pip install -q --no-index --no-deps --target /tmp/site6 $DIR/transformers/*.whl && PYTHONPATH=/tmp/site6:/tmp/site python3 scripts/gpu_check.py --rows 6 --out "\$OUT/gpu_check_6.json"
USAGE
