#!/usr/bin/env bash
# The README's main-job command: set up, fetch the default models, run the default experiment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/specserve experiment "$@"
