#!/usr/bin/env bash
# Create or refresh the project virtualenv (.venv by default; FEDRAY_VENV overrides).
#  - No reinstall when pyproject.toml and this script are unchanged (a stamp file records their hash).
#  - torch: an existing torch in the base interpreter (e.g. a CUDA build) is reused through
#    --system-site-packages and left alone. Otherwise, on a machine with an NVIDIA GPU the default
#    (CUDA) wheel is installed; without a GPU the CPU build torch==2.13.0 is installed first, so that
#    the unpinned torch requirement of the package is already satisfied and no CUDA packages are pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FEDRAY_VENV:-.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.fedray-setup-stamp"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/fedray" ]; then
  exit 0
fi
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
  echo "fedray needs Python >= 3.10 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c 'import torch' >/dev/null 2>&1; then
    echo "[setup] reusing the torch already installed for $PY"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] GPU found: installing the default torch build"
    "${pip[@]}" install torch
  else
    echo "[setup] no GPU: installing the CPU build torch==2.13.0"
    "${pip[@]}" install torch==2.13.0
  fi
fi
echo "[setup] installing fedray and its dependencies into $VENV"
"${pip[@]}" install -e ".[test]"
echo "$want" > "$stamp"
