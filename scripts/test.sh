#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
export TQDM_DISABLE=1
exec "${FEDRAY_VENV:-.venv}/bin/python" -m pytest -q "$@"
