# Environment shared by every kafka-ledger script: paths, ports and service addresses.
# Source it (". scripts/env.sh"). Every value can be set beforehand to point the project at external
# services or other ports; nothing here overrides what is already in the environment.

KL_HOME=${KL_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# Several stacks can run side by side, each with its own state and ports: stack N (KL_STACK_SLOT=N) keeps its state
# in .stack-N and listens on the ports below plus 100 x N (scripts/test.sh runs the tests that restart services
# on stacks 1 and 2 while the others share stack 0).
KL_STACK_SLOT=${KL_STACK_SLOT:-0}
if [ "$KL_STACK_SLOT" = 0 ]; then
  KL_STATE=${KL_STATE:-$KL_HOME/.stack}         # data, logs, pids and stamps (git-ignored)
else
  KL_STATE=${KL_STATE:-$KL_HOME/.stack-$KL_STACK_SLOT}
fi
kl_port() { echo $(($1 + 100 * KL_STACK_SLOT)); }
# What set-up downloads and builds once for every stack of this clone (jars, Toxiproxy), with its stamps.
KL_CACHE=${KL_CACHE:-$KL_HOME/.stack/cache}
KL_VENV=${KL_VENV:-$KL_HOME/.venv}
# Kafka's jars from Maven Central: the local broker, and Kafka's own tools (`kafka-ledger kafka <tool>`, which
# finds them through KAFKA_LEDGER_KAFKA_TOOLS_DIR below).
KL_KAFKA_LIBS=${KL_KAFKA_LIBS:-$KL_CACHE/kafka-libs}

KL_KAFKA_PORT=${KL_KAFKA_PORT:-$(kl_port 19092)}
KL_KAFKA_CONTROLLER_PORT=${KL_KAFKA_CONTROLLER_PORT:-$(kl_port 19093)}
# The broker's second client listener: SASL_SSL (SCRAM-SHA-512 over TLS).
KL_KAFKA_SASL_PORT=${KL_KAFKA_SASL_PORT:-$(kl_port 19094)}
# The local stack's CA (ca.pem) and the certificates it signed for the broker and Postgres, made at set-up.
KL_TLS_DIR=${KL_TLS_DIR:-$KL_STATE/tls}
KL_KAFKA_SASL_USER=${KL_KAFKA_SASL_USER:-ingest}
KL_PG_PORT=${KL_PG_PORT:-$(kl_port 15432)}
KL_AIRFLOW_PORT=${KL_AIRFLOW_PORT:-$(kl_port 18080)}
# The integration tests' own Airflow (tests/integration/airflow_server.py), beside a developer's on KL_AIRFLOW_PORT.
KL_AIRFLOW_TEST_PORT=${KL_AIRFLOW_TEST_PORT:-$(kl_port 18088)}
KL_SPARK_CONNECT_PORT=${KL_SPARK_CONNECT_PORT:-$(kl_port 19002)}
# The schema registry (Apicurio Registry, its Confluent-compatible API under /apis/ccompat/v7): Avro values' schemas.
KL_SCHEMA_REGISTRY_PORT=${KL_SCHEMA_REGISTRY_PORT:-$(kl_port 18085)}
# Kafka Connect: a standalone worker running Debezium's PostgreSQL connector against the stack's Postgres (change
# data capture from its `cdc` database); its REST API on loopback. Started on demand (`scripts/stack.sh
# kafka-connect`: the CDC demo and tests), never by `up`.
KL_KAFKA_CONNECT_PORT=${KL_KAFKA_CONNECT_PORT:-$(kl_port 18083)}
# Its REST API's user (basic authentication; the password KL_KAFKA_CONNECT_PASSWORD in $KL_SECRETS).
KL_KAFKA_CONNECT_USER=${KL_KAFKA_CONNECT_USER:-kafka-ledger}
# kafka-ledger's Prometheus endpoint (`scripts/stack.sh monitoring`), and the Prometheus that scrapes it (its UI and
# API: user KL_PROMETHEUS_USER, password KL_PROMETHEUS_PASSWORD).
KL_METRICS_PORT=${KL_METRICS_PORT:-$(kl_port 19464)}
KL_PROMETHEUS_PORT=${KL_PROMETHEUS_PORT:-$(kl_port 19090)}
KL_PROMETHEUS_USER=${KL_PROMETHEUS_USER:-kafka-ledger}
# An OpenTelemetry Collector receiving OTLP over HTTP (`scripts/stack.sh otel-collector`: the trace tests); a task
# exports its traces there when OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$KL_OTLP_PORT.
KL_OTLP_PORT=${KL_OTLP_PORT:-$(kl_port 19318)}
# A mock Kubernetes API server (fabric8's) the tests' spark-submit deploys a driver pod to (`scripts/stack.sh
# kubernetes-mock`); never started by `up`. Loopback only, no authentication: a test tool that holds no data.
KL_KUBERNETES_MOCK_PORT=${KL_KUBERNETES_MOCK_PORT:-$(kl_port 18443)}
# Toxiproxy (a TCP proxy with an HTTP API) between the clients and each service, for the fault campaign's network
# faults: started on demand (`scripts/stack.sh proxies`: the tests and `scripts/fault_campaign.sh --network`), never
# by `up`. Loopback only; its API has no authentication (a test tool: it injects faults, it holds no data).
KL_TOXIPROXY_PORT=${KL_TOXIPROXY_PORT:-$(kl_port 18474)}
# The broker's listeners behind the proxy (PLAINTEXT and SASL_SSL): they advertise the proxy's ports, so that a
# client bootstrapped through the proxy keeps talking through it.
KL_KAFKA_PROXIED_PORT=${KL_KAFKA_PROXIED_PORT:-$(kl_port 19095)}
KL_KAFKA_SASL_PROXIED_PORT=${KL_KAFKA_SASL_PROXIED_PORT:-$(kl_port 19096)}
# Where the proxy listens, per service.
KL_KAFKA_PROXY_PORT=${KL_KAFKA_PROXY_PORT:-$(kl_port 19097)}
KL_KAFKA_SASL_PROXY_PORT=${KL_KAFKA_SASL_PROXY_PORT:-$(kl_port 19098)}
KL_PG_PROXY_PORT=${KL_PG_PROXY_PORT:-$(kl_port 15433)}
KL_SPARK_CONNECT_PROXY_PORT=${KL_SPARK_CONNECT_PROXY_PORT:-$(kl_port 19003)}
KL_SCHEMA_REGISTRY_PROXY_PORT=${KL_SCHEMA_REGISTRY_PROXY_PORT:-$(kl_port 18086)}
# Spark batches running at once across all pipelines (the slots of the Airflow pool kafka_ledger_spark; one
# per pipeline at a time whatever this says). Each batch in the connect runtime shares the server's heap.
KL_SPARK_SLOTS=${KL_SPARK_SLOTS:-2}
KL_SPARK_POOL_DESCRIPTION="Spark batches at once across all kafka-ledger pipelines (each pipeline runs one at a time)"
# The local Spark standalone cluster (`scripts/stack.sh cluster`): one master and one worker on loopback.
KL_SPARK_MASTER_PORT=${KL_SPARK_MASTER_PORT:-$(kl_port 17077)}
KL_SPARK_MASTER_UI_PORT=${KL_SPARK_MASTER_UI_PORT:-$(kl_port 18081)}
KL_SPARK_WORKER_UI_PORT=${KL_SPARK_WORKER_UI_PORT:-$(kl_port 18082)}
KL_SPARK_WORKER_CORES=${KL_SPARK_WORKER_CORES:-2}
KL_SPARK_WORKER_MEMORY=${KL_SPARK_WORKER_MEMORY:-2g}
KL_SPARK_CLUSTER_MASTER=spark://127.0.0.1:$KL_SPARK_MASTER_PORT
# Heap of the Spark Connect server (its driver, which runs the local executors too): bounds its memory.
KL_SPARK_CONNECT_MEMORY=${KL_SPARK_CONNECT_MEMORY:-1g}
# Cores of a Spark cluster the Connect server's executors hold (it keeps them while it runs): the cluster's
# other cores run spark-submit batches, which would otherwise wait for ever. Ignored with a local master.
KL_SPARK_CONNECT_CORES=${KL_SPARK_CONNECT_CORES:-1}
# 1: after starting the Spark Connect server, scripts/stack.sh runs `kafka-ledger warm-up` (a made-up batch through
# the decode) so that the first real batch finds the server's code compiled; 0 skips it.
KL_SPARK_CONNECT_WARM_UP=${KL_SPARK_CONNECT_WARM_UP:-1}
# The lake (Iceberg): its catalog `lake` is Iceberg's JDBC catalog in the stack's Postgres (database and role
# `lake`), its data files under KL_LAKE_DIR; Spark's settings for it go into the stack's spark-defaults.conf.
KL_LAKE_DIR=${KL_LAKE_DIR:-$KL_STATE/lake}

# Passwords of the local stack (Postgres roles, Kafka's SCRAM user, the broker's key store, Spark's RPC secret): random, made
# once per stack and kept in $KL_SECRETS (mode 600). Not common words: Airflow masks a password wherever it appears in a task log, so a password such as
# the project's name would hide that name in every log line.
KL_SECRETS=${KL_SECRETS:-$KL_STATE/secrets.env}
mkdir -p "$(dirname "$KL_SECRETS")"
(
  umask 077
  flock 9  # two first runs at once: one writes, the other then reads the same values
  for name in KL_PG_SUPERUSER_PASSWORD KL_PG_LEDGER_PASSWORD KL_PG_AIRFLOW_PASSWORD KL_PG_AIRFLOW_TEST_PASSWORD \
              KL_PG_LAKE_PASSWORD KL_PG_CDC_PASSWORD KL_KAFKA_SASL_PASSWORD KL_KAFKA_KEYSTORE_PASSWORD \
              KL_SPARK_AUTH_SECRET KL_KAFKA_CONNECT_PASSWORD KL_METRICS_TOKEN KL_PROMETHEUS_PASSWORD; do
    grep -q "^$name=" "$KL_SECRETS" 2>/dev/null \
      || printf '%s=%s\n' "$name" "$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')" >>"$KL_SECRETS"
  done
) 9>>"$KL_SECRETS.lock"
. "$KL_SECRETS"

# Where the project's own services are. Set these to use external ones: `scripts/stack.sh start`
# then skips starting the local service whose address you replaced.
[ -n "${KAFKA_LEDGER_BOOTSTRAP_SERVERS:-}" ] && KL_LOCAL_KAFKA=${KL_LOCAL_KAFKA:-0}
[ -n "${KAFKA_LEDGER_DB_URL:-}" ] && KL_LOCAL_POSTGRES=${KL_LOCAL_POSTGRES:-0}
[ -n "${AIRFLOW_CONN_SPARK_CONNECT_DEFAULT:-}" ] && KL_LOCAL_SPARK_CONNECT=${KL_LOCAL_SPARK_CONNECT:-0}
[ -n "${KAFKA_LEDGER_SCHEMA_REGISTRY_URL:-}" ] && KL_LOCAL_SCHEMA_REGISTRY=${KL_LOCAL_SCHEMA_REGISTRY:-0}
KL_LOCAL_KAFKA=${KL_LOCAL_KAFKA:-1}
KL_LOCAL_POSTGRES=${KL_LOCAL_POSTGRES:-1}
KL_LOCAL_SPARK_CONNECT=${KL_LOCAL_SPARK_CONNECT:-1}
KL_LOCAL_SCHEMA_REGISTRY=${KL_LOCAL_SCHEMA_REGISTRY:-1}
# kafka-ledger's own settings, generated from their declarations in include/kafka_ledger/config/settings.py (why
# each value: there) by `python -m kafka_ledger.config.reference`; committed, as this file runs before set-up.
# generated: kafka-ledger settings
KAFKA_LEDGER_BOOTSTRAP_SERVERS=${KAFKA_LEDGER_BOOTSTRAP_SERVERS:-127.0.0.1:$KL_KAFKA_PORT}
KAFKA_LEDGER_DB_URL=${KAFKA_LEDGER_DB_URL:-postgresql://kafka_ledger:$KL_PG_LEDGER_PASSWORD@127.0.0.1:$KL_PG_PORT/kafka_ledger?sslmode=verify-full&sslrootcert=$KL_TLS_DIR/ca.pem}
KAFKA_LEDGER_SCHEMA_REGISTRY_URL=${KAFKA_LEDGER_SCHEMA_REGISTRY_URL:-http://127.0.0.1:$KL_SCHEMA_REGISTRY_PORT/apis/ccompat/v7}
KAFKA_LEDGER_SPARK_RUNTIME=${KAFKA_LEDGER_SPARK_RUNTIME:-connect}
KAFKA_LEDGER_SPARK_MASTER=${KAFKA_LEDGER_SPARK_MASTER:-local[*]}
KAFKA_LEDGER_PIPELINES=${KAFKA_LEDGER_PIPELINES:-$KL_HOME/config/pipelines.yaml}
KAFKA_LEDGER_SPARK_JARS_DIR=${KAFKA_LEDGER_SPARK_JARS_DIR:-$KL_CACHE/spark-jars}
KAFKA_LEDGER_KAFKA_TOOLS_DIR=${KAFKA_LEDGER_KAFKA_TOOLS_DIR:-$KL_KAFKA_LIBS}
KAFKA_LEDGER_METRICS_TOKEN=${KAFKA_LEDGER_METRICS_TOKEN:-$KL_METRICS_TOKEN}
export KAFKA_LEDGER_BOOTSTRAP_SERVERS KAFKA_LEDGER_DB_URL KAFKA_LEDGER_SCHEMA_REGISTRY_URL KAFKA_LEDGER_SPARK_RUNTIME KAFKA_LEDGER_SPARK_MASTER KAFKA_LEDGER_PIPELINES KAFKA_LEDGER_SPARK_JARS_DIR KAFKA_LEDGER_KAFKA_TOOLS_DIR KAFKA_LEDGER_METRICS_TOKEN
# end generated

# Airflow: Postgres metadata DB, the project's dags/ and plugins/, and every connection defined
# explicitly (a missing spark_default silently means master "yarn").
export AIRFLOW_HOME=${AIRFLOW_HOME:-$KL_STATE/airflow}
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-postgresql+psycopg2://airflow:$KL_PG_AIRFLOW_PASSWORD@127.0.0.1:$KL_PG_PORT/airflow}
export AIRFLOW__CORE__DAGS_FOLDER=${AIRFLOW__CORE__DAGS_FOLDER:-$KL_HOME/dags}
export AIRFLOW__CORE__PLUGINS_FOLDER=${AIRFLOW__CORE__PLUGINS_FOLDER:-$KL_HOME/plugins}
export AIRFLOW__CORE__LOAD_EXAMPLES=${AIRFLOW__CORE__LOAD_EXAMPLES:-False}
export AIRFLOW__CORE__EXECUTOR=${AIRFLOW__CORE__EXECUTOR:-LocalExecutor}
export AIRFLOW__API__PORT=${AIRFLOW__API__PORT:-$KL_AIRFLOW_PORT}
# Airflow's default is every interface: the UI and API of the local stack answer on loopback only.
export AIRFLOW__API__HOST=${AIRFLOW__API__HOST:-127.0.0.1}
# Task processes report to the api-server's execution API: it must name the port we serve on.
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=${AIRFLOW__CORE__EXECUTION_API_SERVER_URL:-http://127.0.0.1:$KL_AIRFLOW_PORT/execution/}
# A DAG file's parse may take several seconds on a busy 2-core machine (the tests' file declares 140 DAGs); past
# Airflow's 30 s default every DAG of the file would vanish as an import error until the next parse succeeds.
export AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT=${AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT:-120}
export AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT=${AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT:-180}
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-30}
# A doorbell's watcher starts at its DAG's first parse after the DAG is unpaused (Airflow registers the watchers of
# unpaused DAGs only): the DAG files are parsed every 5 s (Airflow's default: 30), so that the first records after an
# unpause are published within seconds.
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=${AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL:-5}
export AIRFLOW_CONN_SPARK_DEFAULT=${AIRFLOW_CONN_SPARK_DEFAULT:-"{\"conn_type\": \"spark\", \"host\": \"$KAFKA_LEDGER_SPARK_MASTER\"}"}
export AIRFLOW_CONN_SPARK_CONNECT_DEFAULT=${AIRFLOW_CONN_SPARK_CONNECT_DEFAULT:-"{\"conn_type\": \"spark_connect\", \"host\": \"sc://127.0.0.1\", \"port\": $KL_SPARK_CONNECT_PORT}"}
export AIRFLOW_CONN_KAFKA_LEDGER_DB=${AIRFLOW_CONN_KAFKA_LEDGER_DB:-$KAFKA_LEDGER_DB_URL}
export AIRFLOW_CONN_KAFKA_LEDGER_KAFKA=${AIRFLOW_CONN_KAFKA_LEDGER_KAFKA:-"{\"conn_type\": \"generic\", \"extra\": {\"bootstrap.servers\": \"$KAFKA_LEDGER_BOOTSTRAP_SERVERS\"}}"}

export KL_SECRETS KL_PG_AIRFLOW_TEST_PASSWORD KL_KAFKA_SASL_PASSWORD KL_KAFKA_SASL_PORT KL_TLS_DIR KL_KAFKA_SASL_USER
export KL_HOME KL_STACK_SLOT KL_STATE KL_CACHE KL_VENV KL_KAFKA_LIBS KL_LOCAL_KAFKA KL_LOCAL_POSTGRES KL_LOCAL_SPARK_CONNECT KL_LOCAL_SCHEMA_REGISTRY KL_KAFKA_PORT KL_LAKE_DIR KL_SCHEMA_REGISTRY_PORT
export KL_KAFKA_CONNECT_PORT KL_KAFKA_CONNECT_USER KL_KAFKA_CONNECT_PASSWORD KL_PG_CDC_PASSWORD
export KL_METRICS_PORT KL_PROMETHEUS_PORT KL_PROMETHEUS_USER KL_PROMETHEUS_PASSWORD KL_OTLP_PORT KL_KUBERNETES_MOCK_PORT
export KL_SPARK_SLOTS KL_SPARK_POOL_DESCRIPTION KL_KAFKA_CONTROLLER_PORT KL_PG_PORT KL_AIRFLOW_PORT KL_AIRFLOW_TEST_PORT KL_SPARK_CONNECT_PORT KL_SPARK_CONNECT_MEMORY KL_SPARK_CONNECT_CORES
# Spark's settings for every Spark process of the stack (the cluster, spark-submit, the Connect server): a
# spark-defaults.conf made from the secrets by scripts/stack.sh, so the RPC secret is on no command line.
export SPARK_CONF_DIR=${SPARK_CONF_DIR:-$KL_STATE/spark-conf}
# Spark on this machine only (local[*] or the stack's cluster): its services (drivers, the cluster's daemons
# and executors, their UIs) bind loopback. An external cluster's executors must reach the driver: not then.
case $KAFKA_LEDGER_SPARK_MASTER in
  local*|"$KL_SPARK_CLUSTER_MASTER") KL_SPARK_ON_THIS_MACHINE=1; export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1} ;;
  *) KL_SPARK_ON_THIS_MACHINE=0 ;;
esac
export KL_SPARK_ON_THIS_MACHINE
export KL_TOXIPROXY_PORT KL_KAFKA_PROXIED_PORT KL_KAFKA_SASL_PROXIED_PORT KL_KAFKA_PROXY_PORT KL_KAFKA_SASL_PROXY_PORT KL_PG_PROXY_PORT KL_SPARK_CONNECT_PROXY_PORT KL_SCHEMA_REGISTRY_PROXY_PORT
export KL_SPARK_MASTER_PORT KL_SPARK_MASTER_UI_PORT KL_SPARK_WORKER_UI_PORT KL_SPARK_WORKER_CORES KL_SPARK_WORKER_MEMORY KL_SPARK_CLUSTER_MASTER
# spark-submit is called by bare name by the Spark provider, and the driver must use the venv's Python.
export PATH="$KL_VENV/bin:$PATH"
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$KL_VENV/bin/python}
export PYSPARK_DRIVER_PYTHON=${PYSPARK_DRIVER_PYTHON:-$KL_VENV/bin/python}
