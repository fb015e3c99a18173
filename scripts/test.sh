#!/usr/bin/env bash
# Quick start, command 2: set up everything on a fresh machine (idempotent), then lint and run all tests.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit` or `scripts/test.sh -k drain`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/stack.sh up
bash scripts/stack.sh browser
. scripts/env.sh
ruff check .
pytest "$@"
