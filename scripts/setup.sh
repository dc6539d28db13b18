#!/usr/bin/env bash
# Create .venv with specserve and its dev tools. Idempotent; safe to run on every command.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned in pyproject (torch==2.13.0); on a CPU machine pip takes the CPU wheel.
if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]" \
  >.venv/pip-install.log 2>&1; then
  grep -v "^WARNING: Location" .venv/pip-install.log >&2
  echo "setup: pip install failed (full log: .venv/pip-install.log)" >&2
  exit 1
fi
.venv/bin/python -c "import specserve, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
# Headless Chromium renders the benchmark's HTML report in an e2e test (skipped without it).
# Best effort: only as root with apt available; never fails the setup.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
  && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq >/dev/null 2>&1 || true; } \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || echo "setup: could not install chromium (report rendering test will be skipped)" >&2
fi
