#!/usr/bin/env bash
# Airflow's components (api-server, scheduler, dag-processor, triggerer) in the foreground, every one on
# loopback. Not `airflow standalone`: it also starts the scheduler's and the triggerer's log servers, which
# listen on every interface whatever the configuration; here they are off and the api-server reads task
# logs from the log folder the components share. Stops all of them on SIGINT or SIGTERM, and when any one
# exits. `scripts/stack.sh airflow` runs it as a supervisord program; the tests' dedicated Airflow runs it too.
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

airflow api-server & pids+=($!)
airflow scheduler --skip-serve-logs & pids+=($!)
airflow dag-processor & pids+=($!)
airflow triggerer --skip-serve-logs & pids+=($!)
wait -n
echo "[airflow.sh] an Airflow component exited with $?: stopping the others" >&2
stop 1
