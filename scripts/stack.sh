#!/usr/bin/env bash
# The local kafka-ledger stack: install, start, stop and inspect Kafka (KRaft), PostgreSQL, the Spark Connect
# server and Airflow.
#
#   scripts/stack.sh up         install what is missing, start Kafka + Postgres + Spark Connect, migrate both databases
#   scripts/stack.sh install    OS packages, Python venv, Kafka broker jars, Spark connector jars
#   scripts/stack.sh browser    Debian's chromium and chromium-driver, for the browser test (scripts/test.sh runs it)
#   scripts/stack.sh start      start Kafka, Postgres and the Spark Connect server (idempotent) and wait for them
#   scripts/stack.sh migrate    create roles/databases, run the ledger migrations and `airflow db migrate`
#   scripts/stack.sh airflow    start Airflow (api-server, scheduler, dag-processor, triggerer) on KL_AIRFLOW_PORT
#   scripts/stack.sh stop       stop everything this script started
#   scripts/stack.sh status     one line per service
#   scripts/stack.sh restart-postgres | restart-kafka | restart-spark-connect
#                               stop and start one service (the fault campaign uses them)
#   scripts/stack.sh kill-spark-connect   SIGKILL the Spark Connect server (the fault campaign's crash)
#   scripts/stack.sh cluster    start a Spark standalone master and worker on loopback (KL_SPARK_CLUSTER_MASTER);
#                               pipelines use it with KAFKA_LEDGER_SPARK_MASTER=spark://127.0.0.1:17077
#   scripts/stack.sh stop-cluster | kill-spark-worker   stop the cluster; SIGKILL the worker and its executors
#
# Everything lives under $KL_STATE (.stack/ by default): data, logs, pid files and downloaded jars.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

LOGS=$KL_STATE/logs
RUN=$KL_STATE/run
STAMPS=$KL_STATE/stamps
KAFKA_LIBS=$KL_KAFKA_LIBS
mkdir -p "$LOGS" "$RUN" "$STAMPS" "$KL_STATE/cache"

say() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

