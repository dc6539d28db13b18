#!/usr/bin/env bash
# The README's test command: set up, lint, type-check, run the fast suite, then the slow
# (real-model) suite. Models fetched by tests are cached under $SPECSERVE_CACHE_DIR
# (default ~/.cache/specserve), outside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff format --check src tests
.venv/bin/ruff check src tests
.venv/bin/mypy
.venv/bin/python -m pytest -q -m "not slow" "$@"
if [ -z "${SPECSERVE_SKIP_SLOW:-}" ]; then
  rc=0
  .venv/bin/python -m pytest -q -m slow "$@" || rc=$?
  # pytest exits 5 when no test is selected; that is not a failure here.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
fi
