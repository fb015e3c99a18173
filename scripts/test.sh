#!/usr/bin/env bash
# Quick start, command 2: set up everything on a fresh machine (idempotent), then lint and run all tests, failing
# fast: the unit tests first (no services, under a minute: a typo fails here, not after half an hour), then the
# integration tests against the real stack in two lanes at once: those that share stack 0 on two pytest-xdist
# workers, and those that restart or kill services (`-m own_stack`) on stacks 1 and 2, one worker each. At the
# end, a table of where the time went (lane, file, seconds; docs/testing.md).
# Extra arguments go to one pytest run on stack 0 after its set-up, e.g. `scripts/test.sh tests/unit` or
# `scripts/test.sh -k drain`; `scripts/test.sh -m long` runs the long lane (tests marked `long`, left out of the
# default run to keep it under 35 minutes: docs/testing.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS=0
bash scripts/stack.sh install
. scripts/env.sh
ruff check .
if [ $# -gt 0 ]; then
  bash scripts/stack.sh up
  bash scripts/stack.sh browser
  exec pytest "$@"
fi

LOGS=$KL_STATE/logs
export KL_TEST_TIMES=$KL_STATE/test-times.jsonl
: >"$KL_TEST_TIMES"
lane_took() { printf '{"lane": "%s", "wall": %d}\n' "$1" "$2" >>"$KL_TEST_TIMES"; }
trap 'lane_took "(all)" "$SECONDS"; echo "[test] where the time went:"; python -m tools.test_times "$KL_TEST_TIMES"' EXIT
lane_took set-up "$SECONDS"

# The stacks come up meanwhile (set-up installed what they share): stack 0 and the browser, whose start on a fresh
# machine (the broker's first start, the warm-up batch, Debian's chromium) took minutes after the unit tests; stacks
# 1 and 2 without the warm-up batch: their tests restart the Spark Connect server anyway.
{ bash scripts/stack.sh up && bash scripts/stack.sh browser; } >"$LOGS/test-stack-0-up.log" 2>&1 &
stack_0=$!
for slot in 1 2; do
  python -m tools.stack run "$slot" env KL_SPARK_CONNECT_WARM_UP=0 bash scripts/stack.sh up \
    >"$LOGS/test-stack-$slot-up.log" 2>&1 &
  eval "stack_$slot=$!"
done

# So are the trace test's OpenTelemetry Collector (built with Go the first time: minutes, off the lanes' clock) and
# the Kubernetes test's mock API server (fetched from Maven Central and compiled the first time).
{ bash scripts/stack.sh install-otel-collector && bash scripts/stack.sh install-kubernetes-mock; } \
  >"$LOGS/test-tools-build.log" 2>&1 &
tools_build=$!

echo "[test] lane 1: unit tests"
started=$SECONDS
KL_TEST_LANE=unit pytest -m "not integration"
lane_took unit $((SECONDS - started))

echo "[test] the stacks (up since the unit tests began)"
started=$SECONDS
for slot in 0 1 2; do
  pid_var=stack_$slot
  wait "${!pid_var}" || { cat "$LOGS/test-stack-$slot-up.log" >&2; echo "[test] stack $slot did not come up" >&2; exit 1; }
done
wait "$tools_build" || { cat "$LOGS/test-tools-build.log" >&2; echo "[test] the OpenTelemetry Collector or the Kubernetes mock did not build" >&2; exit 1; }
lane_took stacks $((SECONDS - started))

echo "[test] lanes 2 and 3 at once: integration tests on stack 0 (2 workers), and on stacks 1 and 2 (-m own_stack)"
started=$SECONDS
own_log=$LOGS/test-own-stacks.log
(
  rc=0
  KL_TEST_LANE=own-stacks KL_TEST_STACKS="1 2" \
    pytest -m "integration and own_stack and not long" -n 2 --dist worksteal --durations=10 >"$own_log" 2>&1 || rc=$?
  lane_took own-stacks $((SECONDS - started))
  exit $rc
) &
own=$!
shared_rc=0
KL_TEST_LANE=shared pytest -m "integration and not own_stack and not long" -n 2 --dist loadfile --durations=15 \
  || shared_rc=$?
lane_took shared $((SECONDS - started))
own_rc=0
wait "$own" || own_rc=$?
echo "[test] lane 3, the tests on stacks of their own ($own_log):"
cat "$own_log"
[ "$shared_rc" = 0 ] && [ "$own_rc" = 0 ]
