#!/usr/bin/env bash
# Runs specbench under the oldest transformers it accepts (the floor of `transformers>=` in pyproject.toml),
# from a second virtual environment built once and reused:
#
#   scripts/floor_env.sh                      the lossless contract tests under the floor (what CI runs)
#   scripts/floor_env.sh python ARGS...       the floor environment's python, e.g. `python -m specbench ...`
#   scripts/floor_env.sh path                 build if needed, print the environment's directory
#
# SPECBENCH_TRANSFORMERS=5.17.0 picks another release (a venv of its own). The environment lives in
# ${SPECBENCH_CACHE:-~/.cache/specbench}/venvs/transformers-<version> and holds the CPU build of torch, the
# dependencies of pyproject.toml with transformers pinned, and pytest; specbench itself is read from this
# checkout through PYTHONPATH (no install), so a fresh clone in another folder reuses the same environment.
# A stamp records what was installed: a re-run costs nothing until pyproject.toml's dependencies or this
# script change. It does not see the system's site-packages, so a cluster's transformers cannot leak in.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
CONTRACT_TESTS=(tests/test_contract.py tests/test_kv_cache.py tests/test_loop_phases.py)

# The dependencies of pyproject.toml (and its test extra), one a line, with transformers pinned to $1.
# The first line is the floor itself, so the version lives in one place.
read_requirements() {
  "$PYTHON" - "$repo/pyproject.toml" "${1:-}" <<'EOF'
import re, sys
try:
    import tomllib
except ImportError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
requirements = project["dependencies"] + project["optional-dependencies"]["test"]
spec = next(r for r in requirements if re.match(r"transformers\b", r))
floor = re.search(r">=\s*([0-9][0-9.]*)", spec)
if floor is None:
    sys.exit(f"floor_env: no lower bound in pyproject.toml's {spec!r}")
version = sys.argv[2] or floor.group(1)
print(version)
for requirement in requirements:
    print(f"transformers=={version}" if requirement is spec else requirement)
EOF
}

mapfile -t lines < <(read_requirements "${SPECBENCH_TRANSFORMERS:-}")
[ "${#lines[@]}" -gt 1 ] || exit 1
version=${lines[0]}
requirements=("${lines[@]:1}")
venv="${SPECBENCH_CACHE:-$HOME/.cache/specbench}/venvs/transformers-$version"
py="$venv/bin/python"
stamp="$venv/.specbench-floor-$( (printf '%s\n' "${requirements[@]}" "$TORCH_VERSION"; cat "$0") | sha256sum | cut -c1-16)"

# In a subshell, so the lock is released when the build ends. Two CI jobs on one machine build one
# environment: the second waits, then finds the stamp.
build() (
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  [ -f "$stamp" ] && exit 0
  echo "floor_env: building $venv" >&2
  [ -x "$py" ] || "$PYTHON" -m venv "$venv"
  pip_install() { "$py" -m pip install --disable-pip-version-check -q "$@"; }
  # The CPU build, always: the contract tests run in float32 on the CPU, and an unpinned torch pulls a
  # multi-GB CUDA build. `+cpu` sorts after the plain release, so pip takes a CPU wheel wherever it sees one
  # (PyTorch's CPU index when reachable, a local wheel through pip's find-links otherwise).
  local torch_index=()
  if "$py" -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
    torch_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  pip_install "torch==$TORCH_VERSION" "${torch_index[@]}"
  # One resolution for everything else, so transformers' own pins choose tokenizers and huggingface_hub.
  pip_install "${requirements[@]}"
  rm -f "$venv"/.specbench-floor-*
  touch "$stamp"
  echo "floor_env: built ($("$py" -c 'import torch, transformers, tokenizers; print(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")'))" >&2
)

[ -f "$stamp" ] || build

in_env() {
  cd "$repo"
  PYTHONPATH="$repo" PYTHONNOUSERSITE=1 "$py" "$@"
}

case "${1:-}" in
  path)
    echo "$venv"
    ;;
  python)
    shift
    in_env "$@"
    ;;
  "")
    # The environment must really be the one it claims: the pinned transformers, specbench from this checkout.
    in_env -c "
import sys, transformers, specbench
from packaging.version import Version
assert Version(transformers.__version__) == Version('$version'), transformers.__version__
assert specbench.__file__.startswith('$repo/'), specbench.__file__
print(f'floor_env: transformers {transformers.__version__}, specbench from $repo', file=sys.stderr)"
    status=0
    in_env -m pytest -q "${CONTRACT_TESTS[@]}" || status=$?
    # pytest's 5 means nothing was collected: a renamed test file would otherwise pass as "checked".
    if [ "$status" -eq 5 ]; then
      echo "floor_env: no tests collected from ${CONTRACT_TESTS[*]}: nothing was checked under transformers $version" >&2
    fi
    exit "$status"
    ;;
  *)
    echo "usage: scripts/floor_env.sh [path | python ARGS...]" >&2
    exit 2
    ;;
esac
