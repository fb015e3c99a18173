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

# Airflow's Edge executor, with KL_AIRFLOW_EDGE_WORKERS workers (0: the LocalExecutor of the environment): the
# scheduler queues task instances as edge jobs, the workers take them over the api-server's edge API (authenticated
# with the jwt_secret of the shared airflow.cfg) and run them. Every worker has a home of its own (the edge worker
# keeps its status files there, whatever its --pid) and reads the shared configuration through AIRFLOW_CONFIG.
edge_workers=${KL_AIRFLOW_EDGE_WORKERS:-0}
if (( edge_workers > 0 )); then
  export AIRFLOW__CORE__EXECUTOR=airflow.providers.edge3.executors.EdgeExecutor
  export AIRFLOW__EDGE__API_ENABLED=True
  export AIRFLOW__EDGE__API_URL=http://127.0.0.1:$AIRFLOW__API__PORT/edge_worker/v1/rpcapi
  # A job is picked up within a second; a worker lost is noticed after 5 heartbeats.
  export AIRFLOW__EDGE__JOB_POLL_INTERVAL=${AIRFLOW__EDGE__JOB_POLL_INTERVAL:-1}
  export AIRFLOW__EDGE__HEARTBEAT_INTERVAL=${AIRFLOW__EDGE__HEARTBEAT_INTERVAL:-10}
  # The workers share the components' log folder: pushed to the api-server as well, every line would be there twice.
  export AIRFLOW__EDGE__PUSH_LOGS=False
  export AIRFLOW_CONFIG=${AIRFLOW_CONFIG:-$AIRFLOW_HOME/airflow.cfg}
fi

# One edge worker, started again whenever it ends, not only when a signal killed it: a worker gives up when the
# api-server did not answer before its request's token expired (a slow start), and a worker started again at once
# after a crash is refused until its old registration ages out (5 heartbeats). SIGTERM to the subshell stops it.
edge_worker() {  # edge_worker <n>
  local child home=$AIRFLOW_HOME/edge-worker-$1
  trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
  mkdir -p "$home"
  while true; do
    AIRFLOW_HOME=$home airflow edge worker --edge-hostname "kafka-ledger-edge-$1" --pid "$home/worker.pid" \
      --concurrency "${KL_AIRFLOW_EDGE_CONCURRENCY:-2}" & child=$!
    wait "$child"
    echo "[airflow.sh] edge worker $1 ended (exit status $?): starting it again in 5 s" >&2
    sleep 5
  done
}

component api-server & pids+=($!)
component scheduler --skip-serve-logs & pids+=($!)
component dag-processor & pids+=($!)
component triggerer --skip-serve-logs & pids+=($!)
for n in $(seq 1 "$edge_workers"); do edge_worker "$n" & pids+=($!); done
wait -n
echo "[airflow.sh] an Airflow component exited with $?: stopping the others" >&2
stop 1
