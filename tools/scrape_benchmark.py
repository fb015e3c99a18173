"""The Prometheus endpoint's cost (`python -m tools.benchmark --scrape PIPELINES`): PIPELINES pipelines of
--partitions partitions each on the real stack, every one with a committed batch and half of them with records
waiting, scraped over HTTP through the endpoint's real server, as Prometheus would.

Three kinds of scrape, `--rounds` of each, their medians printed: `cold` (a new endpoint: Kafka's offsets and the
oldest unread records' timestamps all asked), `steady` (Kafka's offsets asked again, the timestamps known: what a
scrape every few seconds costs once the endpoint runs, the cache having expired) and `cached` (within the cache).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pydantic import SecretStr

from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.pipeline import PipelineConfig, read_pipelines
from kafka_ledger.config.settings import kafka_for, services_for
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ops import metrics
from kafka_ledger.runtimes import run_batch
from kafka_ledger.sinks import remove_pipeline
from tools import git_commit
from tools.benchmark_peers import COLUMNS

SCHEMA = "benchmark"
TARGET_SECONDS = 0.3
TOKEN = uuid.uuid4().hex


def _declare(workdir: Path, run_id: str, pipelines: int) -> list[PipelineConfig]:
    config = workdir / "pipelines.yaml"
    config.write_text(yaml.safe_dump({"pipelines": {
        f"scrape_{run_id}_{n}": {"topics": [f"scrape-{run_id}-{n}"], "output_table": f"scrape_{run_id}_{n}",
                                 "output_schema": SCHEMA, "columns": COLUMNS, "schedule": None,
                                 "spark_runtime": "connect"}
        for n in range(pipelines)}}))
    return list(read_pipelines(config).all_valid().values())


def _produce(servers: str, topics: list[str], partitions: int, per_partition: int) -> None:
    producer = Producer(kafka_for(servers).confluent(**{"linger.ms": 20}))
    for topic in topics:
        for partition in range(partitions):
            for i in range(per_partition):
                producer.produce(topic, key=f"u{i}".encode(), partition=partition, value=(
                    f'{{"event_id": "{topic}-{partition}-{i}", "user_id": "u{i}", "amount": {i}, "price": 1.5, '
                    f'"event_time": "2026-11-27T10:00:00Z"}}'
                ).encode())
    producer.flush(60)


def _scrape(url: str) -> tuple[float, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as reply:
        body = reply.read()
    return time.monotonic() - started, body


def _serve(collector: metrics.LedgerCollector) -> tuple[Any, str]:
    server = metrics.make_server("127.0.0.1:0", collector, metrics.Credentials(token=SecretStr(TOKEN)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/metrics"


def run_scrape_benchmark(servers: str, dsn: str, pipelines: int, partitions: int, rounds: int) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    declared = _declare(Path(tempfile.mkdtemp(prefix="kl-scrape-")), run_id, pipelines)
    services = services_for(dsn, servers)
    admin = AdminClient(kafka_for(servers).confluent())
    topics = [p.topics[0] for p in declared]
    for future in admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1)
                                       for t in topics]).values():
        future.result(60)
    load_before = os.getloadavg()[0]
    try:
        _produce(servers, topics, partitions, 2)
        for pipeline in declared:  # a committed batch each: positions, a batch, its durations
            run_batch(pipeline, plan_next_batch(services, pipeline).batch_id, services)
        _produce(servers, topics[::2], partitions, 1)  # half the pipelines lag: their oldest records are looked up
        times: dict[str, list[float]] = {"cold": [], "steady": [], "cached": []}
        sizes = []
        for _ in range(rounds):
            cold = metrics.LedgerCollector(services, lambda: declared, kafka_ttl_seconds=0)
            server, url = _serve(cold)
            took, body = _scrape(url)
            times["cold"].append(took)
            sizes.append(len(body))
            times["steady"].append(_scrape(url)[0])  # offsets asked again (no cache), timestamps known
            server.shutdown()
            server.server_close()
            cached = metrics.LedgerCollector(services, lambda: declared, kafka_ttl_seconds=600)
            server, url = _serve(cached)
            _scrape(url)
            times["cached"].append(_scrape(url)[0])
            server.shutdown()
            server.server_close()
        lagging = sum(1 for line in body.decode().splitlines()
                      if line.startswith("kafka_ledger_partition_oldest_unread_timestamp_seconds{"))
        medians = {kind: round(statistics.median(values), 3) for kind, values in times.items()}
        return {
            "scrape": True, "pipelines": pipelines, "partitions": pipelines * partitions, "rounds": rounds,
            "lagging_partitions": lagging, "exposition_bytes": sizes[-1],
            **{f"{kind}_seconds_median": value for kind, value in medians.items()},
            **{f"{kind}_seconds": [round(v, 3) for v in values] for kind, values in times.items()},
            "target_seconds": TARGET_SECONDS,
            "exact": medians["steady"] < TARGET_SECONDS and lagging == (pipelines + 1) // 2 * partitions,
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "commit": git_commit(),
        }
    finally:
        with ledger.transaction(services.ledger) as cur:
            for pipeline in declared:
                remove_pipeline(cur, pipeline)
        for future in admin.delete_topics(topics).values():
            future.result(60)
