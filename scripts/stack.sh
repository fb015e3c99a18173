#!/usr/bin/env bash
# The local kafka-ledger stack: install, start, stop and inspect Kafka (KRaft), PostgreSQL, the Spark Connect
# server and Airflow. The services run under supervisord (one per $KL_STATE, its socket in $KL_STATE/run):
# this script writes each service's program section, then asks supervisorctl to start, stop or signal it
# and waits until the service answers.
#
#   scripts/stack.sh up         install what is missing, start Kafka + Postgres + Spark Connect + the schema registry,
#                               migrate both databases
#   scripts/stack.sh install    OS packages, Python venv, Kafka broker jars, Spark connector jars, the schema registry
#   scripts/stack.sh browser    Debian's chromium and chromium-driver, for the browser test (scripts/test.sh runs it)
#   scripts/stack.sh start      start Kafka, Postgres, the Spark Connect server and the schema registry (idempotent)
#                               and wait for them
#   scripts/stack.sh migrate    create roles/databases, run the ledger migrations and `airflow db migrate`
#   scripts/stack.sh airflow    start Airflow (api-server, scheduler, dag-processor, triggerer) on KL_AIRFLOW_PORT
#   scripts/stack.sh stop-airflow   stop it
#   scripts/stack.sh stop       stop every service and supervisord
#   scripts/stack.sh status     one line per service
#   scripts/stack.sh restart-postgres | restart-kafka | restart-spark-connect
#                               stop and start one service (the fault campaign uses them)
#   scripts/stack.sh kill-spark-connect   SIGKILL the Spark Connect server (the fault campaign's crash)
#   scripts/stack.sh stop-spark-connect   stop it (the freshness benchmark frees its cluster cores for the stream)
#   scripts/stack.sh cluster    start a Spark standalone master and worker on loopback (KL_SPARK_CLUSTER_MASTER);
#                               pipelines use it with KAFKA_LEDGER_SPARK_MASTER=spark://127.0.0.1:17077
#   scripts/stack.sh stop-cluster | kill-spark-worker   stop the cluster; SIGKILL the worker and its executors
#   scripts/stack.sh proxies | stop-proxies   Toxiproxy in front of Kafka, Postgres, Spark Connect and the schema registry (built with
#                               `go install` the first time): the fault campaign's network faults
#   scripts/stack.sh restart-schema-registry | kill-schema-registry   the schema registry's restart; its SIGKILL
#   scripts/stack.sh kafka-connect | stop-kafka-connect   Kafka Connect with Debezium's PostgreSQL connector on
#                               loopback (KL_KAFKA_CONNECT_PORT): change data capture from the stack's `cdc` database
#   scripts/stack.sh monitoring | stop-monitoring   kafka-ledger's Prometheus endpoint (`kafka-ledger metrics serve`) on
#                               KL_METRICS_PORT and a Prometheus scraping it on KL_PROMETHEUS_PORT, both on loopback
#   scripts/stack.sh otel-collector | stop-otel-collector   an OpenTelemetry Collector receiving OTLP over HTTP on
#                               KL_OTLP_PORT, its spans in its log (the trace test's); built with Go the first time
#                               (`install-otel-collector` builds it alone)
#   scripts/stack.sh kubernetes-mock | stop-kubernetes-mock   a mock Kubernetes API server on loopback (fabric8's), that
#                               the tests' spark-submit deploys a driver pod to (`install-kubernetes-mock` builds it alone)
#   scripts/stack.sh ctl ...    supervisorctl on the stack's supervisord (e.g. `ctl status`, `ctl tail -f kafka`)
#
# A stack lives under $KL_STATE (.stack/ by default): data, logs, supervisord's socket. What set-up downloads and
# builds (the venv aside: $KL_VENV) is every stack's of the clone, in $KL_CACHE (.stack/cache/).
# The services get the environment supervisord started with (scripts/env.sh and the overrides set then);
# what a service's command line says (the Spark master, ports) is written again on every start, and a service
# whose command changed is restarted by it.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

LOGS=$KL_STATE/logs
RUN=$KL_STATE/run
STAMPS=$KL_STATE/stamps
KAFKA_LIBS=$KL_KAFKA_LIBS
mkdir -p "$LOGS" "$RUN/programs" "$STAMPS" "$KL_CACHE/stamps"
chmod 700 "$RUN"

say() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

# A stamp records the hash of the inputs of a step, so a second run skips work that is already done: with the
# cache for what every stack of the clone shares (a second stack installs nothing), with the stack for the rest.
stamp_file() {
  case $1 in python|kafka-libs|spark-jars|schema-registry|kafka-connect|toxiproxy|prometheus|otel-collector|kubernetes-mock) echo "$KL_CACHE/stamps/$1" ;; *) echo "$STAMPS/$1" ;; esac
}
stamp_ok() { [ -f "$(stamp_file "$1")" ] && [ "$(cat "$(stamp_file "$1")")" = "$2" ]; }
stamp_set() { printf '%s' "$2" >"$(stamp_file "$1")"; }
hash_files() { cat "$@" | sha256sum | cut -c1-16; }

# --- Supervision ------------------------------------------------------------------------------------
SUPERVISOR_CONF=$RUN/supervisord.conf
sctl() { "$KL_VENV/bin/supervisorctl" -c "$SUPERVISOR_CONF" "$@"; }

# supervisord's own settings; the services' sections are files in $RUN/programs, written when they start.
# Its control socket is a Unix socket only its user may use: no TCP port, nothing beyond this machine.
ensure_supervisord() {
  cat >"$SUPERVISOR_CONF.tmp" <<CONF
[unix_http_server]
file=$RUN/supervisor.sock
chmod=0700

[supervisord]
logfile=$LOGS/supervisord.log
pidfile=$RUN/supervisord.pid
childlogdir=$LOGS
$( [ "$(id -u)" = 0 ] && echo "user=root" )

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://$RUN/supervisor.sock

[include]
files = $RUN/programs/*.conf
CONF
  mv "$SUPERVISOR_CONF.tmp" "$SUPERVISOR_CONF"
  sctl pid >/dev/null 2>&1 && return 0
  [ -x "$KL_VENV/bin/supervisord" ] || die "no supervisord in $KL_VENV: run scripts/stack.sh install"
  "$KL_VENV/bin/supervisord" -c "$SUPERVISOR_CONF" || die "supervisord did not start (log: $LOGS/supervisord.log)"
  local i
  for i in $(seq 1 50); do sctl pid >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "supervisord does not answer on $RUN/supervisor.sock (log: $LOGS/supervisord.log)"
}

# A service's console log (Kafka's own log4j log is kafka.log beside it).
program_log() { case $1 in kafka|kafka-connect) echo "$LOGS/$1.out" ;; *) echo "$LOGS/$1.log" ;; esac; }

# A service's program section. Never restarted behind our back: a crash stays visible (and the fault
# campaign's kills stay kills) until a verb of this script starts it again. Stopping signals its whole
# process group (the JVM and whatever it started), then kills it after `stopwaitsecs`.
# <stop group>: true signals the whole process group on stop, false the main process alone.
write_program() {  # write_program <name> <priority> <stop signal> <stop wait s> <stop group> <command> [extra lines]
  local name=$1 priority=$2 signal=$3 wait=$4 group=$5 command=$6 extra=${7:-} log; log=$(program_log "$1")
  (umask 077; cat >"$RUN/programs/$name.conf.tmp" <<CONF
[program:$name]
command=$command
priority=$priority
autostart=false
autorestart=false
startsecs=1
startretries=0
stopsignal=$signal
stopwaitsecs=$wait
stopasgroup=$group
killasgroup=true
redirect_stderr=true
stdout_logfile=$log
stdout_logfile_maxbytes=100MB
stdout_logfile_backups=1
$extra
CONF
  )
  mv "$RUN/programs/$name.conf.tmp" "$RUN/programs/$name.conf"
}

# supervisord takes the sections as written now: a changed one replaces (stops) the running service.
apply_programs() { sctl update >/dev/null; }

running() { sctl status "$1" >/dev/null 2>&1; }  # exit 0 only in state RUNNING
service_pid() { running "$1" && sctl pid "$1"; }

# Start a service and wait until it answers: `probe` succeeds within `seconds`, else its log and a clear end.
start_and_await() {  # start_and_await <program> <what> <seconds> <probe command...>
  local name=$1 what=$2 seconds=$3 log i; log=$(program_log "$1"); shift 3
  running "$name" || sctl start "$name" >/dev/null || { tail -n 30 "$log" >&2; die "$what did not start (log: $log)"; }
  for i in $(seq 1 "$seconds"); do
    "$@" && return 0
    running "$name" || { tail -n 30 "$log" >&2; die "$what exited during start (log: $log)"; }
    sleep 1
  done
  tail -n 30 "$log" >&2; die "$what did not answer within $seconds s (log: $log)"
}

stop_service() {  # stop_service <program or group:*> <what>
  [ -S "$RUN/supervisor.sock" ] && sctl pid >/dev/null 2>&1 || return 0
  running "$1" || return 0
  sctl stop "$1" >/dev/null && say "$2: stopped"
}

# Postgres refuses to run as root: run its binaries as the unprivileged "postgres" user when we are root.
as_pg() { if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

# The cluster lives in $KL_STATE/postgres, unless we are root and the postgres user cannot reach that
# folder (a clone under a private directory): then under ~postgres, linked from $KL_STATE/postgres.
pg_dir() {
  local home
  # Already linked: use the real path, the postgres user may not traverse the link's folder.
  if [ -L "$KL_STATE/postgres" ]; then readlink -f "$KL_STATE/postgres"; return; fi
  if [ "$(id -u)" != 0 ] || ! id postgres >/dev/null 2>&1 \
     || runuser -u postgres -- test -x "$KL_STATE" 2>/dev/null; then
    echo "$KL_STATE/postgres"; return
  fi
  home=$(getent passwd postgres | cut -d: -f6)
  echo "$home/kafka-ledger/$(printf '%s' "$KL_STATE" | sha256sum | cut -c1-12)"
}
PG_DIR=$(pg_dir)
PG_DATA=$PG_DIR/data
PG_LOG=$LOGS/postgres.log

install_os_packages() {
  local need=()
  if [ "$KL_LOCAL_POSTGRES" = 1 ] && { [ -z "$(pg_bin)" ] || [ ! -f "$(ls -d /usr/share/postgresql/*/extension 2>/dev/null | sort -V | tail -n 1)/btree_gist.control" ]; }; then
    need+=(postgresql postgresql-contrib)
  fi
  command -v java >/dev/null || need+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null || need+=(maven)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing OS packages (${need[*]}); install them or run as root"
    say "installing OS packages: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

