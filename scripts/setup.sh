#!/usr/bin/env bash
# Create or refresh the project virtualenv (.venv by default; FEDRAY_VENV overrides).
#  - No reinstall when pyproject.toml and this script are unchanged (a stamp file records their hash).
#  - torch: an existing torch in the base interpreter (e.g. a CUDA build) is reused through
#    --system-site-packages and left alone. Otherwise, on a machine with an NVIDIA GPU the default
#    (CUDA) wheel is installed; without a GPU the CPU build torch==2.13.0 is installed first, so that
#    the unpinned torch requirement of the package is already satisfied and no CUDA packages are pulled.
#  - One line per step, with the seconds it took; pip runs quietly (-q), so only its warnings and errors show.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FEDRAY_VENV:-.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.fedray-setup-stamp"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/fedray" ]; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

# step WHAT COMMAND...: "[setup] WHAT ... done in N s"; what the command writes to stderr (pip's warnings and
# errors) shows as it comes, and the result then gets a line of its own; a failure says so and exits
step() {
  local what=$1 t=$SECONDS rc=0 err
  shift
  err=$(mktemp)
  printf '[setup] %s ... ' "$what"
  { "$@" 2>&1 1>&3 3>&- | tee "$err" >&2 3>&-; } 3>&1 || rc=$?  # stderr through tee, stdout as it is
  if [ -s "$err" ]; then printf '[setup] %s: ' "$what"; fi
  rm -f "$err"
  if [ "$rc" -ne 0 ]; then
    echo "failed (exit $rc) after $((SECONDS - t)) s" >&2
    exit "$rc"
  fi
  echo "done in $((SECONDS - t)) s"
}

if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
  echo "fedray needs Python >= 3.10 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
started=$SECONDS
echo "[setup] setting up $VENV for fedray with $("$PY" --version 2>&1) (a few minutes the first time)"
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c 'import torch' >/dev/null 2>&1; then
    step "creating $VENV, reusing the torch already installed for $PY" "$PY" -m venv --system-site-packages "$VENV"
  else
    step "creating $VENV" "$PY" -m venv "$VENV"
  fi
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
step "upgrading pip" "${pip[@]}" install --upgrade pip
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    step "installing torch (the default build: a GPU was found)" "${pip[@]}" install torch
  else
    step "installing torch==2.13.0 (CPU build: no GPU found)" "${pip[@]}" install torch==2.13.0
  fi
fi
# PYTHONWARNINGS: not setuptools' note that every editable install of a flat layout prints ("Editable
# installation. Please be careful with folders in your working directory with the same name as your
# package"): this checkout is that folder
PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
  step "installing fedray (editable) with its dependencies (ray, pyarrow, optuna, ...)" "${pip[@]}" install -e ".[test]"
echo "$want" > "$stamp"
echo "[setup] $VENV ready in $((SECONDS - started)) s"
