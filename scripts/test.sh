#!/usr/bin/env bash
# Quick start, command 2: set up everything on a fresh machine (idempotent), then lint and run all tests in two
# lanes: the unit tests first (no services, under a minute: a typo fails here, not after half an hour), then
# the integration tests against the real stack (`-m integration`, every test under tests/integration).
# Extra arguments go to one pytest run after the whole set-up, e.g. `scripts/test.sh tests/unit` or
# `scripts/test.sh -k drain`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/stack.sh install
. scripts/env.sh
ruff check .
if [ $# -gt 0 ]; then
  bash scripts/stack.sh up
  bash scripts/stack.sh browser
  exec pytest "$@"
fi
echo "[test] lane 1: unit tests"
pytest -m "not integration"
echo "[test] lane 2: integration tests (set-up first)"
bash scripts/stack.sh up
bash scripts/stack.sh browser
pytest -m integration --durations=25
