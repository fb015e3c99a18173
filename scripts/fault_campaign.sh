#!/usr/bin/env bash
# The fault-injection campaign (tools/fault_campaign/): set up the stack, then inject one
# fault per iteration while records flow, checking that no record is lost or doubled.
#   bash scripts/fault_campaign.sh --faults 200 --seed 20261121 --write-docs docs   # the full campaign
#   bash scripts/fault_campaign.sh --cluster --runtime connect --faults 40   # on the local Spark cluster
#   bash scripts/fault_campaign.sh --cluster --driver-in-cluster --runtime submit --faults 40   # each batch's
#       # driver on the cluster's worker (cluster deploy mode): the driver killed there, the worker lost, two drivers
#   bash scripts/fault_campaign.sh --network --runtime connect --faults 40   # through Toxiproxy, with network faults
#   bash scripts/fault_campaign.sh --runtime connect --sink iceberg --faults 40   # into an Iceberg table of the lake
#   bash scripts/fault_campaign.sh --runtime connect --write upsert --faults 40   # into an entity table (97 entities)
#   bash scripts/fault_campaign.sh --runtime connect --format avro --faults 40   # Avro (or protobuf) values through the schema
#       # registry (reached through Toxiproxy): the registry killed, restarted, slowed, a new version registered
#   bash scripts/fault_campaign.sh --runtime connect --doorbell --faults 20   # runs by the doorbell under a dedicated
#       # Airflow, its triggerer killed mid-poll, its scheduler killed with a doorbell run queued, a carrying run's
#       # task killed and the Spark Connect server restarted under it
#   bash scripts/fault_campaign.sh --runtime connect --doorbell --network --rate 6000 --faults 200 \
#       --records-per-fault 5000 --write-docs docs   # the doorbell's full campaign, network faults too
#   bash scripts/fault_campaign.sh --secure --cluster --network --network-weight 5 --runtime connect \
#       --faults 304 --records-per-fault 3300 --write-docs docs
#       # the production shape (Kafka over SASL_SSL, the ledger over verified TLS, Spark on the cluster), every
#       # fault kind: 4 rounds, each network fault 5 times a round (20 in all), every other kind once (4)
# Arguments go to the harness; `--help` lists them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for arg in "$@"; do
  case $arg in
    # Before set-up and env.sh: the stack then starts the cluster and puts both runtimes' Spark on it (the
    # cluster's address is this stack slot's, read from env.sh in a subshell).
    --cluster) KAFKA_LEDGER_SPARK_MASTER=$(. scripts/env.sh && echo "$KL_SPARK_CLUSTER_MASTER")
               export KAFKA_LEDGER_SPARK_MASTER ;;
    # Drivers on the worker each hold a core and a gigabyte beside the Spark Connect server's executor: room for two
    # of them (a resubmission, racing runs) and their executors.
    --driver-in-cluster) export KL_SPARK_WORKER_CORES=${KL_SPARK_WORKER_CORES:-4} \
                           KL_SPARK_WORKER_MEMORY=${KL_SPARK_WORKER_MEMORY:-6g} ;;
  esac
done
bash scripts/stack.sh up >&2
proxies=0  # network faults, and an Avro or Protobuf campaign's registry faults, go through Toxiproxy
for arg in "$@"; do case $arg in --network|avro|--format=avro|protobuf|--format=protobuf) proxies=1 ;; esac; done
[ $proxies = 0 ] || bash scripts/stack.sh proxies >&2
. scripts/env.sh
for arg in "$@"; do [ "$arg" != --secure ] || . scripts/secured_kafka.sh || exit 1; done
exec python -m tools.fault_campaign "$@"  # from the project root
