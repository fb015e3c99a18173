"""Benchmark of the data path (plan -> spark-submit read and stage -> commit) on the local stack.

`python -m kafka_ledger.benchmark --records 200000 --partitions 18` produces records to a fresh topic,
plans one batch, runs the Spark job with exactly the command the pipeline DAG builds, commits, checks the
result against Kafka, and prints one JSON line of figures. Airflow is not involved: this measures the data
path only. The topic, tables and ledger rows are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kafka_ledger import ledger
from kafka_ledger.config import PipelineConfig, get_pipeline
from kafka_ledger.settings import bootstrap_servers, ledger_dsn

log = logging.getLogger("kafka_ledger.benchmark")

COLUMNS = [
    {"name": "event_id", "type": "string", "required": True},
    {"name": "user_id", "type": "string"},
    {"name": "amount", "type": "long"},
    {"name": "price", "type": "double"},
    {"name": "event_time", "type": "timestamp"},
]


def produce(servers: str, topic: str, records: int) -> float:
    """Produce `records` JSON events round-robin over the partitions; returns records per second."""
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 50,
                         "batch.size": 1_000_000, "compression.type": "lz4"})
    started = time.monotonic()
    for i in range(records):
        value = json.dumps({"event_id": f"e{i}", "user_id": f"u{i % 5000}", "amount": i, "price": i / 7,
                            "event_time": "2026-11-21T10:00:00Z"}).encode()
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.2)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return records / (time.monotonic() - started)


def run(records: int, partitions: int, cap: int, keep: bool, delivery_mode: str = "exactly_once") -> dict[str, object]:
    from confluent_kafka.admin import NewTopic

    from kafka_ledger.audit import reconcile
    from kafka_ledger.batches import commit_batch, plan_next_batch
    from kafka_ledger.spark_submit import submit_batch

    servers, dsn = bootstrap_servers(), ledger_dsn()
    run_id = uuid.uuid4().hex[:8]
    name, topic = f"bench_{run_id}", f"bench-{run_id}"
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
    config = Path(tempfile.mkdtemp()) / "pipelines.yaml"
    config.write_text(yaml.safe_dump({"pipelines": {name: {
        "topics": [topic], "output_table": name, "output_schema": "benchmark", "columns": COLUMNS,
        "max_records_per_partition": cap, "schedule": None, "delivery_mode": delivery_mode,
    }}}))
    os.environ["KAFKA_LEDGER_PIPELINES"] = str(config)
    pipeline = get_pipeline(name)
    try:
        produce_rate = produce(servers, topic, records)
        log.info("produced %d records at %.0f records/s", records, produce_rate)

        started = time.monotonic()
        planned = plan_next_batch(dsn, servers, pipeline)
        plan_seconds = time.monotonic() - started

        started = time.monotonic()
        submit_batch(pipeline, planned.batch_id, dsn, servers)
        spark_seconds = time.monotonic() - started
        # ru_maxrss of waited-for descendants: the peak of the largest process, the Spark driver JVM.
        peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

        conn = ledger.connect(dsn)
        with conn, conn.cursor() as cur:
            batch = ledger.get_batch(cur, planned.batch_id)
        conn.close()
        started = time.monotonic()
        committed = commit_batch(dsn, pipeline, planned.batch_id)
        commit_seconds = time.monotonic() - started
        check = reconcile(dsn, servers, pipeline)
        return {
            "records": records, "partitions": partitions, "cap_per_partition": cap, "delivery_mode": delivery_mode,
            "batch_offsets": planned.offsets, "produce_records_per_s": round(produce_rate),
            "plan_seconds": round(plan_seconds, 3),
            "spark_submit_seconds": round(spark_seconds, 2),
            "read_and_stage_seconds": round(batch.read_seconds, 2),
            "read_and_stage_records_per_s": round(batch.records_read / batch.read_seconds),
            "end_to_end_records_per_s": round(batch.records_read / (plan_seconds + spark_seconds + commit_seconds)),
            "commit_seconds": round(commit_seconds, 3),
            "records_written": committed.records_written,
            "peak_rss_mib": round(peak_rss_mib),
            "duplicates": check.duplicates, "missing": check.missing,
            "exact": check.exact and check.produced == check.output_rows + check.dead_letters,
        }
    finally:
        if not keep:
            _clean_up(dsn, admin, pipeline, topic)


def _clean_up(dsn: str, admin: AdminClient, pipeline: PipelineConfig, topic: str) -> None:
    conn = ledger.connect(dsn)
    with conn, conn.cursor() as cur:
        ledger.delete_pipeline(cur, pipeline)
    conn.close()
    admin.delete_topics([topic])[topic].result(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure the kafka-ledger data path on the local stack.")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=18)
    parser.add_argument("--cap", type=int, default=1_000_000, help="max records per partition (one batch)")
    parser.add_argument("--keep", action="store_true", help="keep the topic, tables and ledger rows")
    parser.add_argument("--delivery-mode", choices=["exactly_once", "at_least_once"], default="exactly_once",
                        help="at_least_once: the Spark job appends to the output table directly")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    figures = run(args.records, args.partitions, args.cap, args.keep, args.delivery_mode)
    print(json.dumps(figures), flush=True)
    return 0 if figures["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
