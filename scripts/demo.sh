#!/usr/bin/env bash
# Set up (if needed) and run the main demo: FedAvg on the embedded MNIST subset on a local Ray.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
exec "${FEDRAY_VENV:-.venv}/bin/fedray" run jobs/configs/demo.yaml "$@"