# A stamp records the hash of the inputs of a step, so a second run skips work that is already done.
stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { printf '%s' "$2" >"$STAMPS/$1"; }
hash_files() { cat "$@" | sha256sum | cut -c1-16; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Wait until a service just started answers: `probe` succeeds within `seconds`, else its log and a clear end.
await_start() {  # await_start <name> <pidfile> <seconds> <log> <probe command...>
  local name=$1 pidfile=$2 seconds=$3 log=$4 i; shift 4
  for i in $(seq 1 "$seconds"); do
    "$@" && return 0
    pid_alive "$pidfile" || { tail -n 30 "$log" >&2; die "$name exited during start (log: $log)"; }
    sleep 1
  done
  tail -n 30 "$log" >&2; die "$name did not answer within $seconds s (log: $log)"
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
PG_LOG=$PG_DIR/postgres.log

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
  key=$(hash_files "$KL_HOME/stack/maven/spark-jars/pom.xml" "$KL_HOME/requirements.lock")
  if ! stamp_ok spark-jars "$key"; then
    say "resolving the Spark Kafka connector and the Postgres JDBC driver from Maven Central"
    tmp=$(mktemp -d); mvn_copy "$KL_HOME/stack/maven/spark-jars" "$tmp"
    pyspark_jars=$("$KL_VENV/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
    rm -rf "$KAFKA_LEDGER_SPARK_JARS_DIR"; mkdir -p "$KAFKA_LEDGER_SPARK_JARS_DIR"
    # Only the jars PySpark lacks: a second copy of a jar at another version breaks the classpath.
    for jar in "$tmp"/*.jar; do
      artifact=$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$//')
      compgen -G "$pyspark_jars/$artifact-[0-9]*.jar" >/dev/null || cp "$jar" "$KAFKA_LEDGER_SPARK_JARS_DIR/"
    done
    rm -rf "$tmp"
    stamp_set spark-jars "$key"
  fi
}

install() { install_os_packages; install_python; install_jars; }

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
  if pg_ready; then
    [ -f "$PG_DATA/postmaster.pid" ] || die "port $KL_PG_PORT is taken by another Postgres (not the one in $PG_DATA): stop it or set KL_PG_PORT"
    say "postgres: already running on 127.0.0.1:$KL_PG_PORT"; return
  fi
  make_tls
  # TLS with the stack's certificate; its key and the access rules live beside the cluster, owned by its user
  # (the key must be, and that user may not reach $KL_TLS_DIR). Rewritten on every start: older clusters too.
  cp "$KL_TLS_DIR/postgres.pem" "$PG_DIR/server.pem"; cp "$KL_TLS_DIR/postgres.key" "$PG_DIR/server.key"
  cp "$KL_HOME/stack/postgres/pg_hba.conf" "$PG_DIR/pg_hba.conf"
  chmod 600 "$PG_DIR/server.key"
  [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR/server.pem" "$PG_DIR/server.key" "$PG_DIR/pg_hba.conf"
  as_pg "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 start \
    -o "-c listen_addresses=127.0.0.1 -p $KL_PG_PORT -c unix_socket_directories='' -c max_connections=200 -c shared_buffers=256MB -c fsync=on -c ssl=on -c ssl_cert_file=$PG_DIR/server.pem -c ssl_key_file=$PG_DIR/server.key -c hba_file=$PG_DIR/pg_hba.conf" >/dev/null \
    || { tail -n 20 "$PG_LOG" >&2; die "postgres did not start (log: $PG_LOG)"; }
  say "postgres: started on 127.0.0.1:$KL_PG_PORT (TLS; the ledger role over TLS only, CA $KL_TLS_DIR/ca.pem)"
}

stop_postgres() {
  [ -f "$PG_DATA/postmaster.pid" ] || return 0
  as_pg "$(pg_bin)/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null && say "postgres: stopped"
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
  say "creating roles and databases (kafka_ledger, airflow, airflow_test)"
  local name password
  for name in kafka_ledger airflow airflow_test; do
    case $name in
      kafka_ledger) password=$KL_PG_LEDGER_PASSWORD ;;
      airflow) password=$KL_PG_AIRFLOW_PASSWORD ;;
      airflow_test) password=$KL_PG_AIRFLOW_TEST_PASSWORD ;;
    esac
    psql_super -d postgres <<SQL
DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$name') THEN CREATE ROLE $name LOGIN; END IF; END \$\$;
ALTER ROLE $name PASSWORD '$password';
SQL
    psql_super -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$name'" | grep -q 1 \
      || psql_super -d postgres -c "CREATE DATABASE $name OWNER $name"
  done
  stamp_set databases "$key"
}

# --- Kafka -----------------------------------------------------------------------------------------
KAFKA_DIR=$KL_STATE/kafka
KAFKA_PID=$RUN/kafka.pid
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
# listener and Postgres. Made once; passwords reach openssl in its environment, never its command line.
make_tls() {
  local d=$KL_TLS_DIR
  [ -f "$d/ca.pem" ] && [ -f "$d/broker.p12" ] && [ -f "$d/postgres.pem" ] && return 0
  say "tls: making the local CA and the certificates of Kafka and Postgres in $d"
  mkdir -p "$d"; chmod 700 "$d"
  sign() {  # sign <name>: a key and a certificate for this host, signed by the CA
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$d/$1.key" -out "$d/$1.csr" &&
    openssl x509 -req -in "$d/$1.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
      -extfile "$d/host.ext" -out "$d/$1.pem" && rm -f "$d/$1.csr"
  }
  {
    { [ -f "$d/ca.pem" ] || openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kafka-ledger local CA" \
        -keyout "$d/ca.key" -out "$d/ca.pem"; } &&
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/host.ext" &&
    sign broker && sign postgres &&
    KL_P12_PASSWORD=$KL_KAFKA_KEYSTORE_PASSWORD openssl pkcs12 -export -in "$d/broker.pem" -inkey "$d/broker.key" \
      -certfile "$d/ca.pem" -name broker -passout env:KL_P12_PASSWORD -out "$d/broker.p12.tmp" &&
    mv "$d/broker.p12.tmp" "$d/broker.p12"
  } >"$LOGS/tls.log" 2>&1 || { cat "$LOGS/tls.log" >&2; die "making the TLS certificates failed"; }
  rm -f "$d/host.ext"
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
  if pid_alive "$KAFKA_PID"; then say "kafka: already running (pid $(cat "$KAFKA_PID"))"; return; fi
  kafka_ready && die "another Kafka already answers on $LOCAL_KAFKA: stop it or set KL_KAFKA_PORT"
  compgen -G "$KAFKA_LIBS/kafka_*.jar" >/dev/null || die "no Kafka broker jars in $KAFKA_LIBS: run scripts/stack.sh install"
  mkdir -p "$KAFKA_DIR"
  make_tls
  # Holds the key store's password: readable by us only.
  (umask 077; sed -e "s#@KAFKA_PORT@#$KL_KAFKA_PORT#g" -e "s#@CONTROLLER_PORT@#$KL_KAFKA_CONTROLLER_PORT#g" \
      -e "s#@SASL_PORT@#$KL_KAFKA_SASL_PORT#g" -e "s#@TLS_DIR@#$KL_TLS_DIR#g" \
      -e "s#@KEYSTORE_PASSWORD@#$KL_KAFKA_KEYSTORE_PASSWORD#g" \
      -e "s#@DATA_DIR@#$KAFKA_DIR/data#g" "$KL_HOME/stack/kafka/server.properties" >"$KAFKA_DIR/server.properties")
  chmod 600 "$KAFKA_DIR/server.properties"
  if [ ! -f "$KAFKA_DIR/data/meta.properties" ]; then
    say "formatting Kafka storage (KRaft, standalone controller)"
    local cluster_id; cluster_id=$("${KAFKA_JAVA[@]}" kafka.tools.StorageTool random-uuid)
    "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$KAFKA_DIR/server.properties" >"$LOGS/kafka-format.log" 2>&1 \
      || { cat "$LOGS/kafka-format.log" >&2; die "Kafka storage format failed"; }
  fi
  nohup "${KAFKA_JAVA[@]}" kafka.Kafka "$KAFKA_DIR/server.properties" >"$LOGS/kafka.out" 2>&1 &
  echo $! >"$KAFKA_PID"
  await_start kafka "$KAFKA_PID" 90 "$LOGS/kafka.out" kafka_ready
  add_kafka_scram_user
  say "kafka: started on $LOCAL_KAFKA, SASL_SSL on 127.0.0.1:$KL_KAFKA_SASL_PORT (user $KL_KAFKA_SASL_USER, CA $KL_TLS_DIR/ca.pem) (pid $(cat "$KAFKA_PID"), log $LOGS/kafka.log)"
}

stop_pidfile() {  # stop_pidfile <name> <pidfile>: SIGTERM (a controlled shutdown for Kafka), then wait
  pid_alive "$2" || { rm -f "$2"; return 0; }
  local pid i; pid=$(cat "$2")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
  for i in $(seq 1 600); do kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  rm -f "$2"; say "$1: stopped"
}

# --- Spark Connect server (the warm Spark runtime) --------------------------------------------------
SPARK_CONNECT_PID=$RUN/spark-connect.pid

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_spark_connect() {
  [ "$KL_LOCAL_SPARK_CONNECT" = 1 ] || { say "spark connect: external (connection spark_connect_default), not started"; return; }
  if pid_alive "$SPARK_CONNECT_PID"; then
    if [ "$(cat "$SPARK_CONNECT_PID.master" 2>/dev/null)" = "$KAFKA_LEDGER_SPARK_MASTER" ]; then
      say "spark connect: already running (pid $(cat "$SPARK_CONNECT_PID"), master $KAFKA_LEDGER_SPARK_MASTER)"; return
    fi
    # Another master than the one asked for: a server left on the wrong one would run the batches there.
    say "spark connect: restarting on master $KAFKA_LEDGER_SPARK_MASTER (was $(cat "$SPARK_CONNECT_PID.master" 2>/dev/null || echo unknown))"
    stop_pidfile "spark connect" "$SPARK_CONNECT_PID"
  fi
  write_spark_conf
  port_open "$KL_SPARK_CONNECT_PORT" && die "port $KL_SPARK_CONNECT_PORT is taken (another Spark Connect server?): stop it or set KL_SPARK_CONNECT_PORT"
  local jars; jars=$(ls "$KAFKA_LEDGER_SPARK_JARS_DIR"/*.jar 2>/dev/null | paste -sd, -)
  [ -n "$jars" ] || die "no Spark connector jars in $KAFKA_LEDGER_SPARK_JARS_DIR: run scripts/stack.sh install"
  # The server's JVM is the driver and, with a local master, the executors: --driver-memory bounds its heap,
  # the -XX limits and MALLOC_ARENA_MAX what it holds beside the heap (direct buffers, code, malloc arenas).
  # Everything binds loopback; -XX:-DontCompileHugeMethods lets the JIT compile the decoder's generated code.
  # On a cluster it holds its executors for good: spark.cores.max leaves the other cores to spark-submit batches.
  MALLOC_ARENA_MAX=2 setsid nohup "$KL_VENV/bin/spark-submit" --class org.apache.spark.sql.connect.service.SparkConnectServer \
    --name kafka-ledger-spark-connect --master "$KAFKA_LEDGER_SPARK_MASTER" --driver-memory "$KL_SPARK_CONNECT_MEMORY" \
    --jars "$jars" \
    --conf spark.connect.grpc.binding.address=127.0.0.1 --conf "spark.connect.grpc.binding.port=$KL_SPARK_CONNECT_PORT" \
    --conf spark.driver.bindAddress=127.0.0.1 --conf spark.driver.host=127.0.0.1 --conf spark.ui.enabled=false \
    --conf spark.sql.session.timeZone=UTC --conf spark.sql.shuffle.partitions=8 \
    --conf "spark.cores.max=$KL_SPARK_CONNECT_CORES" \
    --conf "spark.driver.extraJavaOptions=-XX:-DontCompileHugeMethods -XX:MaxDirectMemorySize=256m -XX:ReservedCodeCacheSize=96m -XX:MaxMetaspaceSize=256m -XX:+UseParallelGC -Duser.timezone=UTC -Dlog4j2.configurationFile=file:$KL_HOME/stack/spark-connect/log4j2.properties" \
    spark-internal >"$LOGS/spark-connect.log" 2>&1 &
  echo $! >"$SPARK_CONNECT_PID"
  printf '%s' "$KAFKA_LEDGER_SPARK_MASTER" >"$SPARK_CONNECT_PID.master"
  await_start "the Spark Connect server" "$SPARK_CONNECT_PID" 120 "$LOGS/spark-connect.log" port_open "$KL_SPARK_CONNECT_PORT"
  say "spark connect: started on sc://127.0.0.1:$KL_SPARK_CONNECT_PORT, master $KAFKA_LEDGER_SPARK_MASTER (pid $(cat "$SPARK_CONNECT_PID"), heap $KL_SPARK_CONNECT_MEMORY, log $LOGS/spark-connect.log)"
}

kill_spark_connect() {  # SIGKILL of the whole server (JVM and its spark-submit wrapper), as a crash would
  pid_alive "$SPARK_CONNECT_PID" || return 0
  local pid i; pid=$(cat "$SPARK_CONNECT_PID")
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"
  # Gone only once the process has exited and its port is free: a start right after must find it so.
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || port_open "$KL_SPARK_CONNECT_PORT" || break
    sleep 0.1
  done
  rm -f "$SPARK_CONNECT_PID"; say "spark connect: killed"
}

# --- Spark settings and the standalone cluster ------------------------------------------------------
# spark-defaults.conf for every Spark process the stack runs: RPC authenticated by a shared secret (a
# master that anyone could submit to runs anyone's code), drivers on loopback, UIs without kill buttons.
# Only while Spark is this machine's (local[*] or the stack's cluster): an external cluster has its own
# secret, and its executors must reach the driver at an address other than loopback.
write_spark_conf() {
  [ "$SPARK_CONF_DIR" = "$KL_STATE/spark-conf" ] || return 0  # a deployment's own folder is left alone
  mkdir -p "$SPARK_CONF_DIR"
  if [ "$KL_SPARK_ON_THIS_MACHINE" = 1 ]; then
    (umask 077; cat >"$SPARK_CONF_DIR/spark-defaults.conf.tmp" <<CONF
spark.authenticate                 true
spark.authenticate.secret          $KL_SPARK_AUTH_SECRET
spark.driver.bindAddress           127.0.0.1
spark.driver.host                  127.0.0.1
spark.ui.killEnabled               false
CONF
    )
  else
    printf '# external Spark master %s: its settings are the deployment'"'"'s (SPARK_CONF_DIR)\n' \
      "$KAFKA_LEDGER_SPARK_MASTER" >"$SPARK_CONF_DIR/spark-defaults.conf.tmp"
  fi
  mv "$SPARK_CONF_DIR/spark-defaults.conf.tmp" "$SPARK_CONF_DIR/spark-defaults.conf"
}

SPARK_MASTER_PID=$RUN/spark-master.pid
SPARK_WORKER_PID=$RUN/spark-worker.pid

# A daemon from PySpark's own distribution (spark-class), bound to loopback, its UI too (SPARK_LOCAL_IP).
start_spark_daemon() {  # start_spark_daemon <name> <pidfile> <class> <args...>
  local name=$1 pidfile=$2; shift 2
  if pid_alive "$pidfile"; then say "$name: already running (pid $(cat "$pidfile"))"; return; fi
  SPARK_LOCAL_IP=127.0.0.1 SPARK_NO_DAEMONIZE=1 setsid nohup "$KL_VENV/bin/spark-class" "$@" \
    >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
}

start_cluster() {
  write_spark_conf
  start_spark_daemon spark-master "$SPARK_MASTER_PID" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$KL_SPARK_MASTER_PORT" --webui-port "$KL_SPARK_MASTER_UI_PORT"
  await_start "the Spark master" "$SPARK_MASTER_PID" 60 "$LOGS/spark-master.log" port_open "$KL_SPARK_MASTER_PORT"
  start_spark_daemon spark-worker "$SPARK_WORKER_PID" org.apache.spark.deploy.worker.Worker "$KL_SPARK_CLUSTER_MASTER" \
    --host 127.0.0.1 --cores "$KL_SPARK_WORKER_CORES" --memory "$KL_SPARK_WORKER_MEMORY" \
    --webui-port "$KL_SPARK_WORKER_UI_PORT" --work-dir "$KL_STATE/spark-work"
  await_start "the Spark worker" "$SPARK_WORKER_PID" 60 "$LOGS/spark-worker.log" \
    grep -qs "Successfully registered with master" "$LOGS/spark-worker.log"
  say "spark cluster: master $KL_SPARK_CLUSTER_MASTER (UI http://127.0.0.1:$KL_SPARK_MASTER_UI_PORT), one worker ($KL_SPARK_WORKER_CORES cores, $KL_SPARK_WORKER_MEMORY)"
}

# The local cluster is started with the rest when Spark is pointed at it.
start_cluster_if_used() { [ "$KAFKA_LEDGER_SPARK_MASTER" != "$KL_SPARK_CLUSTER_MASTER" ] || start_cluster; }

kill_spark_worker() {  # SIGKILL of the worker and the executors it started, as a lost machine would look
  pid_alive "$SPARK_WORKER_PID" || return 0
  local pid; pid=$(cat "$SPARK_WORKER_PID")
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"
  rm -f "$SPARK_WORKER_PID"; say "spark worker: killed"
}

# --- Airflow + ledger migrations -------------------------------------------------------------------
migrate() {
  create_databases
  say "ledger: applying migrations"
  "$KL_VENV/bin/python" -m kafka_ledger.migrations
  local key; key=$(printf '%s|%s|%s' "$("$KL_VENV/bin/python" -c 'import airflow; print(airflow.__version__)')" "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" "$KL_SPARK_SLOTS" | sha256sum | cut -c1-16)
  if ! stamp_ok airflow-db "$key"; then
    say "airflow: migrating the metadata database"
    mkdir -p "$AIRFLOW_HOME"
    "$KL_VENV/bin/airflow" db migrate >"$LOGS/airflow-migrate.log" 2>&1 || { tail -n 30 "$LOGS/airflow-migrate.log" >&2; die "airflow db migrate failed"; }
    "$KL_VENV/bin/airflow" pools set kafka_ledger_spark "$KL_SPARK_SLOTS" "$KL_SPARK_POOL_DESCRIPTION" >>"$LOGS/airflow-migrate.log" 2>&1
    stamp_set airflow-db "$key"
  fi
}

AIRFLOW_PID=$RUN/airflow.pid
start_airflow() {
  if pid_alive "$AIRFLOW_PID"; then say "airflow: already running (pid $(cat "$AIRFLOW_PID"))"; return; fi
  setsid nohup bash "$KL_HOME/scripts/airflow.sh" >"$LOGS/airflow.log" 2>&1 </dev/null &
  echo $! >"$AIRFLOW_PID"
  await_start airflow "$AIRFLOW_PID" 120 "$LOGS/airflow.log" curl -sf -o /dev/null "http://127.0.0.1:$KL_AIRFLOW_PORT/api/v2/monitor/health"
  say "airflow: UI and REST API on http://127.0.0.1:$KL_AIRFLOW_PORT (user admin, password in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
}

status() {
  if pg_ready 2>/dev/null; then echo "postgres  up    127.0.0.1:$KL_PG_PORT  data $PG_DATA  log $PG_LOG"; else echo "postgres  down"; fi
  if pid_alive "$KAFKA_PID"; then echo "kafka     up    $LOCAL_KAFKA (SASL_SSL 127.0.0.1:$KL_KAFKA_SASL_PORT)  pid $(cat "$KAFKA_PID")"; else echo "kafka     down"; fi
  if pid_alive "$SPARK_CONNECT_PID"; then echo "spark     up    sc://127.0.0.1:$KL_SPARK_CONNECT_PORT  pid $(cat "$SPARK_CONNECT_PID")  log $LOGS/spark-connect.log"; else echo "spark     down  (Spark Connect server)"; fi
  if pid_alive "$SPARK_MASTER_PID"; then echo "cluster   up    $KL_SPARK_CLUSTER_MASTER  master pid $(cat "$SPARK_MASTER_PID")  worker $(pid_alive "$SPARK_WORKER_PID" && echo "pid $(cat "$SPARK_WORKER_PID")" || echo down)"; else echo "cluster   down  (Spark standalone: scripts/stack.sh cluster)"; fi
  if pid_alive "$AIRFLOW_PID"; then echo "airflow   up    http://127.0.0.1:$KL_AIRFLOW_PORT  pid $(cat "$AIRFLOW_PID")"; else echo "airflow   down"; fi
}

case "${1:-}" in
  install) install ;;
  browser) install_browser ;;
  start) start_postgres; start_kafka; start_cluster_if_used; start_spark_connect ;;
  migrate) migrate ;;
  up) install; start_postgres; start_kafka; start_cluster_if_used; start_spark_connect; migrate ;;
  airflow) start_airflow ;;
  restart-postgres) stop_postgres; start_postgres ;;
  restart-kafka) stop_pidfile kafka "$KAFKA_PID"; start_kafka ;;
  restart-spark-connect) stop_pidfile "spark connect" "$SPARK_CONNECT_PID"; start_spark_connect ;;
  kill-spark-connect) kill_spark_connect ;;
  cluster) start_cluster ;;
  stop-cluster) stop_pidfile "spark worker" "$SPARK_WORKER_PID"; stop_pidfile "spark master" "$SPARK_MASTER_PID" ;;
  kill-spark-worker) kill_spark_worker ;;
  stop) stop_pidfile airflow "$AIRFLOW_PID"; stop_pidfile "spark connect" "$SPARK_CONNECT_PID"
        stop_pidfile "spark worker" "$SPARK_WORKER_PID"; stop_pidfile "spark master" "$SPARK_MASTER_PID"; stop_pidfile kafka "$KAFKA_PID"; stop_postgres ;;
  status) status ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
