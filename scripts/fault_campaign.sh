#!/usr/bin/env bash
# The fault-injection campaign (tests/integration/fault_campaign.py): set up the stack, then inject one
# fault per iteration while records flow, checking that no record is lost or doubled.
#   bash scripts/fault_campaign.sh --faults 200 --seed 20261121 --write-docs docs   # the full campaign
# Arguments go to the harness; `--help` lists them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/stack.sh up >&2
. scripts/env.sh
exec python tests/integration/fault_campaign.py "$@"
