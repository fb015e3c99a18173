#!/usr/bin/env bash
# Quick start, command 1: set up everything on a fresh machine (idempotent), then run the demo.
# The demo prints its JSON accounting (counted from Kafka and Postgres, and the lag the stack's Prometheus scraped
# from kafka-ledger's metrics endpoint: "prometheus_lag": 0); `kafka-ledger verify` then checks
# the ledger's invariants and, against Kafka, every offset committed since its last verify (all of them on a
# first run), and exits non-zero on any problem or if it could not check.
#
#   bash scripts/demo.sh [--secure] [--cluster] [--sink iceberg] [demo options, see python -m tools.demo --help]
#     --secure    Kafka over the broker's SASL_SSL listener (SCRAM-SHA-512, the stack's CA); the ledger over
#                 TLS with sslmode=verify-full (the local stack's default, checked here)
#     --cluster   Spark on the local standalone cluster (master and worker on loopback): the Spark Connect
#                 server runs its executors there
#     --sink iceberg  the pipeline impressions_lake: the same topic into the lake's Iceberg table, one snapshot per
#                 batch, counted back without Spark (pyiceberg)
#     --format avro  the pipeline impressions_avro: Avro impressions written by Confluent's AvroSerializer through
#                 the stack's schema registry (a second schema version, a field added with a default, registered
#                 before the first run), the output checked value by value against Confluent's AvroDeserializer
#     --format protobuf  the pipeline impressions_protobuf: the same as Protobuf, written by Confluent's
#                 ProtobufSerializer, checked against its ProtobufDeserializer
#     --doorbell N  then N impressions more, published by the run the pipeline's doorbell starts under the stack's
#                 own Airflow (scripts/stack.sh airflow: scheduler and triggerer), with the seconds it took
#     --cdc [N]   change data capture instead: Debezium's PostgreSQL connector on the stack's Kafka Connect worker
#                 (scripts/stack.sh kafka-connect) captures the source tables cdc.public.customers and
#                 cdc.public.everyday_types (PostgreSQL's everyday types, with Debezium's defaults); two rounds of N
#                 (default 2000) inserts, updates, deletes and key changes, each published into the entity tables
#                 public.customers and public.everyday_types by runs of their pipelines; ends with
#                 "matches_source": true when each entity table equals its source table row by row
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

secure=0
pipeline=impressions
demo_args=()
previous=
for arg in "$@"; do
  case $arg in
    --secure) secure=1 ;;
    # Before set-up and env.sh: the stack then starts the cluster and puts its Spark on it.
    --cluster) export KAFKA_LEDGER_SPARK_MASTER="spark://127.0.0.1:${KL_SPARK_MASTER_PORT:-17077}" ;;
    *) demo_args+=("$arg") ;;
  esac
  # --sink iceberg: the demo's pipeline into the lake (tools/demo.py), verified below
  if [ "$previous" = --sink ] && [ "$arg" = iceberg ] || [ "$arg" = --sink=iceberg ]; then pipeline=impressions_lake; fi
  # --format avro: Avro impressions through the stack's schema registry (tools/demo.py), verified below
  if [ "$previous" = --format ] && [ "$arg" = avro ] || [ "$arg" = --format=avro ]; then pipeline=impressions_avro; fi
  if [ "$previous" = --format ] && [ "$arg" = protobuf ] || [ "$arg" = --format=protobuf ]; then pipeline=impressions_protobuf; fi
  # --cdc: Debezium's change events into the entity tables of pipelines customers and everyday_types (tools/demo.py),
  # verified below
  case $arg in --cdc|--cdc=*) pipeline="customers everyday_types" ;; esac
  previous=$arg
done

bash scripts/stack.sh up
bash scripts/stack.sh monitoring  # the metrics endpoint and Prometheus: the demo ends by asking it for the lag
. scripts/env.sh
if [ "$secure" = 1 ]; then . scripts/secured_kafka.sh || exit 1; fi
if [ "$secure" = 1 ]; then shape="Kafka $KAFKA_LEDGER_BOOTSTRAP_SERVERS over SASL_SSL, the ledger over verified TLS"
else shape="Kafka $KAFKA_LEDGER_BOOTSTRAP_SERVERS"; fi
echo "[demo] $shape; Spark master $KAFKA_LEDGER_SPARK_MASTER (runtime $KAFKA_LEDGER_SPARK_RUNTIME)"
python -m tools.demo "${demo_args[@]}"  # tools/demo.py; the working directory is the project root
kafka-ledger verify $pipeline  # one pipeline, or the CDC demo's two
