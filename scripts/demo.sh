#!/usr/bin/env bash
# Quick start, command 1: set up everything on a fresh machine (idempotent), then run the demo.
# The demo prints its JSON accounting (counted from Kafka and Postgres); `kafka-ledger verify` then checks
# the ledger's invariants and, against Kafka, every offset committed since its last verify (all of them on a
# first run), and exits non-zero on any problem or if it could not check.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/stack.sh up
. scripts/env.sh
python -m kafka_ledger.demo "$@"
kafka-ledger verify impressions
