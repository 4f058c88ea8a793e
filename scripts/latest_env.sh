#!/usr/bin/env bash
# Runs specbench under the newest releases pyproject.toml allows, from a second virtual environment built once per
# machine and brought up to the newest releases on every call, so that a release that breaks something is seen by CI
# before a user meets it (./setup.sh installs the lock, specbench/data/lock-*.txt, by default):
#
#   scripts/latest_env.sh [PYTEST_OPTIONS]    the default test suite under the newest releases (CI runs it bare)
#   scripts/latest_env.sh python ARGS...      that environment's python, e.g. `python -m specbench ...`
#   scripts/latest_env.sh path                build or bring up to date, print the environment's directory
#
# The environment lives in ${SPECBENCH_CACHE:-~/.cache/specbench}/venvs/latest-py<X.Y> (about 2 GB) and holds the CPU
# build of setup.sh's torch (the one release not taken at its newest: setup.sh pins it, and PyPI's newest is a CUDA
# build), pyproject.toml's dependencies and test extra at their newest allowed releases, and what setup.sh adds (the
# embedded model, the question sets). It does not see the system's site-packages. specbench runs from this checkout
# (a path file, as in scripts/vllm_env.sh). Each call asks the index for newer releases (eager: dependencies of
# dependencies too; a minute when nothing is new) and prints how the environment differs from the lock: those are
# the versions a `scripts/lock.py write` there would lock once the suite passes.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

PYTHON=${PYTHON:-python3}
TORCH_VERSION=$(sed -n 's/^TORCH_VERSION=\([0-9.]*\).*/\1/p' "$repo/setup.sh")  # one torch for both environments
RECIPE=1  # bump when build's steps change: the environment is then made again

# pyproject.toml's dependencies and its test extra, one a line.
requirements() { "$PYTHON" "$repo/scripts/pyproject_requirements.py"; }
mapfile -t dependencies < <(requirements)
[ "${#dependencies[@]}" -gt 0 ] || exit 1
# What setup.sh installs besides specbench, with --no-deps (its own lines, so the two cannot drift apart).
mapfile -t extras < <(sed -n 's/^ *locked_install .*--no-deps \(.*\)$/\1/p' "$repo/setup.sh" | tr ' ' '\n' | grep -v '^$')

venv="${SPECBENCH_CACHE:-$HOME/.cache/specbench}/venvs/latest-py$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
py="$venv/bin/python"
stamp="$venv/.specbench-latest-$( (echo "$TORCH_VERSION $RECIPE"; cat "$0") | sha256sum | cut -c1-16)"

# In a subshell, so the lock is released when it ends: two CI jobs on one machine update one environment in turn.
update() (
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  pip_install() { "$py" -m pip install --disable-pip-version-check -q "$@"; }
  if [ ! -f "$stamp" ]; then
    echo "latest_env: building $venv (a few minutes the first time)" >&2
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    # The CPU build, as scripts/floor_env.sh installs it (`+cpu` from PyTorch's CPU index when reachable, else from
    # pip's configured sources): PyPI's plain torch on Linux is a multi-GB CUDA build.
    local torch_spec="torch==$TORCH_VERSION" torch_index=()
    [ "$(uname -s)" = Linux ] && torch_spec+="+cpu"
    if "$py" -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
      torch_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
    fi
    pip_install "$torch_spec" "${torch_index[@]}"
    touch "$stamp"
  fi
  # Every call: the newest releases allowed, torch held where it is (accelerate requires torch; an upgrade would
  # take PyPI's newest, a CUDA build).
  local installed_torch
  installed_torch=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
  pip_install --upgrade --upgrade-strategy eager "${dependencies[@]}" "torch==$installed_torch"
  pip_install --upgrade --no-deps "${extras[@]}"
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [ "$(cat "$site/specbench-checkout.pth" 2>/dev/null)" != "$repo" ]; then
    printf '%s\n' "$repo" >"$site/specbench-checkout.pth.tmp" && mv "$site/specbench-checkout.pth.tmp" "$site/specbench-checkout.pth"
  fi
)

in_env() {
  cd "$repo"
  PYTHONNOUSERSITE=1 "$py" "$@"
}

update
case "${1:-}" in
  path)
    echo "$venv"
    ;;
  python)
    shift
    in_env "$@"
    ;;
  "" | -*)
    in_env -c "
import sys, specbench
assert specbench.__file__.startswith('$repo/'), specbench.__file__
print(f'latest_env: specbench from $repo', file=sys.stderr)"
    # What the newest releases change against the lock (exit 1 there means only that they differ).
    in_env scripts/lock.py check | sed 's/^lock: /latest_env: /' >&2 || true
    status=0
    in_env -m pytest -q "$@" || status=$?
    exit "$status"
    ;;
  *)
    echo "usage: scripts/latest_env.sh [PYTEST_OPTIONS... | python ARGS... | path]" >&2
    exit 2
    ;;
esac
