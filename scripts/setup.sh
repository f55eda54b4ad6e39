#!/usr/bin/env bash
# Creates .venv with Python 3.12, installs requirements.txt into it, then this project in editable mode
# (seqmodels, pallas_kernels, benchmarks, experiments importable from anywhere; no script edits sys.path),
# then libtpu into .libtpu/ for compiling ahead of time for TPU topologies on this machine.
# Usage: bash scripts/setup.sh        (from the repository root; safe to re-run)
# Packages are installed without byte-compiling every module (--no-compile): Python compiles the modules a process
# imports on first import and keeps them; measured 2026-12-08 (2 cores, requirements.txt into a fresh venv, in both
# orders): 80 / 121 s with byte-compiling, 66 / 60 s without, against about 4 s more on the first
# `import jax, flax.nnx, torch, transformers, orbax.checkpoint, grain`.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python312() {
  local candidate
  for candidate in "${PYTHON:-}" python3.12; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
        && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  local roots=()
  command -v pyenv >/dev/null 2>&1 && roots+=("$(pyenv root)/versions")
  roots+=("${PYENV_ROOT:-$HOME/.pyenv}/versions" "$HOME/.pyenv/versions")
  for root in "${roots[@]}"; do
    for candidate in "$root"/3.12*/bin/python3.12; do
      [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
  done
  return 1
}

if ! python=$(find_python312); then
  echo "setup: no Python 3.12 found (looked at \$PYTHON, python3.12 on PATH and pyenv versions)." >&2
  echo "setup: jax 0.11 needs Python 3.12; install one (e.g. 'pyenv install 3.12') or set PYTHON=/path/to/python3.12." >&2
  exit 1
fi
echo "setup: using $python ($("$python" --version))"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --no-compile -r requirements.txt
.venv/bin/python -m pip install --quiet --no-compile --no-deps -r requirements-no-deps.txt
.venv/bin/python -m pip install --quiet --no-compile -e .
# libtpu (requirements-tpu.txt) into .libtpu/, not the venv: only processes given PYTHONPATH=.libtpu
# (the ahead-of-time TPU compiler, its tests) see it. SEQMODELS_SKIP_LIBTPU=1 leaves it out.
libtpu_version=$(sed -n 's/^libtpu==//p' requirements-tpu.txt)
if [ "${SEQMODELS_SKIP_LIBTPU:-0}" != 1 ] && [ ! -d ".libtpu/libtpu-${libtpu_version}.dist-info" ]; then
  rm -rf .libtpu
  .venv/bin/python -m pip install --quiet --no-compile --no-deps --target .libtpu -r requirements-tpu.txt
fi
echo "setup: done. Run the tests with: .venv/bin/python -m pytest"