install_python() {
  local key
  key=$(hash_files "$KL_HOME/requirements.txt" "$KL_HOME/requirements.lock" "$KL_HOME/pyproject.toml")
  if [ -x "$KL_VENV/bin/python" ] && stamp_ok python "$key"; then return; fi
  say "installing Python packages into $KL_VENV (frozen in requirements.lock)"
  [ -x "$KL_VENV/bin/python" ] || python3 -m venv "$KL_VENV"
  "$KL_VENV/bin/pip" install -q uv==0.13.8
  "$KL_VENV/bin/uv" pip install -q --python "$KL_VENV/bin/python" -r "$KL_HOME/requirements.txt" -c "$KL_HOME/requirements.lock"
  "$KL_VENV/bin/uv" pip install -q --python "$KL_VENV/bin/python" --no-deps -e "$KL_HOME"
  # Bytecode compiled once here (up-to-date files are skipped): uv writes none, and where PYTHONDONTWRITEBYTECODE
  # is set no process ever caches any, so every task process and every DAG parse compiled Airflow, PySpark and the
  # Kubernetes client anew (a parse of the tests' DAG file took 5.8 s instead of 2.0 s).
  # Some packages ship files that are not Python 3 on purpose (test data): compileall's failure on them is no
  # failure of the set-up.
  local packages
  packages=$("$KL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$KL_VENV/bin/python" -m compileall -q -j 0 "$packages" "$KL_HOME/include" "$KL_HOME/dags" "$KL_HOME/plugins" \
    "$KL_HOME/spark_jobs" "$KL_HOME/tools" >/dev/null || true
  stamp_set python "$key"
}

mvn_copy() {  # mvn_copy <pom dir> <output dir>
  mvn -q -B -s "$KL_HOME/stack/maven/settings.xml" -f "$1/pom.xml" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$2" >"$LOGS/maven.log" 2>&1 \
    || { tail -n 20 "$LOGS/maven.log" >&2; die "Maven could not resolve $1/pom.xml (log: $LOGS/maven.log)"; }
}

install_jars() {
  local key tmp pyspark_jars jar artifact
  key=$(hash_files "$KL_HOME/stack/maven/kafka/pom.xml")
  if ! stamp_ok kafka-libs "$key"; then
    say "resolving the Kafka broker from Maven Central"
    rm -rf "$KAFKA_LIBS"; mvn_copy "$KL_HOME/stack/maven/kafka" "$KAFKA_LIBS"
    stamp_set kafka-libs "$key"
  fi
  key=$(hash_files "$KL_HOME/stack/maven/spark-jars/pom.xml" "$KL_HOME/requirements.lock" "$KL_HOME"/stack/spark-jars/*.java)
  if ! stamp_ok spark-jars "$key"; then
    say "resolving the Spark Kafka connector, the Postgres JDBC driver, Iceberg's Spark runtime and protobuf-java from Maven Central"
    tmp=$(mktemp -d); mvn_copy "$KL_HOME/stack/maven/spark-jars" "$tmp"
    pyspark_jars=$("$KL_VENV/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
    rm -rf "$KAFKA_LEDGER_SPARK_JARS_DIR"; mkdir -p "$KAFKA_LEDGER_SPARK_JARS_DIR"
    # Only the jars PySpark lacks: a second copy of a jar at another version breaks the classpath.
    for jar in "$tmp"/*.jar; do
      artifact=$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$//')
      compgen -G "$pyspark_jars/$artifact-[0-9]*.jar" >/dev/null || cp "$jar" "$KAFKA_LEDGER_SPARK_JARS_DIR/"
    done
    rm -rf "$tmp"
    # kafka-ledger's own Spark functions (the Protobuf decoder), compiled against PySpark's jars and those above.
    tmp=$(mktemp -d)
    javac -nowarn --release 17 -cp "$pyspark_jars/*:$KAFKA_LEDGER_SPARK_JARS_DIR/*" -d "$tmp" "$KL_HOME"/stack/spark-jars/*.java \
      >"$LOGS/spark-functions-build.log" 2>&1 \
      || { tail -n 20 "$LOGS/spark-functions-build.log" >&2; die "compiling kafka-ledger's Spark functions failed"; }
    jar --create --file "$KAFKA_LEDGER_SPARK_JARS_DIR/kafka-ledger-spark-functions.jar" -C "$tmp" .
    rm -rf "$tmp"
    stamp_set spark-jars "$key"
  fi
}

install_schema_registry() {
  local key; key=$(hash_files "$KL_HOME/stack/maven/schema-registry/pom.xml")
  stamp_ok schema-registry "$key" && return
  say "resolving the schema registry (Apicurio Registry) from Maven Central"
  local tmp; tmp=$(mktemp -d); mvn_copy "$KL_HOME/stack/maven/schema-registry" "$tmp"
  rm -rf "$SCHEMA_REGISTRY_DIR"; mkdir -p "$SCHEMA_REGISTRY_DIR"
  tar xzf "$tmp"/*.tar.gz -C "$SCHEMA_REGISTRY_DIR"; rm -rf "$tmp"
  stamp_set schema-registry "$key"
}

# Kafka Connect's worker and, on its plugin path, Debezium's PostgreSQL connector and Apicurio's Avro converter.
KAFKA_CONNECT_LIBS=$KL_CACHE/kafka-connect
DEBEZIUM_PLUGINS=$KL_CACHE/debezium

install_kafka_connect() {
  local key tmp; key=$(hash_files "$KL_HOME/stack/maven/kafka-connect/pom.xml" "$KL_HOME/stack/maven/debezium/pom.xml" \
    "$KL_HOME/stack/maven/apicurio-converter/pom.xml" "$KL_HOME/stack/kafka-connect/converter-services.txt")
  stamp_ok kafka-connect "$key" && return
  say "resolving Kafka Connect, Debezium's PostgreSQL connector and Apicurio's Avro converter from Maven Central"
  rm -rf "$KAFKA_CONNECT_LIBS" "$DEBEZIUM_PLUGINS"
  mvn_copy "$KL_HOME/stack/maven/kafka-connect" "$KAFKA_CONNECT_LIBS"
  mvn_copy "$KL_HOME/stack/maven/debezium" "$DEBEZIUM_PLUGINS/debezium-connector-postgres"
  mvn_copy "$KL_HOME/stack/maven/apicurio-converter" "$DEBEZIUM_PLUGINS/apicurio-converter"
  # The converter's jar has no service manifest, which the worker's plugin.discovery=service_load finds plugins by.
  tmp=$(mktemp -d); mkdir -p "$tmp/META-INF/services"
  cp "$KL_HOME/stack/kafka-connect/converter-services.txt" "$tmp/META-INF/services/org.apache.kafka.connect.storage.Converter"
  (cd "$tmp" && jar cf "$DEBEZIUM_PLUGINS/apicurio-converter/kafka-ledger-converter-services.jar" META-INF) \
    || die "could not write the Avro converter's service manifest"
  rm -rf "$tmp"
  stamp_set kafka-connect "$key"
}

# Prometheus and promtool: Debian's package unpacked into the cache (no service installed, nothing in /usr).
PROMETHEUS_DIR=$KL_CACHE/prometheus
PROMETHEUS=$PROMETHEUS_DIR/usr/bin/prometheus

install_prometheus() {
  stamp_ok prometheus debian && [ -x "$PROMETHEUS" ] && return
  say "unpacking Debian's prometheus package (prometheus and promtool) into $PROMETHEUS_DIR"
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; }) \
    || die "apt-get download prometheus failed"
  rm -rf "$PROMETHEUS_DIR"; dpkg -x "$tmp"/prometheus_*.deb "$PROMETHEUS_DIR"; rm -rf "$tmp"
  stamp_set prometheus debian
}

install() { install_os_packages; install_python; install_jars; install_schema_registry; install_kafka_connect; install_prometheus; }

# Headless Chromium and its WebDriver, Debian's packages (the same version), for the ledger page's browser test.
install_browser() {
  command -v chromium >/dev/null && command -v chromedriver >/dev/null && return
  [ "$(id -u)" = 0 ] || die "missing chromium and chromium-driver (the browser test needs them); install them or run as root"
  say "installing OS packages: chromium chromium-driver"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
}

# --- Postgres --------------------------------------------------------------------------------------
pg_ready() { "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$KL_PG_PORT"; }

start_postgres() {
  [ "$KL_LOCAL_POSTGRES" = 1 ] || { say "postgres: external ($KAFKA_LEDGER_DB_URL), not started"; return; }
  local bin; bin=$(pg_bin)
  if [ ! -f "$PG_DATA/PG_VERSION" ]; then
    say "initialising a Postgres cluster in $PG_DATA"
    mkdir -p "$PG_DATA"; chmod 700 "$PG_DATA"
    [ "$PG_DIR" = "$KL_STATE/postgres" ] || ln -sfn "$PG_DIR" "$KL_STATE/postgres"
    (umask 077; printf '%s\n' "$KL_PG_SUPERUSER_PASSWORD" >"$PG_DIR/pwfile")
    [ "$(id -u)" = 0 ] && chown -R postgres: "$PG_DIR"
    as_pg "$bin/initdb" -D "$PG_DATA" -U postgres --pwfile="$PG_DIR/pwfile" \
      --auth-host=scram-sha-256 --auth-local=peer -E UTF8 >"$LOGS/initdb.log" 2>&1 \
      || { cat "$LOGS/initdb.log" >&2; die "initdb failed"; }
    rm -f "$PG_DIR/pwfile"
    rm -f "$STAMPS/databases" "$STAMPS/airflow-db" "$STAMPS/airflow-test-db"
  fi
  if running postgres; then
    # Access rules changed since it started (a newer checkout): the running server takes them on a reload.
    if ! cmp -s "$KL_HOME/stack/postgres/pg_hba.conf" "$PG_DIR/pg_hba.conf"; then
      cp "$KL_HOME/stack/postgres/pg_hba.conf" "$PG_DIR/pg_hba.conf"
      [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR/pg_hba.conf"
      psql_super -d postgres -c "SELECT pg_reload_conf()" >/dev/null
      say "postgres: access rules (pg_hba.conf) reloaded"
    fi
    # A cluster started before change data capture came: restarted once with its new settings (wal_level).
    if [ "$(psql_super -d postgres -tAc "SHOW wal_level" 2>/dev/null)" = logical ]; then
      say "postgres: already running on 127.0.0.1:$KL_PG_PORT"; return
    fi
    say "postgres: restarting with wal_level=logical (Debezium's change data capture needs it)"
    stop_service postgres postgres
  fi
  pg_ready && die "port $KL_PG_PORT is taken by another Postgres (not this stack's): stop it or set KL_PG_PORT"
  make_tls
  # TLS with the stack's certificate; its key and the access rules live beside the cluster, owned by its user
  # (the key must be, and that user may not reach $KL_TLS_DIR). Rewritten on every start: older clusters too.
  cp "$KL_TLS_DIR/postgres.pem" "$PG_DIR/server.pem"; cp "$KL_TLS_DIR/postgres.key" "$PG_DIR/server.key"
  cp "$KL_HOME/stack/postgres/pg_hba.conf" "$PG_DIR/pg_hba.conf"
  chmod 600 "$PG_DIR/server.key"
  [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR/server.pem" "$PG_DIR/server.key" "$PG_DIR/pg_hba.conf"
  # The postmaster in the foreground, as the postgres user when we are root (it refuses to run as root);
  # SIGINT is its fast shutdown: sessions end, committed work is on disk. To the postmaster alone: the signal
  # means other things to its backends.
  write_program postgres 10 INT 60 false "$bin/postgres -D $PG_DATA -c listen_addresses=127.0.0.1 -p $KL_PG_PORT -c unix_socket_directories='' -c max_connections=200 -c shared_buffers=256MB -c wal_level=logical -c fsync=on -c ssl=on -c ssl_cert_file=$PG_DIR/server.pem -c ssl_key_file=$PG_DIR/server.key -c hba_file=$PG_DIR/pg_hba.conf" \
    "directory=/$( [ "$(id -u)" = 0 ] && printf '\nuser=postgres' )"
  apply_programs
  start_and_await postgres postgres 60 pg_ready
  say "postgres: started on 127.0.0.1:$KL_PG_PORT (TLS; the ledger role over TLS only, CA $KL_TLS_DIR/ca.pem)"
}

# Passwords reach psql in its environment and SQL on stdin, never on a command line.
psql_super() { PGPASSWORD=$KL_PG_SUPERUSER_PASSWORD psql -v ON_ERROR_STOP=1 -q -h 127.0.0.1 -p "$KL_PG_PORT" -U postgres "$@"; }

create_databases() {
  [ "$KL_LOCAL_POSTGRES" = 1 ] || return 0
  local key; key=v3-$(hash_files "$KL_SECRETS")
  stamp_ok databases "$key" && return 0
  # A cluster made before passwords were generated has the superuser password "postgres": replace it.
  if ! psql_super -d postgres -c "SELECT 1" >/dev/null 2>&1 \
     && PGPASSWORD=postgres psql -q -h 127.0.0.1 -p "$KL_PG_PORT" -U postgres -d postgres -c "SELECT 1" >/dev/null 2>&1; then
    say "postgres: replacing the superuser's old password with the generated one ($KL_SECRETS)"
    printf "ALTER ROLE postgres PASSWORD '%s';\n" "$KL_PG_SUPERUSER_PASSWORD" \
      | PGPASSWORD=postgres psql -v ON_ERROR_STOP=1 -q -h 127.0.0.1 -p "$KL_PG_PORT" -U postgres -d postgres
  fi
  # airflow_test: the metadata DB of the dedicated Airflow that tests/integration/test_airflow_rest.py starts.
  # lake: Iceberg's JDBC catalog of the lake (its tables' metadata pointers; the data files are in KL_LAKE_DIR).
  # cdc: the source database Debezium captures (the CDC demo's and tests' tables); its role may replicate.
  say "creating roles and databases (kafka_ledger, airflow, airflow_test, lake, cdc)"
  local name password
  for name in kafka_ledger airflow airflow_test lake cdc; do
    case $name in
      kafka_ledger) password=$KL_PG_LEDGER_PASSWORD ;;
      airflow) password=$KL_PG_AIRFLOW_PASSWORD ;;
      airflow_test) password=$KL_PG_AIRFLOW_TEST_PASSWORD ;;
      lake) password=$KL_PG_LAKE_PASSWORD ;;
      cdc) password=$KL_PG_CDC_PASSWORD ;;
    esac
    psql_super -d postgres <<SQL
DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$name') THEN CREATE ROLE $name LOGIN; END IF; END \$\$;
ALTER ROLE $name PASSWORD '$password';
SQL
    [ "$name" = cdc ] && psql_super -d postgres -c "ALTER ROLE cdc REPLICATION"
    psql_super -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$name'" | grep -q 1 \
      || psql_super -d postgres -c "CREATE DATABASE $name OWNER $name"
  done
  stamp_set databases "$key"
}

# --- Kafka -----------------------------------------------------------------------------------------
KAFKA_DIR=$KL_STATE/kafka
# The local broker's plaintext listener: what set-up probes and administers it through, whatever
# KAFKA_LEDGER_BOOTSTRAP_SERVERS says (clients may use its SASL_SSL listener instead).
LOCAL_KAFKA=127.0.0.1:$KL_KAFKA_PORT

# One command line for the broker and its storage tool.
KAFKA_JAVA=(java -Xms256m -Xmx1g -cp "$KAFKA_LIBS/*" -Dlog4j2.configurationFile="$KL_HOME/stack/kafka/log4j2.properties" -Dkafka.logs.dir="$LOGS")

kafka_ready() {
  "$KL_VENV/bin/python" - "$LOCAL_KAFKA" <<'PY' 2>/dev/null
import sys
from confluent_kafka.admin import AdminClient
AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=2)
PY
}

# The local stack's CA and the certificates it signs (for 127.0.0.1 and localhost): the broker's SASL_SSL
# listener and Postgres. Made once by trustme (stack/tls.py); the key store's password reaches it in its
# environment, never its command line.
make_tls() {
  # Made already (stack/tls.py writes the CA last): no Python start-up on every service start.
  [ -f "$KL_TLS_DIR/ca.pem" ] && return 0
  KL_KAFKA_KEYSTORE_PASSWORD=$KL_KAFKA_KEYSTORE_PASSWORD "$KL_VENV/bin/python" "$KL_HOME/stack/tls.py" "$KL_TLS_DIR" >"$LOGS/tls.log" 2>&1 \
    || { cat "$LOGS/tls.log" >&2; die "making the TLS certificates failed"; }
  grep -q '^tls: made' "$LOGS/tls.log" && say "$(cat "$LOGS/tls.log")"
  return 0
}

# The SASL_SSL listener's SCRAM user (idempotent: set again on every start), through the plaintext listener.
add_kafka_scram_user() {
  "$KL_VENV/bin/python" - "$LOCAL_KAFKA" "$KL_KAFKA_SASL_USER" <<'PY' >>"$LOGS/kafka-scram.log" 2>&1 \
    || { tail -n 20 "$LOGS/kafka-scram.log" >&2; die "could not create Kafka's SCRAM user"; }
import os, sys
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
servers, user = sys.argv[1:3]
upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                      os.environ["KL_KAFKA_SASL_PASSWORD"].encode())
admin = AdminClient({"bootstrap.servers": servers})  # referenced until the futures resolve
for future in admin.alter_user_scram_credentials([upsert]).values():
    future.result(timeout=30)
PY
}

start_kafka() {
  [ "$KL_LOCAL_KAFKA" = 1 ] || { say "kafka: external ($KAFKA_LEDGER_BOOTSTRAP_SERVERS), not started"; return; }
  if running kafka; then say "kafka: already running (pid $(service_pid kafka))"; return; fi
  port_open "$KL_KAFKA_PORT" && die "port $KL_KAFKA_PORT is taken (another Kafka?): stop it or set KL_KAFKA_PORT"
  compgen -G "$KAFKA_LIBS/kafka_*.jar" >/dev/null || die "no Kafka broker jars in $KAFKA_LIBS: run scripts/stack.sh install"
  mkdir -p "$KAFKA_DIR"
  make_tls
  # Holds the key store's password: readable by us only.
  (umask 077; sed -e "s#@KAFKA_PORT@#$KL_KAFKA_PORT#g" -e "s#@CONTROLLER_PORT@#$KL_KAFKA_CONTROLLER_PORT#g" \
      -e "s#@SASL_PORT@#$KL_KAFKA_SASL_PORT#g" -e "s#@TLS_DIR@#$KL_TLS_DIR#g" \
      -e "s#@KAFKA_PROXIED_PORT@#$KL_KAFKA_PROXIED_PORT#g" -e "s#@SASL_PROXIED_PORT@#$KL_KAFKA_SASL_PROXIED_PORT#g" \
      -e "s#@KAFKA_PROXY_PORT@#$KL_KAFKA_PROXY_PORT#g" -e "s#@SASL_PROXY_PORT@#$KL_KAFKA_SASL_PROXY_PORT#g" \
      -e "s#@KEYSTORE_PASSWORD@#$KL_KAFKA_KEYSTORE_PASSWORD#g" \
      -e "s#@DATA_DIR@#$KAFKA_DIR/data#g" "$KL_HOME/stack/kafka/server.properties" >"$KAFKA_DIR/server.properties")
  chmod 600 "$KAFKA_DIR/server.properties"
  if [ ! -f "$KAFKA_DIR/data/meta.properties" ]; then
    say "formatting Kafka storage (KRaft, standalone controller)"
    local cluster_id; cluster_id=$("${KAFKA_JAVA[@]}" kafka.tools.StorageTool random-uuid)
    "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$KAFKA_DIR/server.properties" >"$LOGS/kafka-format.log" 2>&1 \
      || { cat "$LOGS/kafka-format.log" >&2; die "Kafka storage format failed"; }
  fi
  # SIGTERM is the broker's controlled shutdown; it may take a while with many partitions.
  write_program kafka 20 TERM 120 true "${KAFKA_JAVA[*]} kafka.Kafka $KAFKA_DIR/server.properties"
  apply_programs
  start_and_await kafka kafka 90 kafka_ready
  add_kafka_scram_user
  say "kafka: started on $LOCAL_KAFKA, SASL_SSL on 127.0.0.1:$KL_KAFKA_SASL_PORT (user $KL_KAFKA_SASL_USER, CA $KL_TLS_DIR/ca.pem) (pid $(service_pid kafka), log $LOGS/kafka.log)"
}

# --- Spark Connect server (the warm Spark runtime) --------------------------------------------------
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_spark_connect() {
  [ "$KL_LOCAL_SPARK_CONNECT" = 1 ] || { say "spark connect: external (connection spark_connect_default), not started"; return; }
  write_spark_conf
  local jars; jars=$(ls "$KAFKA_LEDGER_SPARK_JARS_DIR"/*.jar 2>/dev/null | paste -sd, -)
  [ -n "$jars" ] || die "no Spark connector jars in $KAFKA_LEDGER_SPARK_JARS_DIR: run scripts/stack.sh install"
  # The server's JVM is the driver and, with a local master, the executors: --driver-memory bounds its heap,
  # the -XX limits and MALLOC_ARENA_MAX what it holds beside the heap (direct buffers, code, malloc arenas). It
  # takes its whole heap at start (-Xms, every page touched): a fresh server's resident memory otherwise grew batch
  # after batch for its first minutes (1.1 GB to 1.5 GB), as the JVM widened its heap, which looks like a leak.
  # Everything binds loopback; -XX:-DontCompileHugeMethods lets the JIT compile the decoder's generated code.
  # On a cluster it holds its executors for good: spark.cores.max leaves the other cores to spark-submit batches.
  # A read that ends before a poll's last record (a replay, a capped batch) leaves the rest of that poll, up to
  # kafka.max.poll.records records, in Spark's pool of fetched data, where only a read starting at exactly that
  # offset takes it; by default it stays 5 minutes, and ten reads of one record from each of 18 partitions held
  # 1.8 million records (about 500 MB) of a 1 GB heap. Kept 10 s at most: the next capped batch of a drain usually
  # finds it, and a miss costs one fetch. (docs/deployment.md, Memory)
  # Each pipeline's batches work in one session of their own (runtimes/connect.py: pipeline_session), which keeps
  # their compiled query code: idle for a day and the server closes it, and the next batch replaces it.
  # The master is on the command line: a server asked for on another master is restarted there by apply_programs,
  # and so is one whose spark-defaults.conf changed (its fingerprint in the environment; the file holds secrets).
  # So is one whose own Spark functions were rebuilt (a running server keeps the classes it loaded).
  local conf_fingerprint; conf_fingerprint=$(hash_files "$SPARK_CONF_DIR/spark-defaults.conf" \
    "$KAFKA_LEDGER_SPARK_JARS_DIR/kafka-ledger-spark-functions.jar" 2>/dev/null || echo none)
  write_program spark-connect 40 TERM 30 true "$KL_VENV/bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer \
--name kafka-ledger-spark-connect --master $KAFKA_LEDGER_SPARK_MASTER --driver-memory $KL_SPARK_CONNECT_MEMORY --jars $jars \
--conf spark.connect.grpc.binding.address=127.0.0.1 --conf spark.connect.grpc.binding.port=$KL_SPARK_CONNECT_PORT \
--conf spark.driver.bindAddress=127.0.0.1 --conf spark.driver.host=127.0.0.1 --conf spark.ui.enabled=false \
--conf spark.sql.session.timeZone=UTC --conf spark.sql.shuffle.partitions=8 --conf spark.cores.max=$KL_SPARK_CONNECT_CORES \
--conf spark.kafka.consumer.fetchedData.cache.timeout=10s --conf spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval=5s \
--conf spark.connect.session.manager.defaultSessionTimeout=24h \
--conf \"spark.driver.extraJavaOptions=-Xms$KL_SPARK_CONNECT_MEMORY -XX:+AlwaysPreTouch -XX:-DontCompileHugeMethods -XX:MaxDirectMemorySize=256m -XX:ReservedCodeCacheSize=96m -XX:MaxMetaspaceSize=256m -XX:+UseParallelGC -Duser.timezone=UTC -Dlog4j2.configurationFile=file:$KL_HOME/stack/spark-connect/log4j2.properties\" \
spark-internal" "environment=MALLOC_ARENA_MAX=\"2\",KL_SPARK_CONF_FINGERPRINT=\"$conf_fingerprint\""
  apply_programs
  if running spark-connect; then
    say "spark connect: already running (pid $(service_pid spark-connect), master $KAFKA_LEDGER_SPARK_MASTER)"; return
  fi
  port_open "$KL_SPARK_CONNECT_PORT" && die "port $KL_SPARK_CONNECT_PORT is taken (another Spark Connect server?): stop it or set KL_SPARK_CONNECT_PORT"
  start_and_await spark-connect "the Spark Connect server" 120 port_open "$KL_SPARK_CONNECT_PORT"
  say "spark connect: started on sc://127.0.0.1:$KL_SPARK_CONNECT_PORT, master $KAFKA_LEDGER_SPARK_MASTER (pid $(service_pid spark-connect), heap $KL_SPARK_CONNECT_MEMORY, log $LOGS/spark-connect.log)"
  warm_up_spark_connect
}

# A fresh server's first batch takes about twice as long as the next ones (its code not yet compiled): a
# made-up batch through the decode, then the pipelines' newest records read (docs/operating.md). Not fatal: the
# first real batch is only slower.
warm_up_spark_connect() {
  [ "$KL_SPARK_CONNECT_WARM_UP" = 1 ] || return 0
  if "$KL_VENV/bin/kafka-ledger" warm-up >"$LOGS/spark-connect-warm-up.log" 2>&1; then
    local line
    while IFS= read -r line; do say "spark connect: $line"; done <"$LOGS/spark-connect-warm-up.log"
  else
    say "spark connect: the warm-up failed (see $LOGS/spark-connect-warm-up.log): the first batch will be slower"
  fi
}

# --- The schema registry (Apicurio Registry: the Confluent Schema Registry API under /apis/ccompat/v7) -------------
SCHEMA_REGISTRY_DIR=$KL_CACHE/schema-registry
LOCAL_SCHEMA_REGISTRY=http://127.0.0.1:$KL_SCHEMA_REGISTRY_PORT/apis/ccompat/v7

start_schema_registry() {
  [ "$KL_LOCAL_SCHEMA_REGISTRY" = 1 ] || { say "schema registry: external ($KAFKA_LEDGER_SCHEMA_REGISTRY_URL), not started"; return; }
  local jar; jar=$(ls "$SCHEMA_REGISTRY_DIR"/*-runner.jar 2>/dev/null | head -n 1)
  [ -n "$jar" ] || die "no schema registry in $SCHEMA_REGISTRY_DIR: run scripts/stack.sh install"
  mkdir -p "$KL_STATE/schema-registry"
  # Its schemas in an H2 file of the stack's state, not in memory (Apicurio's default): a restarted registry must
  # still know the id every record on the topics carries. Loopback only; the heap bounded like the other JVMs'.
  write_program schema-registry 30 TERM 30 true "java -Xmx256m -XX:+UseSerialGC -Dquarkus.http.host=127.0.0.1 \
-Dquarkus.http.port=$KL_SCHEMA_REGISTRY_PORT -jar $jar" \
    "directory=$KL_STATE/schema-registry
environment=REGISTRY_DATASOURCE_URL=\"jdbc:h2:file:$KL_STATE/schema-registry/registry\""
  apply_programs
  if running schema-registry; then say "schema registry: already running (pid $(service_pid schema-registry))"; return; fi
  port_open "$KL_SCHEMA_REGISTRY_PORT" && die "port $KL_SCHEMA_REGISTRY_PORT is taken (another registry?): stop it or set KL_SCHEMA_REGISTRY_PORT"
  start_and_await schema-registry "the schema registry" 120 curl -sf -o /dev/null "$LOCAL_SCHEMA_REGISTRY/subjects"
  say "schema registry: $LOCAL_SCHEMA_REGISTRY (pid $(service_pid schema-registry), schemas in $KL_STATE/schema-registry, log $LOGS/schema-registry.log)"
}

# --- Kafka Connect with Debezium (change data capture from the stack's Postgres) ----------------------------------
KAFKA_CONNECT_DIR=$KL_STATE/kafka-connect
LOCAL_KAFKA_CONNECT=http://127.0.0.1:$KL_KAFKA_CONNECT_PORT

# Up when its REST API answers, and asks a request without credentials for them (no password on a command line).
kafka_connect_ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$LOCAL_KAFKA_CONNECT/connectors")" = 401 ]; }

# A standalone worker (its connectors' offsets in a file of the stack's state) writing to the local broker, its REST
# API on loopback, behind basic authentication (Kafka's BasicAuthSecurityRestExtension: the user and password in a
# JAAS property file only we may read). The source database's password is in a file only we may read, which the worker's FileConfigProvider
# reads when a connector's config says `${file:<that file>:password}`: the connector's config, as the REST API shows
# it and the worker logs it, holds that reference, never the password.
start_kafka_connect() {
  [ "$KL_LOCAL_KAFKA" = 1 ] && [ "$KL_LOCAL_POSTGRES" = 1 ] \
    || die "kafka connect: the local stack's Kafka and Postgres only (Debezium captures its cdc database)"
  compgen -G "$KAFKA_CONNECT_LIBS/connect-runtime-*.jar" >/dev/null || die "no Kafka Connect in $KAFKA_CONNECT_LIBS: run scripts/stack.sh install"
  mkdir -p "$KAFKA_CONNECT_DIR"; chmod 700 "$KAFKA_CONNECT_DIR"
  (umask 077; printf 'password=%s\n' "$KL_PG_CDC_PASSWORD" >"$KAFKA_CONNECT_DIR/source-db.properties"
   printf '%s: %s\n' "$KL_KAFKA_CONNECT_USER" "$KL_KAFKA_CONNECT_PASSWORD" >"$KAFKA_CONNECT_DIR/rest-credentials.properties")
  cat >"$KAFKA_CONNECT_DIR/rest-jaas.conf" <<JAAS
KafkaConnect {
  org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule required
  file="$KAFKA_CONNECT_DIR/rest-credentials.properties";
};
JAAS
  sed -e "s#@KAFKA@#$LOCAL_KAFKA#g" -e "s#@PORT@#$KL_KAFKA_CONNECT_PORT#g" -e "s#@STATE@#$KAFKA_CONNECT_DIR#g" \
      -e "s#@PLUGINS@#$DEBEZIUM_PLUGINS#g" "$KL_HOME/stack/kafka-connect/worker.properties" >"$KAFKA_CONNECT_DIR/worker.properties"
  write_program kafka-connect 25 TERM 60 true "java -Xms128m -Xmx512m -XX:+UseSerialGC -cp $KAFKA_CONNECT_LIBS/* \
-Dlog4j2.configurationFile=$KL_HOME/stack/kafka-connect/log4j2.properties -Dkafka.logs.dir=$LOGS \
-Djava.security.auth.login.config=$KAFKA_CONNECT_DIR/rest-jaas.conf \
org.apache.kafka.connect.cli.ConnectStandalone $KAFKA_CONNECT_DIR/worker.properties"
  apply_programs
  if running kafka-connect; then say "kafka connect: already running (pid $(service_pid kafka-connect))"; return; fi
  port_open "$KL_KAFKA_CONNECT_PORT" && die "port $KL_KAFKA_CONNECT_PORT is taken (another Kafka Connect?): stop it or set KL_KAFKA_CONNECT_PORT"
  start_and_await kafka-connect "Kafka Connect" 120 kafka_connect_ready
  say "kafka connect: $LOCAL_KAFKA_CONNECT (user $KL_KAFKA_CONNECT_USER, password KL_KAFKA_CONNECT_PASSWORD in $KL_SECRETS), Debezium's PostgreSQL connector on its plugin path (pid $(service_pid kafka-connect), log $LOGS/kafka-connect.log)"
}

# --- Monitoring: kafka-ledger's Prometheus endpoint, and a Prometheus scraping it ----------------------------------
MONITORING_DIR=$KL_STATE/prometheus
LOCAL_METRICS=http://127.0.0.1:$KL_METRICS_PORT/metrics
LOCAL_PROMETHEUS=http://127.0.0.1:$KL_PROMETHEUS_PORT

# The endpoint asks each scrape for its bearer token (KAFKA_LEDGER_METRICS_TOKEN, from the environment: on no command
# line); Prometheus reads it from a file of the stack, and its own UI and API ask for basic auth (a bcrypt hash of
# KL_PROMETHEUS_PASSWORD in its web config).
start_monitoring() {
  [ -x "$PROMETHEUS" ] || die "no Prometheus in $PROMETHEUS_DIR: run scripts/stack.sh install"
  mkdir -p "$MONITORING_DIR/data"; chmod 700 "$MONITORING_DIR"
  (umask 077; printf '%s' "$KAFKA_LEDGER_METRICS_TOKEN" >"$MONITORING_DIR/metrics-token"
   printf 'basic_auth_users:\n  %s: %s\n' "$KL_PROMETHEUS_USER" \
     "$("$KL_VENV/bin/python" -c 'import bcrypt, os; print(bcrypt.hashpw(os.environ["KL_PROMETHEUS_PASSWORD"].encode(), bcrypt.gensalt(10)).decode())')" \
     >"$MONITORING_DIR/web.yml")
  sed -e "s#@METRICS@#127.0.0.1:$KL_METRICS_PORT#g" -e "s#@STATE@#$MONITORING_DIR#g" -e "s#@HOME@#$KL_HOME#g" \
    "$KL_HOME/stack/prometheus/prometheus.yml" >"$MONITORING_DIR/prometheus.yml"
  # Its token in the program's section (a file only this user reads), for a supervisord started before it existed.
  write_program metrics 40 TERM 10 false "$KL_VENV/bin/kafka-ledger metrics serve --listen 127.0.0.1:$KL_METRICS_PORT" \
    "environment=KAFKA_LEDGER_METRICS_TOKEN=\"$KAFKA_LEDGER_METRICS_TOKEN\""
  write_program prometheus 41 TERM 30 false "$PROMETHEUS --config.file=$MONITORING_DIR/prometheus.yml \
--web.config.file=$MONITORING_DIR/web.yml --web.listen-address=127.0.0.1:$KL_PROMETHEUS_PORT \
--storage.tsdb.path=$MONITORING_DIR/data --storage.tsdb.retention.time=7d"
  apply_programs
  if running metrics; then say "metrics: already running (pid $(service_pid metrics))"
  else
    port_open "$KL_METRICS_PORT" && die "port $KL_METRICS_PORT is taken (another metrics endpoint?): stop it or set KL_METRICS_PORT"
    start_and_await metrics "the metrics endpoint" 60 curl -sf -o /dev/null -H "Authorization: Bearer $KAFKA_LEDGER_METRICS_TOKEN" "$LOCAL_METRICS"
  fi
  say "metrics: $LOCAL_METRICS (bearer token KAFKA_LEDGER_METRICS_TOKEN; pid $(service_pid metrics), log $LOGS/metrics.log)"
  if running prometheus; then say "prometheus: already running (pid $(service_pid prometheus))"
  else
    port_open "$KL_PROMETHEUS_PORT" && die "port $KL_PROMETHEUS_PORT is taken (another Prometheus?): stop it or set KL_PROMETHEUS_PORT"
    start_and_await prometheus Prometheus 60 curl -sf -o /dev/null -u "$KL_PROMETHEUS_USER:$KL_PROMETHEUS_PASSWORD" "$LOCAL_PROMETHEUS/-/ready"
  fi
  say "prometheus: $LOCAL_PROMETHEUS (user $KL_PROMETHEUS_USER, password KL_PROMETHEUS_PASSWORD in $KL_SECRETS), scraping the metrics every 5 s (pid $(service_pid prometheus), log $LOGS/prometheus.log)"
}

# --- An OpenTelemetry Collector (the trace tests' OTLP receiver) -------------------------------------------------
OTEL_BUILDER_VERSION=v0.165.0
OTEL_COLLECTOR=$KL_CACHE/otel-collector/kafka-ledger-otelcol

install_otel_collector() {
  local key; key=$(hash_files "$KL_HOME/stack/otel-collector/manifest.yaml")
  if stamp_ok otel-collector "$key" && [ -x "$OTEL_COLLECTOR" ]; then return; fi
  command -v go >/dev/null || die "Go is needed to build the OpenTelemetry Collector (the trace tests' receiver)"
  say "building an OpenTelemetry Collector (OTLP receiver, debug exporter) with its builder $OTEL_BUILDER_VERSION"
  local out; out=$(mktemp -d)
  { GOBIN=$out go install "go.opentelemetry.io/collector/cmd/builder@$OTEL_BUILDER_VERSION" \
      && sed "s#^dist:#dist:\n  output_path: $KL_CACHE/otel-collector#" "$KL_HOME/stack/otel-collector/manifest.yaml" >"$out/manifest.yaml" \
      && "$out/builder" --config "$out/manifest.yaml"; } >"$LOGS/otel-collector-build.log" 2>&1 \
    || { tail -n 20 "$LOGS/otel-collector-build.log" >&2; die "building the OpenTelemetry Collector failed (log: $LOGS/otel-collector-build.log)"; }
  rm -rf "$out"
  stamp_set otel-collector "$key"
}

start_tool() {  # start_tool <program> <priority> <what> <port variable> <command>: a test tool on one loopback port;
  # fails (1) when it was running already, saying so
  local name=$1 priority=$2 what=$3 port_variable=$4 command=$5; local port=${!port_variable}
  write_program "$name" "$priority" TERM 10 false "$command"
  apply_programs
  if running "$name"; then say "$name: already running (pid $(service_pid "$name"))"; return 1; fi
  port_open "$port" && die "port $port is taken: stop what holds it or set $port_variable"
  start_and_await "$name" "$what" 60 port_open "$port"
}

start_otel_collector() {
  install_otel_collector
  mkdir -p "$KL_STATE/otel-collector"
  sed "s#@PORT@#$KL_OTLP_PORT#g" "$KL_HOME/stack/otel-collector/config.yaml" >"$KL_STATE/otel-collector/config.yaml"
  start_tool otel-collector 42 "the OpenTelemetry Collector" KL_OTLP_PORT \
    "$OTEL_COLLECTOR --config $KL_STATE/otel-collector/config.yaml" || return 0
  say "otel collector: OTLP over HTTP on http://127.0.0.1:$KL_OTLP_PORT (OTEL_EXPORTER_OTLP_ENDPOINT), spans in $LOGS/otel-collector.log (pid $(service_pid otel-collector))"
}

# --- A mock Kubernetes API server (the tests of a driver in cluster deploy mode on Kubernetes) -------------------
KUBERNETES_MOCK=$KL_CACHE/kubernetes-mock

install_kubernetes_mock() {
  local key; key=$(hash_files "$KL_HOME/stack/maven/kubernetes-mock/pom.xml" "$KL_HOME/stack/kubernetes-mock/MockKubeServer.java")
  if stamp_ok kubernetes-mock "$key" && [ -f "$KUBERNETES_MOCK/classes/MockKubeServer.class" ]; then return; fi
  say "fetching and building the mock Kubernetes API server (fabric8 kubernetes-server-mock, from Maven Central)"
  rm -rf "$KUBERNETES_MOCK"; mkdir -p "$KUBERNETES_MOCK/classes"
  mvn_copy "$KL_HOME/stack/maven/kubernetes-mock" "$KUBERNETES_MOCK/lib"
  javac -nowarn -cp "$KUBERNETES_MOCK/lib/*" -d "$KUBERNETES_MOCK/classes" "$KL_HOME/stack/kubernetes-mock/MockKubeServer.java" \
    >"$LOGS/kubernetes-mock-build.log" 2>&1 || { tail -n 20 "$LOGS/kubernetes-mock-build.log" >&2; die "compiling the mock Kubernetes API server failed"; }
  stamp_set kubernetes-mock "$key"
}

start_kubernetes_mock() {
  install_kubernetes_mock
  start_tool kubernetes-mock 43 "the mock Kubernetes API server" KL_KUBERNETES_MOCK_PORT \
    "java -Xmx256m -Dslf4j.internal.verbosity=ERROR -cp $KUBERNETES_MOCK/classes:$KUBERNETES_MOCK/lib/* MockKubeServer $KL_KUBERNETES_MOCK_PORT" \
    || return 0
  say "kubernetes mock: k8s://http://127.0.0.1:$KL_KUBERNETES_MOCK_PORT (pid $(service_pid kubernetes-mock), log $LOGS/kubernetes-mock.log)"
}

# --- Toxiproxy (the fault campaign's network faults) ----------------------------------------------------
TOXIPROXY_VERSION=v2.5.0
TOXIPROXY=$KL_CACHE/bin/toxiproxy-server

install_toxiproxy() {
  if stamp_ok toxiproxy "$TOXIPROXY_VERSION" && [ -x "$TOXIPROXY" ]; then return; fi
  command -v go >/dev/null || die "Go is needed to build Toxiproxy (the fault campaign's network faults)"
  say "building Toxiproxy $TOXIPROXY_VERSION from the Go module proxy"
  local out; out=$(mktemp -d)
  GOBIN=$out go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >"$LOGS/toxiproxy-build.log" 2>&1 \
    || { tail -n 20 "$LOGS/toxiproxy-build.log" >&2; die "go install of Toxiproxy failed (log: $LOGS/toxiproxy-build.log)"; }
  mkdir -p "$(dirname "$TOXIPROXY")"; mv "$out/server" "$TOXIPROXY"; rm -rf "$out"
  stamp_set toxiproxy "$TOXIPROXY_VERSION"
}

# One proxy per service, each on loopback in front of the service's own port (Kafka: its PROXIED listeners).
start_proxies() {
  install_toxiproxy
  cat >"$RUN/toxiproxy.json" <<JSON
[
  {"name": "kafka", "listen": "127.0.0.1:$KL_KAFKA_PROXY_PORT", "upstream": "127.0.0.1:$KL_KAFKA_PROXIED_PORT"},
  {"name": "kafka-sasl", "listen": "127.0.0.1:$KL_KAFKA_SASL_PROXY_PORT", "upstream": "127.0.0.1:$KL_KAFKA_SASL_PROXIED_PORT"},
  {"name": "postgres", "listen": "127.0.0.1:$KL_PG_PROXY_PORT", "upstream": "127.0.0.1:$KL_PG_PORT"},
  {"name": "spark-connect", "listen": "127.0.0.1:$KL_SPARK_CONNECT_PROXY_PORT", "upstream": "127.0.0.1:$KL_SPARK_CONNECT_PORT"},
  {"name": "schema-registry", "listen": "127.0.0.1:$KL_SCHEMA_REGISTRY_PROXY_PORT", "upstream": "127.0.0.1:$KL_SCHEMA_REGISTRY_PORT"}
]
JSON
  write_program toxiproxy 10 TERM 10 true "$TOXIPROXY -host 127.0.0.1 -port $KL_TOXIPROXY_PORT -config $RUN/toxiproxy.json"
  apply_programs
  if running toxiproxy; then say "toxiproxy: already running (pid $(service_pid toxiproxy))"; return; fi
  port_open "$KL_TOXIPROXY_PORT" && die "port $KL_TOXIPROXY_PORT is taken (another Toxiproxy?): stop it or set KL_TOXIPROXY_PORT"
  start_and_await toxiproxy toxiproxy 30 port_open "$KL_TOXIPROXY_PORT"
  say "toxiproxy: API on 127.0.0.1:$KL_TOXIPROXY_PORT; Kafka through 127.0.0.1:$KL_KAFKA_PROXY_PORT (SASL_SSL $KL_KAFKA_SASL_PROXY_PORT), Postgres $KL_PG_PROXY_PORT, Spark Connect $KL_SPARK_CONNECT_PROXY_PORT, the schema registry $KL_SCHEMA_REGISTRY_PROXY_PORT (log $LOGS/toxiproxy.log)"
}

# SIGKILL of a service's whole process group (the JVM and whatever it started), as a crash or a lost machine
# would look; gone once the process has exited and, if it had one, its port is free again.
kill_service() {  # kill_service <program> <what> [port]
  local pid i; pid=$(service_pid "$1") || return 0
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"
  for i in $(seq 1 100); do
    if ! kill -0 "$pid" 2>/dev/null && ! running "$1" && { [ -z "${3:-}" ] || ! port_open "$3"; }; then break; fi
    sleep 0.1
  done
  say "$2: killed"
}

# --- Spark settings and the standalone cluster ------------------------------------------------------
# spark-defaults.conf for every Spark process the stack runs: RPC authenticated by a shared secret (a
# master that anyone could submit to runs anyone's code), drivers on loopback, UIs without kill buttons.
# Only while Spark is this machine's (local[*] or the stack's cluster): an external cluster has its own
# secret, and its executors must reach the driver at an address other than loopback.
write_spark_conf() {
  [ "$SPARK_CONF_DIR" = "$KL_STATE/spark-conf" ] || return 0  # a deployment's own folder is left alone
  mkdir -p "$SPARK_CONF_DIR"
  # Spark on this machine runs the venv's Python, where kafka-ledger is installed: its Python daemon forks workers
  # with pyarrow and pandas loaded (kafka_ledger/spark/python_daemon.py).
  if [ "$KL_SPARK_ON_THIS_MACHINE" = 1 ]; then
    (umask 077; cat >"$SPARK_CONF_DIR/spark-defaults.conf.tmp" <<CONF
spark.authenticate                 true
spark.authenticate.secret          $KL_SPARK_AUTH_SECRET
spark.driver.bindAddress           127.0.0.1
spark.driver.host                  127.0.0.1
spark.ui.killEnabled               false
spark.python.daemon.module         kafka_ledger.spark.python_daemon
CONF
    )
  else
    (umask 077; printf '# external Spark master %s: its settings are the deployment'"'"'s (SPARK_CONF_DIR)\n' \
      "$KAFKA_LEDGER_SPARK_MASTER" >"$SPARK_CONF_DIR/spark-defaults.conf.tmp")
  fi
  # The lake's catalog, for every Spark process and for kafka-ledger's reader of it (kafka_ledger.sinks.iceberg.catalogs): in this
  # file, so its password is on no command line. Over TLS, like the ledger. A restarted Postgres ends the catalog's
  # pooled connections (SQLSTATE 57P01-57P03): the pool reconnects and retries rather than failing the next batch.
  [ "$KL_LOCAL_POSTGRES" = 1 ] && cat >>"$SPARK_CONF_DIR/spark-defaults.conf.tmp" <<CONF
spark.sql.catalog.lake                     org.apache.iceberg.spark.SparkCatalog
spark.sql.catalog.lake.type                jdbc
spark.sql.catalog.lake.uri                 jdbc:postgresql://127.0.0.1:$KL_PG_PORT/lake?sslmode=verify-full&sslrootcert=$KL_TLS_DIR/ca.pem
spark.sql.catalog.lake.jdbc.user           lake
spark.sql.catalog.lake.jdbc.password       $KL_PG_LAKE_PASSWORD
spark.sql.catalog.lake.jdbc.schema-version V1
spark.sql.catalog.lake.warehouse           file://$KL_LAKE_DIR
spark.sql.catalog.lake.cache-enabled       false
spark.sql.catalog.lake.retryable_status_codes 57P01,57P02,57P03
CONF
  mkdir -p "$KL_LAKE_DIR"
  mv "$SPARK_CONF_DIR/spark-defaults.conf.tmp" "$SPARK_CONF_DIR/spark-defaults.conf"
}

# A daemon from PySpark's own distribution (spark-class), bound to loopback, its UI too (SPARK_LOCAL_IP).
write_spark_daemon() {  # write_spark_daemon <program> <priority> <more environment, ",NAME=\"value\"" or ""> <class> <args...>
  local name=$1 priority=$2 environment=$3; shift 3
  write_program "$name" "$priority" TERM 30 true "$KL_VENV/bin/spark-class $*" \
    "environment=SPARK_LOCAL_IP=\"127.0.0.1\",SPARK_NO_DAEMONIZE=\"1\"$environment"
}

# Each application leaves a folder in the worker's work folder: every executor's copy of the jars (about 57 MB) and
# a cluster-mode driver's output. A `submit` batch is an application: without cleaning, the disk fills. The
# worker deletes a finished application's folder once nothing in it is newer than an hour (looked at every 10
# minutes): time to read a failed driver's output. docker-compose.yaml's worker has the same.
SPARK_WORKER_CLEANUP="-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 -Dspark.worker.cleanup.appDataTtl=3600"

start_cluster() {
  write_spark_conf
  write_spark_daemon spark-master 30 "" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$KL_SPARK_MASTER_PORT" --webui-port "$KL_SPARK_MASTER_UI_PORT"
  write_spark_daemon spark-worker 31 ",SPARK_WORKER_OPTS=\"$SPARK_WORKER_CLEANUP\"" \
    org.apache.spark.deploy.worker.Worker "$KL_SPARK_CLUSTER_MASTER" \
    --host 127.0.0.1 --cores "$KL_SPARK_WORKER_CORES" --memory "$KL_SPARK_WORKER_MEMORY" \
    --webui-port "$KL_SPARK_WORKER_UI_PORT" --work-dir "$KL_STATE/spark-work"
  apply_programs
  if running spark-master; then say "spark-master: already running (pid $(service_pid spark-master))"
  else start_and_await spark-master "the Spark master" 60 port_open "$KL_SPARK_MASTER_PORT"; fi
  if running spark-worker; then say "spark-worker: already running (pid $(service_pid spark-worker))"
  else
    # A new worker registers again: wait for its own registration, not an earlier worker's line in the log.
    : >"$LOGS/spark-worker.log"
    start_and_await spark-worker "the Spark worker" 60 grep -qs "Successfully registered with master" "$LOGS/spark-worker.log"
  fi
  say "spark cluster: master $KL_SPARK_CLUSTER_MASTER (UI http://127.0.0.1:$KL_SPARK_MASTER_UI_PORT), one worker ($KL_SPARK_WORKER_CORES cores, $KL_SPARK_WORKER_MEMORY)"
}

# The local cluster is started with the rest when Spark is pointed at it.
start_cluster_if_used() { [ "$KAFKA_LEDGER_SPARK_MASTER" != "$KL_SPARK_CLUSTER_MASTER" ] || start_cluster; }

# --- Airflow + ledger migrations -------------------------------------------------------------------
migrate() {
  create_databases
  say "ledger: applying migrations"
  "$KL_VENV/bin/python" -m kafka_ledger.ledger.migrations
  local key; key=$(printf '%s|%s|%s' "$("$KL_VENV/bin/python" -c 'import airflow; print(airflow.__version__)')" "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" "$KL_SPARK_SLOTS" | sha256sum | cut -c1-16)
  if ! stamp_ok airflow-db "$key"; then
    say "airflow: migrating the metadata database"
    mkdir -p "$AIRFLOW_HOME"
    "$KL_VENV/bin/airflow" db migrate >"$LOGS/airflow-migrate.log" 2>&1 || { tail -n 30 "$LOGS/airflow-migrate.log" >&2; die "airflow db migrate failed"; }
    "$KL_VENV/bin/airflow" pools set kafka_ledger_spark "$KL_SPARK_SLOTS" "$KL_SPARK_POOL_DESCRIPTION" >>"$LOGS/airflow-migrate.log" 2>&1
    stamp_set airflow-db "$key"
  fi
}

# Airflow's components, as scripts/airflow.sh runs them (the one list of them, shared with the tests'
# dedicated Airflow); stopping the program stops its whole process group.
start_airflow() {
  # KL_AIRFLOW_EDGE_WORKERS (0: the LocalExecutor) in the program's own section: a start asking for another number
  # restarts Airflow with it.
  write_program airflow 50 TERM 60 true "bash $KL_HOME/scripts/airflow.sh" \
    "environment=KL_AIRFLOW_EDGE_WORKERS=\"${KL_AIRFLOW_EDGE_WORKERS:-0}\""
  apply_programs
  if running airflow; then say "airflow: already running (pid $(service_pid airflow))"; return; fi
  start_and_await airflow airflow 120 curl -sf -o /dev/null "http://127.0.0.1:$KL_AIRFLOW_PORT/api/v2/monitor/health"
  say "airflow: UI and REST API on http://127.0.0.1:$KL_AIRFLOW_PORT (user admin, password in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated; log $LOGS/airflow.log)"
  if (( ${KL_AIRFLOW_EDGE_WORKERS:-0} > 0 )); then
    say "airflow: the Edge executor, $KL_AIRFLOW_EDGE_WORKERS workers (kafka-ledger-edge-1..$KL_AIRFLOW_EDGE_WORKERS)"
  fi
}

status() {
  if ! sctl pid >/dev/null 2>&1; then echo "supervisord down: nothing of the stack runs (scripts/stack.sh up)"; return; fi
  line() { if running "$1"; then printf '%-16s up    %s  pid %s\n' "$1" "$2" "$(service_pid "$1")"; else printf '%-16s down\n' "$1"; fi; }
  line postgres "127.0.0.1:$KL_PG_PORT  data $PG_DATA  log $PG_LOG"
  line kafka "$LOCAL_KAFKA (SASL_SSL 127.0.0.1:$KL_KAFKA_SASL_PORT)  log $LOGS/kafka.log"
  line spark-connect "sc://127.0.0.1:$KL_SPARK_CONNECT_PORT  log $LOGS/spark-connect.log"
  line spark-master "$KL_SPARK_CLUSTER_MASTER  (scripts/stack.sh cluster)"
  line spark-worker "$KL_SPARK_WORKER_CORES cores, $KL_SPARK_WORKER_MEMORY"
  line schema-registry "$LOCAL_SCHEMA_REGISTRY  log $LOGS/schema-registry.log"
  line kafka-connect "$LOCAL_KAFKA_CONNECT  (scripts/stack.sh kafka-connect)  log $LOGS/kafka-connect.log"
  line airflow "http://127.0.0.1:$KL_AIRFLOW_PORT  log $LOGS/airflow.log"
  line metrics "$LOCAL_METRICS  (scripts/stack.sh monitoring)  log $LOGS/metrics.log"
  line prometheus "$LOCAL_PROMETHEUS  log $LOGS/prometheus.log"
  line otel-collector "http://127.0.0.1:$KL_OTLP_PORT  (scripts/stack.sh otel-collector)  log $LOGS/otel-collector.log"
  line kubernetes-mock "k8s://http://127.0.0.1:$KL_KUBERNETES_MOCK_PORT  (scripts/stack.sh kubernetes-mock)  log $LOGS/kubernetes-mock.log"
  line toxiproxy "API 127.0.0.1:$KL_TOXIPROXY_PORT  (scripts/stack.sh proxies)"
}

stop_all() {
  sctl pid >/dev/null 2>&1 || return 0
  # In reverse order of priority: Airflow and Spark first, the databases last.
  sctl stop all >/dev/null
  sctl shutdown >/dev/null
  local i; for i in $(seq 1 100); do [ -S "$RUN/supervisor.sock" ] && sctl pid >/dev/null 2>&1 || break; sleep 0.2; done
  say "stopped every service and supervisord"
}

case "${1:-}" in
  install) install ;;
  browser) install_browser ;;
  start) ensure_supervisord; start_postgres; start_kafka; start_schema_registry; start_cluster_if_used; start_spark_connect ;;
  migrate) migrate ;;
  up) install; ensure_supervisord; start_postgres; start_kafka; start_schema_registry; start_cluster_if_used; migrate
      start_spark_connect ;;
  airflow) ensure_supervisord; start_airflow ;;
  stop-airflow) ensure_supervisord; stop_service airflow airflow ;;
  restart-postgres) ensure_supervisord; stop_service postgres postgres; start_postgres ;;
  restart-kafka) ensure_supervisord; stop_service kafka kafka; start_kafka ;;
  restart-spark-connect) ensure_supervisord; stop_service spark-connect "spark connect"; start_spark_connect ;;
  stop-spark-connect) ensure_supervisord; stop_service spark-connect "spark connect" ;;
  kill-spark-connect) ensure_supervisord; kill_service spark-connect "spark connect" "$KL_SPARK_CONNECT_PORT" ;;
  restart-schema-registry) ensure_supervisord; stop_service schema-registry "schema registry"; start_schema_registry ;;
  kill-schema-registry) ensure_supervisord; kill_service schema-registry "schema registry" "$KL_SCHEMA_REGISTRY_PORT" ;;
  cluster) ensure_supervisord; start_cluster ;;
  stop-cluster) ensure_supervisord; stop_service spark-worker "spark worker"; stop_service spark-master "spark master" ;;
  kill-spark-worker) ensure_supervisord; kill_service spark-worker "spark worker" ;;
  kafka-connect) ensure_supervisord; start_kafka_connect ;;
  stop-kafka-connect) ensure_supervisord; stop_service kafka-connect "kafka connect" ;;
  monitoring) ensure_supervisord; start_monitoring ;;
  stop-monitoring) ensure_supervisord; stop_service prometheus prometheus; stop_service metrics metrics ;;
  otel-collector) ensure_supervisord; start_otel_collector ;;
  install-otel-collector) install_otel_collector ;;
  kubernetes-mock) ensure_supervisord; start_kubernetes_mock ;;
  install-kubernetes-mock) install_kubernetes_mock ;;
  stop-kubernetes-mock) ensure_supervisord; stop_service kubernetes-mock "kubernetes mock" ;;
  stop-otel-collector) ensure_supervisord; stop_service otel-collector "otel collector" ;;
  proxies) ensure_supervisord; start_proxies ;;
  stop-proxies) ensure_supervisord; stop_service toxiproxy toxiproxy ;;
  stop) stop_all ;;
  status) status ;;
  ctl) shift; sctl "$@" ;;
  *) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
