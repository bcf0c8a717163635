#!/usr/bin/env bash
# Set up (if needed), then lint (ruff), type-check (mypy over the typed seams: fedray/core, fedray/engine, fedray/driver) and
# run the whole test suite. Extra arguments go to pytest. Configuration: [tool.ruff] / [tool.mypy] in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
export TQDM_DISABLE=1
venv="${FEDRAY_VENV:-.venv}"
echo "[test] ruff check fedray tuning jobs tests"
"$venv/bin/python" -m ruff check --quiet fedray tuning jobs tests
echo "[test] mypy (fedray/core, fedray/engine, fedray/driver)"
"$venv/bin/python" -m mypy --no-error-summary
exec "$venv/bin/python" -m pytest -q "$@"
