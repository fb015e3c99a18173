#!/usr/bin/env bash
# Airflow's components (api-server, scheduler, dag-processor, triggerer) in the foreground, every one on
# loopback. Not `airflow standalone`: it also starts the scheduler's and the triggerer's log servers, which
# listen on every interface whatever the configuration; here they are off and the api-server reads task
# logs from the log folder the components share. Stops all of them on SIGINT or SIGTERM, and when any one
# exits by itself; a component killed by a signal (the OOM killer, kill -9) is started again alone, as a service
# manager restarts one service. `scripts/stack.sh airflow` runs it as a supervisord program; the tests' dedicated
# Airflow runs it too (the doorbell's fault campaign kills its triggerer and scheduler).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

pids=()
stop() {
  trap - INT TERM
  kill -TERM "${pids[@]}" 2>/dev/null
  wait
  exit "$1"
}
trap 'stop 0' INT TERM

# The api-server builds its execution API's routes (Cadwyn's versioned routers) at the first request to it, which
# the first task after a start would wait for (4 s on a quiet machine, 8 to 12 s on a busy one): ask once as soon
# as it answers.
warm_execution_api() {
  local _
  for _ in $(seq 120); do
    curl -sf -o /dev/null -m 60 "${AIRFLOW__CORE__EXECUTION_API_SERVER_URL%/}/health" && return
    sleep 1
  done
  echo "[airflow.sh] the api-server's execution API did not answer within 120 tries" >&2
}

# One component, in a subshell that starts it again when a signal killed it (exit status above 128) and ends
# with its status when it exited by itself. SIGTERM to the subshell stops the component.
component() {
  local child status warming=
  trap 'kill -TERM "$child" $warming 2>/dev/null; wait "$child"; exit 0' TERM INT
  while true; do
    airflow "$@" & child=$!
    if [ "$1" = api-server ]; then warm_execution_api & warming=$!; fi
    wait "$child"; status=$?
    (( status > 128 )) || exit "$status"
    echo "[airflow.sh] airflow $1 was killed (exit status $status): starting it again" >&2
    sleep 1
  done
}

component api-server & pids+=($!)
component scheduler --skip-serve-logs & pids+=($!)
component dag-processor & pids+=($!)
component triggerer --skip-serve-logs & pids+=($!)
wait -n
echo "[airflow.sh] an Airflow component exited with $?: stopping the others" >&2
stop 1
