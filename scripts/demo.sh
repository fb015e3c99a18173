#!/usr/bin/env bash
# Quick start, command 1: set up everything on a fresh machine (idempotent), then run the demo.
# The last line of output is the demo's JSON accounting, counted from Kafka and Postgres.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/stack.sh up
. scripts/env.sh
python -m kafka_ledger.demo "$@"
