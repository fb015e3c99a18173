#!/usr/bin/env bash
# Quick start, command 1: set up everything on a fresh machine (idempotent), then run the demo.
# The demo prints its JSON accounting (counted from Kafka and Postgres); `kafka-ledger verify` then checks
# the ledger's invariants and every committed offset against Kafka, and exits non-zero on any problem.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/stack.sh up
. scripts/env.sh
python -m kafka_ledger.demo "$@"
kafka-ledger verify impressions
