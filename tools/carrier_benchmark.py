"""What a carrier's cycle costs (`python -m tools.benchmark --carrier-cycles 200 --records 1250 --rounds 3`).

PIPELINES pipelines of --partitions partitions each (a topic and an output table each, one carrier) get --records
records each before every round; each round is one carrier cycle (runtimes/connect/carrier.py) in this process: its
first half (one look-up of Kafka, each member's batch planned and begun) and its second (the one read, the Spark job,
each member's commit), timed apart, and the CPU seconds of the round: this process's (the carrier's client side), the
Spark Connect server's (with the processes under it), the Kafka broker's, and the whole machine's (the rest is mostly
Postgres). Every round must commit every pipeline's records, each once. The first round pays for the session's query
compilation; compare the later ones.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg2
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kafka_ledger.config.settings import kafka_for, task_services
from kafka_ledger.runtimes.connect.carrier import Carrier, Cycle
from kafka_ledger.sinks import remove_pipeline
from tools import git_commit
from tools.benchmark_peers import record_value
from tools.freshness import scalar
from tools.kafka_topics import create_topic
from tools.pipelines_benchmark import SCHEMA, cpu_seconds, declare, machine_cpu_seconds
from tools.process_memory import with_children
from tools.stack import service_pids


def run_carrier_benchmark(servers: str, dsn: str, pipelines: int, partitions: int, records: int, rounds: int
                          ) -> dict[str, Any]:
    """The whole benchmark (see the module); returns its summary."""
    run_id = uuid.uuid4().hex[:6]
    carrier_name = f"fleet_{run_id}"
    declared = declare(Path(tempfile.mkdtemp(prefix="kl-carrier-")), run_id, pipelines, carrier_name)
    admin = AdminClient(kafka_for(servers).confluent())
    for pipeline in declared:
        create_topic(admin, pipeline.topics[0], partitions)
    producer = Producer(kafka_for(servers).confluent(**{"linger.ms": 20, "queue.buffering.max.messages": 2_000_000}))
    carrier = Carrier(carrier_name, task_services())
    load_before = os.getloadavg()[0]
    summary: dict[str, Any] = {"pipelines": pipelines, "partitions": partitions, "records_per_pipeline": records,
                               "rounds": []}
    exact = True
    try:
        for round_ in range(rounds):
            for pipeline in declared:
                for i in range(records):
                    producer.produce(pipeline.topics[0], value=record_value(round_ * records + i),
                                     partition=i % partitions)
                producer.poll(0)
            producer.flush(120)
            server = with_children(service_pids()["spark-connect"])
            kafka = with_children(service_pids()["kafka"])
            me = psutil.Process()
            before = (cpu_seconds(server), cpu_seconds(kafka), sum(me.cpu_times()[:2]), machine_cpu_seconds())
            started = time.monotonic()
            cycle = Cycle()
            members = carrier.begin(declared, cycle)
            begun = time.monotonic()
            carrier.publish(members, cycle)
            ended = time.monotonic()
            after = (cpu_seconds(server), cpu_seconds(kafka), sum(me.cpu_times()[:2]), machine_cpu_seconds())
            server_s, kafka_s, client_s, machine_s = (round(b - a, 2) for a, b in zip(before, after, strict=True))
            summary["rounds"].append({
                "committed": len(cycle.results), "failed": len(cycle.failures), "waves": cycle.waves,
                "jobs": cycle.jobs, "records_written": cycle.records_written,
                "seconds": {"cycle": round(ended - started, 2), "begin": round(begun - started, 2),
                            "publish": round(ended - begun, 2)},
                "cpu_seconds": {"client": client_s, "spark_connect_server": server_s, "kafka": kafka_s,
                                "machine": machine_s, "rest": round(machine_s - client_s - server_s - kafka_s, 2)},
                "machine_cpu_seconds_per_pipeline": round(machine_s / pipelines, 4)})
            exact = exact and len(cycle.results) == pipelines and not cycle.failures
        for pipeline in declared:
            table = f"{SCHEMA}.{pipeline.output_table}"
            exact = exact and scalar(dsn, f"SELECT count(*) FROM {table}") == scalar(
                dsn, f"SELECT count(DISTINCT (kafka_partition, kafka_offset)) FROM {table}") == records * rounds
    finally:
        carrier.close()
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            for pipeline in declared:
                remove_pipeline(cur, pipeline)
        conn.close()
        for future in admin.delete_topics([p.topics[0] for p in declared]).values():
            future.result(60)
    summary["exact"] = exact
    summary["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    summary["cores"] = os.cpu_count()
    summary["commit"] = git_commit()
    return summary
