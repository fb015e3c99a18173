"""Benchmark of the data path (plan -> Spark read -> publish and commit) against hand-written peers.

    python -m tools.benchmark --records 545884 --partitions 18 --peers --rounds 10   # from the project root

produces the records to one fresh topic, then runs, round after round and alternately on that same topic:
kafka-ledger's data path as the pipeline DAG takes it (in the deployment's Spark runtime, or `--runtime`),
and with `--peers` a plain confluent-kafka + COPY consumer (copying in chunks while it reads), a Spark
Structured Streaming job (tools/benchmark_peers.py), and the physical floor: Kafka's own consumer fetching
the topic (kafka-consumer-perf-test) plus a bare COPY of the same rows. Each contender writes into a fresh
table with the primary key (topic, partition, offset) and is checked for the exact row count. One JSON line
per round, then a summary line (medians; ratios kafka-ledger / peer as medians of the per-round ratios; the
1-minute load average at the start and the end; the commit). `--small` times a 1,000-record batch.
`--entity-keys N` gives the records N distinct `user_id`s and also runs, each round, an entity table keyed by
`user_id` (write: upsert) on the same topic, checked for exactly N rows: `ratio_entity_vs_append`.
`--cdc KEYS` also writes `--records` Debezium change events over KEYS keys to a third topic (a snapshot, then 60 %
updates, 10 % deletes, 10 % creates, then a second snapshot; tools/benchmark.cdc_events) and runs, each round, an entity
table of them (`envelope: debezium`), checked for exactly KEYS rows, and a pipeline appending the same events as rows
(their row images by path), checked for one row each: `ratio_cdc_vs_append`. `--cdc-table typed`: the events of the
type matrix's wide table instead (tools/cdc.py), appended with their fields as on the wire.
`--format avro` also writes the records as Avro (confluent-kafka's AvroSerializer through the schema registry) to a
second topic, and runs, each round, kafka-ledger on both topics (`ratio_avro_vs_json`) and, with `--peers`, the Python
peer decoding the Avro values with AvroDeserializer (`ratio_avro_vs_python_avro`) instead of the other peers;
`--format protobuf` the same with Protobuf values, ProtobufSerializer and ProtobufDeserializer
(`ratio_protobuf_vs_json`, `ratio_protobuf_vs_python_protobuf`).
`--freshness` runs the freshness benchmark instead (tools/freshness.py). `--verify` times `kafka-ledger verify`
instead: `--full` over the ingested topic, then incremental after one more small batch (wall time and peak resident
memory of the verify process).

Timed: kafka-ledger from planning to the committed batch, in this process with its modules imported (as in
a warm Airflow worker); the Python peer from its consumer's start to its committed COPY; the Spark peer from
spark-submit to its exit. Airflow's scheduling is not part of any figure. Topic, tables and ledger rows are
removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.pipeline import PipelineConfig, get_pipeline
from kafka_ledger.config.services import LedgerDatabase, jdbc_target
from kafka_ledger.config.settings import (
    deployment_settings,
    deployment_spark_runtime,
    env_name,
    kafka_client,
    kafka_for,
    ledger_database,
    schema_registry,
    services_for,
)
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.debezium import UNAVAILABLE_PLACEHOLDER
from kafka_ledger.observe.stages import until_first_rows
from kafka_ledger.runtimes import run_batch
from kafka_ledger.runtimes.submit.spark_submit import BASE_SPARK_CONF, spark_jars
from kafka_ledger.sinks import IcebergSink, remove_pipeline, sink_for
from tools import benchmark_peers, git_commit
from tools.benchmark_peers import COLUMNS
from tools.cdc import TYPED_DEBEZIUM, TYPED_DECLARED, typed_image
from tools.demo import accounting
from tools.kafka_topics import create_topic
from tools.stack import service_pids, stack_command

log = logging.getLogger("tools.benchmark")

SCHEMA = "benchmark"
SMALL_BATCH = 1_000
CAP_DEFAULT = 10_000_000


def produce(servers: str, topic: str, records: int, partitions: int, users: int = 5000) -> float:
    """Produce `records` JSON events round-robin over the partitions, `users` distinct user ids; returns records per
    second."""
    producer = Producer(kafka_for(servers).confluent(**{"enable.idempotence": True, "linger.ms": 50,
                                                 "batch.size": 1_000_000, "compression.type": "lz4"}))
    started = time.monotonic()
    for i in range(records):
        value = benchmark_peers.record_value(i, users)
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.2)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return records / (time.monotonic() - started)


# The change events' pipelines (--cdc): a source table's columns and two of the events' own (tools/cdc.py's table).
CDC_COLUMNS = [
    {"name": "id", "type": "long"}, {"name": "email", "type": "string"},
    {"name": "city", "type": "string"}, {"name": "balance", "type": "decimal(12,2)"},
    {"name": "updated_at", "type": "timestamp"}, {"name": "source_lsn", "type": "long", "path": "source.lsn"},
    {"name": "op", "type": "string", "path": "op"},
]
# --cdc-table typed: the wide typed table's (tools/cdc.py), its events as Debezium writes them without schemas.
TYPED_CDC_COLUMNS = [*TYPED_DECLARED, *CDC_COLUMNS[-2:]]
# The appending pipeline of the typed table's events reads their fields as they are on the wire (no envelope: no
# Debezium reading of a day count, an epoch, a numeric's text, base64 or JSON text).
TYPED_WIRE_KINDS = {"d": "int", "ts0": "long", "ts3": "long", "ts6": "long", "tstz": "string", "t3": "int",
                    "t6": "long", "n": "string", "nv": "string", "m": "string", "b": "string", "u": "string",
                    "j": "string", "jb": "string", "big": "string", "iv": "string"}
# One update in TOASTED_EVERY of the typed table leaves its note unchanged (Debezium's placeholder in its place).
TOASTED_EVERY = 3


def cdc_events(events: int, keys: int, seed: int = 20261127) -> list[tuple[str, int]]:
    """The (op, key) of `events` change events over `keys` keys, as Debezium would write a source table's history:
    a snapshot (op r of every key), then cycles of eight events, six updates of random keys and one key deleted
    and created again (60 % updates, 10 % deletes, 10 % creates of the whole), then a second snapshot (an
    incremental one, op r of every key again). `events - 2 * keys` must be a multiple of 8."""
    import random

    middle = events - 2 * keys
    if middle < 0 or middle % 8:
        raise ValueError(f"--cdc {keys}: --records minus twice the keys must be a positive multiple of 8")
    rng = random.Random(seed)
    history = [("r", key) for key in range(keys)]
    for _ in range(middle // 8):
        cycled = rng.randrange(keys)
        history += [("u", rng.randrange(keys)) for _ in range(3)] + [("d", cycled)]
        # Updates of other keys while it is gone (a deleted row is updated no more).
        history += [("u", (cycled + 1 + rng.randrange(keys - 1)) % keys) for _ in range(3)] + [("c", cycled)]
    return history + [("r", key) for key in range(keys)]


def cdc_value(op: str, key: int, lsn: int, table: str = "customers") -> bytes:
    """A Debezium PostgreSQL change event (JsonConverter without its schema wrapper) of row `key` of `table`: the
    customers or the wide typed table (one update in TOASTED_EVERY leaving its TOASTed note unchanged)."""
    if table == "typed":
        row = {"id": key, **{name: wire for name, (wire, _) in typed_image(lsn).items()},
               "jb": json.dumps({"lsn": lsn, "list": [True, "é"]}),
               "note": UNAVAILABLE_PLACEHOLDER if op == "u" and lsn % TOASTED_EVERY == 0 else f"note {lsn}"}
    else:
        row = {"id": key, "email": f"user{key}.{lsn % 997}@example.org",
               "city": ("Lyon", "Oslo", "Porto", None)[lsn % 4],
               "balance": f"{(lsn % 2_000_000 - 1_000_000) / 100:.2f}", "updated_at": "2026-11-27T10:00:00.123456Z"}
    return json.dumps({
        "before": {"id": key, **{name: None for name in row if name != "id"}} if op == "d" else None,
        "after": None if op == "d" else row,
        "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "bench", "ts_ms": 1795780800000,
                   "snapshot": "true" if op == "r" else "false", "db": "cdc", "sequence": f'[null,"{lsn}"]',
                   "schema": "public", "table": table, "txId": lsn // 4, "lsn": lsn, "xmin": None},
        "op": op, "ts_ms": 1795780800000, "transaction": None}).encode()


def produce_cdc(servers: str, topic: str, events: int, keys: int, table: str = "customers") -> tuple[float, int]:
    """Produce `cdc_events` keyed by `{"id": key}` (a key's events in one partition, as Debezium's are), without the
    tombstone after a delete (Debezium's `tombstones.on.delete=false`: the appending pipeline then reads the very same
    records); returns (records per second, records produced)."""
    producer = Producer(kafka_for(servers).confluent(**{"enable.idempotence": True, "linger.ms": 50,
                                                        "batch.size": 1_000_000, "compression.type": "lz4"}))
    started, produced = time.monotonic(), 0
    for lsn, (op, key) in enumerate(cdc_events(events, keys), start=1):
        record_key = json.dumps({"id": key}).encode()
        value = cdc_value(op, key, lsn, table)
        while True:
            try:
                producer.produce(topic, key=record_key, value=value)
                break
            except BufferError:
                producer.poll(0.2)
        produced += 1
        if lsn % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return produced / (time.monotonic() - started), produced


def produce_registered(servers: str, topic: str, records: int, partitions: int, value_format: str,
                       users: int = 5000) -> float:
    """The same records as `produce`, as Avro values written by AvroSerializer or Protobuf values by
    ProtobufSerializer through the schema registry (subject `<topic>-value`, registered by the serializer); returns
    records per second."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = schema_registry().client()
    if value_format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        event_class = benchmark_peers.protobuf_event_class()
        protobuf = ProtobufSerializer(event_class, client, {"auto.register.schemas": True})

        def serialize(fields: dict, context: SerializationContext) -> bytes:
            return protobuf(benchmark_peers.protobuf_record(event_class, fields["amount"], users), context)
    else:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        serialize = AvroSerializer(client, json.dumps(benchmark_peers.AVRO_SCHEMA))
    context = SerializationContext(topic, MessageField.VALUE)
    producer = Producer(kafka_for(servers).confluent(**{"enable.idempotence": True, "linger.ms": 50,
                                                        "batch.size": 1_000_000, "compression.type": "lz4"}))
    started = time.monotonic()
    for i in range(records):
        value = serialize(benchmark_peers.record(i, users), context)
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.2)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return records / (time.monotonic() - started)


class PeakRss:
    """Samples the resident memory of some processes (and their children) while a contender runs."""

    def __init__(self, pids: dict[str, int]):
        import psutil

        self._processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.peak_mib: dict[str, int] = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _rss(self, process: Any) -> int:
        try:
            return max([process.memory_info().rss] + [c.memory_info().rss for c in process.children(recursive=True)])
        except Exception:  # noqa: BLE001 - a process that ended meanwhile has no memory left to count
            return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            for name, process in self._processes.items():
                self.peak_mib[name] = max(self.peak_mib[name], self._rss(process) >> 20)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Setup:
    servers: str
    dsn: str
    topic: str
    records: int
    cap: int
    runtime: str
    workdir: Path
    tables: list[str] = field(default_factory=list)
    pipelines: list[PipelineConfig] = field(default_factory=list)
    sink: str = "postgres"  # where kafka-ledger publishes: postgres, or iceberg (the stack's lake)
    lake_tables: list[str] = field(default_factory=list)  # the Iceberg peer's tables, lake.benchmark.<name>
    entity_keys: int | None = None  # distinct user ids, and an entity table keyed by them each round
    # The same records as Avro or Protobuf values (--format avro|protobuf), and that format.
    registered_topic: str | None = None
    registered_format: str | None = None
    cdc_topic: str | None = None  # `records` change events over cdc_keys keys (--cdc), into an entity table
    cdc_keys: int | None = None
    cdc_records: int = 0  # the events and the tombstones after deletes
    cdc_table: str = "customers"  # whose events: the customers' or the wide typed table's (--cdc-table)


def _pipeline(setup: Setup, name: str, delivery_mode: str, sink: str | None = None,
              write: str = "append", value_format: str = "json", cdc: bool = False) -> PipelineConfig:
    output = ({"sink": {"type": "iceberg", "namespace": SCHEMA, "table": name}} if (sink or setup.sink) == "iceberg"
              else {"output_table": name, "output_schema": SCHEMA})
    if write == "upsert":
        output.update(write="upsert", key=["id" if cdc else "user_id"])
    topic = setup.cdc_topic if cdc else setup.registered_topic if value_format != "json" else setup.topic
    columns = COLUMNS
    if cdc:
        # The entity table applies the events (envelope debezium); the appending pipeline keeps each event's row
        # image and own fields as a row, by path.
        declared = TYPED_CDC_COLUMNS if setup.cdc_table == "typed" else CDC_COLUMNS
        columns = declared if write == "upsert" else [
            {**c, "path": c.get("path", f"after.{c['name']}"), "type": TYPED_WIRE_KINDS.get(c["name"], c["type"])}
            for c in declared]
    config = setup.workdir / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"pipelines": {name: {
        "topics": [topic], **output, "columns": columns,
        "value": {"format": value_format, **({"envelope": "debezium", "debezium": TYPED_DEBEZIUM}
                                             if cdc and write == "upsert" else {})},
        "max_records_per_partition": setup.cap, "schedule": None, "delivery_mode": delivery_mode,
        "spark_runtime": setup.runtime,
    }}}))
    os.environ[env_name("pipelines")] = str(config)
    pipeline = get_pipeline(name)
    setup.pipelines.append(pipeline)
    return pipeline


def round_pipeline(setup: Setup, delivery_mode: str, sink: str | None = None, write: str = "append",
                   value_format: str = "json", cdc: bool = False) -> PipelineConfig:
    """The benchmark's pipeline (of `sink`, by default the run's), started afresh for a round: the last round's
    table, ledger rows and positions removed. One pipeline rather than one per round, as a deployment's batches are
    a pipeline's batches one after the other: in the connect runtime they work in the pipeline's Spark Connect
    session, where the query's generated code stays compiled (runtimes/connect.py: pipeline_session)."""
    sink = sink or setup.sink
    name = setup.topic.replace("-", "_") + ("_lake" if sink == "iceberg" else "") + (
        "_entity" if write == "upsert" else "") + (f"_{value_format}" if value_format != "json" else "") + (
        "_cdc" if cdc else "")
    for old in [p for p in setup.pipelines if p.name == name]:
        _remove_pipeline(setup, old)
    return _pipeline(setup, name, delivery_mode, sink, write, value_format, cdc)


def _remove_pipeline(setup: Setup, pipeline: PipelineConfig) -> None:
    """A pipeline's table (in Postgres, or the lake's), ledger rows and positions."""
    with ledger.transaction(LedgerDatabase(setup.dsn)) as cur:
        remove_pipeline(cur, pipeline)
    sink = sink_for(pipeline)
    if isinstance(sink, IcebergSink):
        sink.catalog().purge_table(sink.identifier)
    setup.pipelines.remove(pipeline)


def output_rows(setup: Setup, pipeline: PipelineConfig) -> int:
    """Rows in the pipeline's output: its Postgres table, or its Iceberg table read back without Spark."""
    sink = sink_for(pipeline)
    if isinstance(sink, IcebergSink):
        return len(sink.output_record_ids(None))
    return benchmark_peers.count_rows(setup.dsn, SCHEMA, pipeline.output_table)


def run_kafka_ledger(setup: Setup, pipeline: PipelineConfig) -> dict[str, Any]:
    """Plan, read, publish and commit the whole topic, as the pipeline DAG does: one batch, or (a backlog over the
    pipeline's cap) batch after batch until it is caught up."""
    pids = {"client": os.getpid()}
    server = service_pids().get("spark-connect") if setup.runtime == "connect" else None
    if server:
        pids["spark_connect_server"] = server
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with PeakRss(pids) as rss:
        started = time.monotonic()
        planned = plan_next_batch(services_for(setup.dsn, setup.servers), pipeline)
        plan_seconds = time.monotonic() - started
        result = run_batch(pipeline, planned.batch_id, services_for(setup.dsn, setup.servers))
        batch_ids, written, dead = [planned.batch_id], result.records_written, result.records_dead_lettered
        first_batch_peaks = dict(rss.peak_mib)
        # As the DAG does (its drain_backlog): another batch only while the last plan left offsets beyond its cap.
        backlog = planned.backlog_after
        while backlog and (more := plan_next_batch(services_for(setup.dsn, setup.servers), pipeline)).batch_id:
            later = run_batch(pipeline, more.batch_id, services_for(setup.dsn, setup.servers))
            batch_ids.append(more.batch_id)
            written, dead = written + later.records_written, dead + later.records_dead_lettered
            backlog = more.backlog_after
        seconds = time.monotonic() - started
    peaks = dict(rss.peak_mib)
    if setup.runtime == "submit":  # the spark-submit driver JVM, a child that has exited
        peaks["spark_submit"] = max(children_before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) >> 10
    with ledger.transaction(LedgerDatabase(setup.dsn)) as cur:
        batches = [ledger.get_batch(cur, batch_id) for batch_id in batch_ids]
    rows = output_rows(setup, pipeline)
    return {
        "table": pipeline.output_table, "pipeline": pipeline.name, "batch_id": planned.batch_id,
        "seconds": round(seconds, 3), "plan_seconds": round(plan_seconds, 3),
        "read_seconds": round(batches[0].read_seconds or 0.0, 3), "commit_seconds": round(result.seconds, 3),
        # The first batch's stages (stages.STAGES) with planning before them, and the gap before its first rows.
        "stages": {"plan": round(plan_seconds, 3), **result.stages,
                   **({"first_rows_after": gap} if (gap := until_first_rows(result.stages)) is not None else {})},
        # A backlog drained batch after batch: the peaks after its first batch, to be compared with its whole drain's.
        **({"batches": len(batches), "first_batch_peak_rss_mib": first_batch_peaks} if len(batches) > 1 else {}),
        "rows": rows, "dead_letters": dead,
        # An entity table holds one row per key; its batch still accounts for every record it read.
        "exact": all(b.status == "committed" for b in batches) and (
            rows == setup.cdc_keys and written == setup.cdc_records
            and dead == 0 if pipeline.value.envelope == "debezium"
            else rows == setup.cdc_records if pipeline.topics == [setup.cdc_topic]
            else rows == setup.entity_keys and written == setup.records if pipeline.is_entity_table
            else rows + dead == setup.records),
        "peak_rss_mib": peaks,
    }


def run_spark_stages(setup: Setup, contender: dict[str, Any]) -> dict[str, Any]:
    """The Spark side of the batch kafka-ledger just committed, one stage more per query on the warm server:
    the Kafka read alone, the read and the decode into the rows the task receives, and both with the rows'
    transfer to this process and their encoding for binary COPY here (no COPY). The differences are the decode's,
    the transfer's and the encoding's cost; COPY alone is the floor's."""
    from pyspark.sql import functions as F

    from kafka_ledger.batch import read
    from kafka_ledger.batch.publish import output_values, publish_frame
    from kafka_ledger.model.columns import DEAD_LETTER_LINE, PUBLISHED
    from kafka_ledger.runtimes.connect.batch import arrow_stream, pipeline_session
    from kafka_ledger.sinks.postgres.copy import OutputEncoder
    from kafka_ledger.spark.connect import client_session, configure, let_go

    pipeline = get_pipeline(contender["pipeline"])
    sink = sink_for(pipeline)
    with ledger.transaction(LedgerDatabase(setup.dsn)) as cur:
        attempt = read.Attempt(ledger.get_batch(cur, contender["batch_id"]), 0)

    kafka = kafka_for(setup.servers)

    def rows() -> Any:
        return publish_frame(read.read_records(spark, attempt, kafka), pipeline, sink, attempt.batch.batch_id)

    encoding = 0.0

    def transfer_and_encode() -> int:
        nonlocal encoding
        encoder = OutputEncoder(sink.published_columns(), attempt.batch.batch_id)
        encoder.header()
        count = 0
        for table in arrow_stream(rows(), attempt):
            count += table.num_rows
            started = time.monotonic()
            for _ in encoder.rows(table.filter(table[PUBLISHED])):
                pass
            encoding += time.monotonic() - started
        return count

    def timed(count: Any) -> float:
        started = time.monotonic()
        counted = count()
        if counted != setup.records:
            raise RuntimeError(f"a stage query counted {counted} records, not {setup.records}")
        return time.monotonic() - started

    # The pipeline's own session, where its batch's code is compiled already.
    with ledger.transaction(LedgerDatabase(setup.dsn)) as cur:
        spark = client_session(pipeline_session(cur, pipeline.name))
    try:
        configure(spark)
        # Each query touches every value (its length or hash summed), so none can skip the part it times.
        read_only = timed(lambda: read.read_records(spark, attempt, kafka)
                          .agg(F.count("*"), F.sum(F.length("value"))).collect()[0][0])
        decoded = timed(lambda: rows().agg(F.count("*"), F.sum(F.hash(*output_values(sink), DEAD_LETTER_LINE)))
                        .collect()[0][0])
        encoded = timed(transfer_and_encode)
    finally:
        let_go(spark)  # not spark.stop(): see close_session
    return {"spark_read": round(read_only, 3), "decode": round(decoded - read_only, 3),
            "transfer": round(encoded - encoding - decoded, 3), "encode": round(encoding, 3),
            "read_decode_transfer_encode": round(encoded, 3)}


def run_python_peer(setup: Setup, round_no: int, value_format: str = "json") -> dict[str, Any]:
    table = f"python_peer_{round_no}" + (f"_{value_format}" if value_format != "json" else "")
    benchmark_peers.create_table(setup.dsn, SCHEMA, table)
    setup.tables.append(table)
    # Run by its path, as spark-submit runs the Spark peer: it needs no package of the project but kafka_ledger.
    command = [sys.executable, benchmark_peers.__file__, "python", "--servers", setup.servers,
               "--topic", setup.registered_topic if value_format != "json" else setup.topic, "--schema", SCHEMA,
               "--table", table, "--format", value_format]
    done = subprocess.run(command, env={**os.environ, "KAFKA_LEDGER_DB_URL": setup.dsn}, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the Python peer failed ({done.returncode}): {done.stderr[-3000:]}")
    # Timed inside the peer, from its consumer's start to its committed COPY (not Python's start-up).
    seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    rows = benchmark_peers.count_rows(setup.dsn, SCHEMA, table)
    return {"seconds": seconds, "rows": rows, "exact": rows == setup.records}


def run_spark_peer(setup: Setup, round_no: int) -> dict[str, Any]:
    """Spark Structured Streaming into a Postgres table over JDBC, or with an Iceberg sink into a table of the same
    lake catalog."""
    table = f"spark_peer_{round_no}"
    lake_table = f"lake.{SCHEMA}.{table}_{setup.topic.replace('-', '_')}"
    lake = ["--iceberg-table", lake_table] if setup.sink == "iceberg" else []
    if lake:
        setup.lake_tables.append(lake[1])
    else:
        benchmark_peers.create_table(setup.dsn, SCHEMA, table)
        setup.tables.append(table)
    target = jdbc_target(setup.dsn)
    conf = [part for key, value in BASE_SPARK_CONF.items() for part in ("--conf", f"{key}={value}")]
    command = ["spark-submit", "--master", deployment_settings().spark_master or "local[*]", *conf,
               "--jars", spark_jars(), benchmark_peers.__file__, "spark", "--servers", setup.servers,
               "--topic", setup.topic, "--schema", SCHEMA, "--table", table, "--jdbc-url", target.url,
               "--checkpoint", str(setup.workdir / f"checkpoint-{round_no}"), *lake]
    # Credentials reach the job through its environment, never its command line.
    env = {**os.environ, "BENCHMARK_DB_USER": target.user, "BENCHMARK_DB_PASSWORD": target.password}
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    started = time.monotonic()  # spark-submit to exit: a Spark job's start-up is part of its cost
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"the Spark peer failed ({done.returncode}): {done.stderr[-3000:]}")
    if lake:
        from kafka_ledger.sinks.iceberg import catalogs as lakes

        rows = len(lakes.reader("lake").load_table(tuple(lake[1].split(".")[1:])).scan(
            selected_fields=("kafka_offset",)).to_arrow())
    else:
        rows = benchmark_peers.count_rows(setup.dsn, SCHEMA, table)
    return {"seconds": round(seconds, 3), "rows": rows, "exact": rows == setup.records}


def run_floor(setup: Setup, round_no: int, source_table: str) -> dict[str, Any]:
    """The physical floor on this machine: Kafka's own consumer fetching the whole topic (kafka-consumer-perf-test
    from the stack's Kafka jars, its fetch time) plus a bare COPY of the same rows into a table with the primary
    key (from `source_table`, untimed export). Serial: reading then writing, nothing overlapped."""
    command = [str(Path(sys.executable).with_name("kafka-ledger")), "kafka", "consumer-perf-test",
               "--topic", setup.topic, "--messages", str(setup.records), "--timeout", "60000", "--hide-header",
               "--group", f"benchmark-floor-{uuid.uuid4().hex[:8]}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kafka-consumer-perf-test failed ({done.returncode}): {done.stderr[-3000:]}")
    # start.time, end.time, MB, MB.sec, nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, ...
    fields = [f.strip() for f in done.stdout.strip().splitlines()[-1].split(",")]
    messages, fetch_ms = int(fields[4]), int(fields[7])
    table = f"floor_copy_{round_no}"
    setup.tables.append(table)
    copy_seconds = benchmark_peers.copy_floor(setup.dsn, SCHEMA, source_table, table)
    read_seconds = fetch_ms / 1000
    return {"seconds": round(read_seconds + copy_seconds, 3), "kafka_read_seconds": round(read_seconds, 3),
            "copy_seconds": round(copy_seconds, 3), "exact": messages >= setup.records}


def run_under_airflow(setup: Setup, round_no: int) -> dict[str, Any]:
    """Drain the whole topic as Airflow runs the pipeline DAG (dag.test(), one run after another as the
    scheduler starts them after each drain_backlog trigger), from the first plan to the last commit."""
    from kafka_ledger.airflow.dags import run_pipeline_dag  # Airflow is heavy: imported for --airflow only

    pipeline = _pipeline(setup, f"bench_{uuid.uuid4().hex[:8]}_{round_no}", "exactly_once")
    started, runs = time.monotonic(), 0
    while True:
        runs += 1
        outcome = run_pipeline_dag(pipeline)
        if outcome.state != "success":
            raise RuntimeError(f"run {runs} of the benchmark's DAG failed: {outcome}")
        if outcome.tasks.get("drain_backlog") != "success":
            break
    seconds = time.monotonic() - started
    check = accounting(services_for(setup.dsn, setup.servers), pipeline)
    return {"seconds": round(seconds, 3), "dag_runs": runs, "rows": check["output_rows"],
            "exact": check["exact"] and check["produced"] == setup.records, "peak_rss_mib": {}}


def _timed_verify(setup: Setup, pipeline: PipelineConfig, *args: str) -> dict[str, Any]:
    """`kafka-ledger verify` of the pipeline in a process of its own: wall time, peak resident memory, report."""
    command = [str(Path(sys.executable).with_name("kafka-ledger")), "verify", pipeline.name, "--json", *args]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakRss({"verify": process.pid}) as rss:
        out, err = process.communicate()
    seconds = time.monotonic() - started
    if process.returncode != 0:
        raise RuntimeError(f"kafka-ledger verify exited {process.returncode}: {out[-2000:]} {err[-2000:]}")
    (report,) = json.loads(out)["pipelines"]
    return {"mode": report["mode"], "seconds": round(seconds, 2), "peak_rss_mib": rss.peak_mib["verify"],
            "kafka_records": report["kafka_records"], "rows": report["output_rows"] + report["dead_letters"],
            "checked_batches": report["checked_batches"], "ok": report["ok"]}


def run_verify(setup: Setup, partitions: int, extra: int) -> list[dict[str, Any]]:
    """Ingest the whole topic (batches capped per partition), then time `verify --full`, and an incremental
    verify after `extra` more records were ingested as one more batch."""
    pipeline = _pipeline(setup, f"bench_verify_{uuid.uuid4().hex[:8]}", "exactly_once")

    def ingest() -> int:
        batches = 0
        while (planned := plan_next_batch(services_for(setup.dsn, setup.servers), pipeline)).batch_id is not None:
            run_batch(pipeline, planned.batch_id, services_for(setup.dsn, setup.servers))
            batches += 1
        return batches

    started = time.monotonic()
    lines: list[dict[str, Any]] = [{"ingested": setup.records, "batches": ingest(),
                                    "ingest_seconds": round(time.monotonic() - started, 1)}]
    lines.append({"records": setup.records, **_timed_verify(setup, pipeline, "--full")})
    produce(setup.servers, setup.topic, extra, partitions)
    lines.append({"ingested": extra, "batches": ingest()})
    lines.append({"records": setup.records + extra, **_timed_verify(setup, pipeline)})
    return lines


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarise(setup: Setup, rounds: list[dict[str, Any]], partitions: int) -> dict[str, Any]:
    kl = [r["kafka_ledger"]["seconds"] for r in rounds]
    summary: dict[str, Any] = {
        "records": setup.records, "partitions": partitions, "rounds": len(rounds), "runtime": setup.runtime,
        "kafka_ledger_seconds": _median(kl),
        "kafka_ledger_records_per_s": round(setup.records / statistics.median(kl)) if kl else None,
    }
    exact = all(r["kafka_ledger"]["exact"] for r in rounds)
    if rounds and all("entity" in r for r in rounds):
        summary["entity_seconds"] = _median([r["entity"]["seconds"] for r in rounds])
        summary["ratio_entity_vs_append"] = _median([r["entity"]["seconds"] / r["kafka_ledger"]["seconds"]
                                                    for r in rounds])
        summary["entity_keys"] = setup.entity_keys
        exact = exact and all(r["entity"]["exact"] for r in rounds)
    for peer in ("python_peer", "spark_peer", "floor", "postgres_sink"):
        if all(peer in r for r in rounds) and rounds:
            summary[f"{peer}_seconds"] = _median([r[peer]["seconds"] for r in rounds])
            short = peer.split("_")[0]
            summary[f"ratio_vs_{short}"] = _median([r["kafka_ledger"]["seconds"] / r[peer]["seconds"] for r in rounds])
            exact = exact and all(r[peer]["exact"] for r in rounds)
    if rounds and all("cdc" in r for r in rounds):
        summary["cdc_seconds"] = _median([r["cdc"]["seconds"] for r in rounds])
        summary["cdc_append_seconds"] = _median([r["cdc_append"]["seconds"] for r in rounds])
        summary["ratio_cdc_vs_append"] = _median([r["cdc"]["seconds"] / r["cdc_append"]["seconds"] for r in rounds])
        summary["ratio_cdc_vs_w1"] = _median([r["cdc"]["seconds"] / r["kafka_ledger"]["seconds"] for r in rounds])
        summary.update(cdc_keys=setup.cdc_keys, cdc_records=setup.cdc_records, cdc_table=setup.cdc_table)
        exact = exact and all(r["cdc"]["exact"] and r["cdc_append"]["exact"] for r in rounds)
    fmt = setup.registered_format
    if fmt and rounds and all(f"kafka_ledger_{fmt}" in r for r in rounds):
        ours, peer = f"kafka_ledger_{fmt}", f"python_{fmt}_peer"
        summary[f"{ours}_seconds"] = _median([r[ours]["seconds"] for r in rounds])
        summary[f"ratio_{fmt}_vs_json"] = _median([r[ours]["seconds"] / r["kafka_ledger"]["seconds"]
                                                   for r in rounds])
        exact = exact and all(r[ours]["exact"] for r in rounds)
        if all(peer in r for r in rounds):
            summary[f"{peer}_seconds"] = _median([r[peer]["seconds"] for r in rounds])
            summary[f"ratio_{fmt}_vs_python_{fmt}"] = _median([r[ours]["seconds"] / r[peer]["seconds"]
                                                               for r in rounds])
            exact = exact and all(r[peer]["exact"] for r in rounds)
    if rounds and all("floor" in r for r in rounds):
        for part in ("kafka_read_seconds", "copy_seconds"):
            summary[f"floor_{part}"] = _median([r["floor"][part] for r in rounds])
    for key, source in (("kafka_ledger_stages", lambda r: r["kafka_ledger"].get("stages")),
                        ("spark_stages", lambda r: r.get("spark_stages"))):
        measured = [source(r) for r in rounds if source(r)]
        if measured:
            summary[key] = {stage: _median([m[stage] for m in measured if stage in m]) for stage in measured[0]}
    if len(rounds) > 1:  # the first batch of a run (after a server restart with --after-restart) against warm ones
        summary["first_round_seconds"] = rounds[0]["kafka_ledger"]["seconds"]
        summary["ratio_first_vs_warm"] = round(kl[0] / statistics.median(kl[1:]), 3)
    peaks: dict[str, int] = {}
    for r in rounds:
        for name, mib in r["kafka_ledger"]["peak_rss_mib"].items():
            peaks[name] = max(peaks.get(name, 0), mib)
    summary["peak_rss_mib"] = peaks
    summary["exact"] = exact
    return summary


def _clean_up(setup: Setup, admin: AdminClient) -> None:
    for pipeline in list(setup.pipelines):
        _remove_pipeline(setup, pipeline)
    with ledger.transaction(LedgerDatabase(setup.dsn)) as cur:
        for table in setup.tables:
            cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{table}")
    if setup.lake_tables:
        from kafka_ledger.sinks.iceberg import catalogs as lake

        catalog = lake.reader("lake")
        for table in setup.lake_tables:
            catalog.purge_table(tuple(table.split(".")[1:]))
    for topic in filter(None, (setup.topic, setup.registered_topic, setup.cdc_topic)):
        admin.delete_topics([topic])[topic].result(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure kafka-ledger's data path against hand-written peers.")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=18)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--peers", action="store_true", help="also run the Python and the Spark peer each round")
    parser.add_argument("--stages", action="store_true",
                        help="also time the Spark side alone each round (connect runtime): the Kafka read, the "
                             "decode, the transfer to the task")
    parser.add_argument("--after-restart", action="store_true",
                        help="restart the local stack's Spark Connect server before the first round (the stack warms "
                             "it up after a start unless KL_SPARK_CONNECT_WARM_UP=0)")
    parser.add_argument("--small", action="store_true", help=f"time a {SMALL_BATCH:,}-record batch (sets --records)")
    parser.add_argument("--runtime", choices=["connect", "submit"],
                        help="Spark runtime of kafka-ledger (default: the deployment's, $KAFKA_LEDGER_SPARK_RUNTIME)")
    parser.add_argument("--cap", type=int, default=CAP_DEFAULT, help="max records per partition (one batch)")
    parser.add_argument("--airflow", action="store_true",
                        help="drain the topic through the pipeline DAG (dag.test()), capped by --cap, each round")
    parser.add_argument("--verify", action="store_true",
                        help="ingest the topic (batches of --cap per partition), then time `kafka-ledger verify "
                             "--full`, and an incremental verify after one more batch of --verify-extra records")
    parser.add_argument("--verify-extra", type=int, default=SMALL_BATCH, help="records of the batch after --full")
    parser.add_argument("--sink", choices=["postgres", "iceberg"], default="postgres",
                        help="where kafka-ledger publishes; iceberg: a table of the stack's lake, and with --peers the "
                             "Spark peer appends to the lake too, and kafka-ledger's Postgres sink runs each round "
                             "beside it (no Python peer or floor: they write Postgres)")
    parser.add_argument("--entity-keys", type=int,
                        help="N distinct user ids in the records, and each round an entity table keyed by user_id "
                             "(write: upsert) beside the append pipeline")
    parser.add_argument("--freshness", action="store_true",
                        help="the freshness benchmark (tools/freshness.py): --rate records/s for --minutes while the "
                             "pipeline runs by its doorbell under a dedicated Airflow, beside a Spark Structured "
                             "Streaming peer on the same topic")
    parser.add_argument("--rate", type=float, default=6000, help="--freshness: records per second (default 6000)")
    parser.add_argument("--minutes", type=float, default=10, help="--freshness: minutes of load (default 10)")
    peer = parser.add_mutually_exclusive_group()
    peer.add_argument("--no-peer", action="store_true", help="--freshness: without the streaming peer")
    peer.add_argument("--peer-after", action="store_true",
                      help="--freshness: the streaming peer in a turn of its own after kafka-ledger's (the same rate, "
                           "minutes and warm-up into its own topic), with the Spark Connect server stopped meanwhile "
                           "so that it has the cluster's cores: when the machine cannot carry both at the rate")
    parser.add_argument("--busy-cores", type=int, default=0,
                        help="--freshness: keep this many cores busy beside the benchmark all along (a CPU hog each: "
                             "a shared machine's neighbours)")
    parser.add_argument("--format", choices=["json", "avro", "protobuf"], default="json",
                        help="avro or protobuf: the records also as Avro or Protobuf values on a second topic, "
                             "kafka-ledger run on both each round, and with --peers the Python peer with "
                             "AvroDeserializer or ProtobufDeserializer instead of the others")
    parser.add_argument("--cdc", type=int, metavar="KEYS",
                        help="also --records Debezium change events over KEYS keys on a second topic (a snapshot, "
                             "60 %% updates, 10 %% deletes, 10 %% creates, a second snapshot), and each round an "
                             "entity table of them (envelope: debezium) and a pipeline appending the same events as "
                             "rows: ratio_cdc_vs_append")
    parser.add_argument("--cdc-table", choices=["customers", "typed"], default="customers",
                        help="--cdc's source table: customers (five columns), or the wide typed table of PostgreSQL's "
                             "everyday types (tools/cdc.py: dates, timestamps, times, numerics, bytea, uuid, json, "
                             "arrays...), one update in three leaving its TOASTed note unchanged")
    parser.add_argument("--scrape", type=int, metavar="PIPELINES",
                        help="the Prometheus endpoint's cost instead: PIPELINES pipelines of --partitions partitions "
                             "each, scraped --rounds times over HTTP (tools/scrape_benchmark.py)")
    parser.add_argument("--sizes", action="store_true",
                        help="the size benchmark instead (tools/size_benchmark.py): W1, 2 M, a 10 M backlog drained "
                             "in batches of --cap records a partition (default here 100,000) and 50,000 records over "
                             "1,000 partitions, --rounds times each in the same run: records/s against W1's, peak "
                             "memory")
    parser.add_argument("--pipelines", type=int, metavar="PIPELINES",
                        help="many pipelines on one Airflow instead (tools/pipelines_benchmark.py): PIPELINES doorbell "
                             "pipelines of --partitions partitions each, their DAG file's processing time, the "
                             "triggerer's CPU while idle, `kafka-ledger status` and the page timed --rounds times")
    parser.add_argument("--carrier-cycles", type=int, metavar="PIPELINES",
                        help="a carrier's cycles instead (tools/carrier_benchmark.py): PIPELINES pipelines of "
                             "--partitions partitions, --records records each before each of --rounds cycles")
    parser.add_argument("--load-minutes", type=float, default=0.0,
                        help="--pipelines: then a load of --rate-per-pipeline records/s into every pipeline for this "
                             "long, carried by their carrier: the freshness p99, the triggerer's CPU, exact")
    parser.add_argument("--rate-per-pipeline", type=float, default=50.0, help="--load-minutes: records/s a pipeline")
    parser.add_argument("--keep", action="store_true", help="keep the topic, tables and ledger rows")
    parser.add_argument("--delivery-mode", choices=["exactly_once", "at_least_once"], default="exactly_once",
                        help="at_least_once: with spark-submit, the Spark job appends to the output table directly")
    args = parser.parse_args(argv)
    # Airflow's logging, imported with the Spark hooks, writes to stdout: stdout is kept for the JSON lines.
    stdout, sys.stdout = sys.stdout, sys.stderr

    def report(line: dict[str, Any]) -> None:
        print(json.dumps(line), file=stdout, flush=True)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.scrape:
        from tools.scrape_benchmark import run_scrape_benchmark

        summary = run_scrape_benchmark(kafka_client().servers, ledger_database().url, args.scrape, args.partitions,
                                       max(args.rounds, 1))
        report(summary)
        return 0 if summary["exact"] else 1
    if args.carrier_cycles:
        from tools.carrier_benchmark import run_carrier_benchmark

        summary = run_carrier_benchmark(kafka_client().servers, ledger_database().url, args.carrier_cycles,
                                        args.partitions, args.records, max(args.rounds, 1))
        report(summary)
        return 0 if summary["exact"] else 1
    if args.pipelines:
        from tools.pipelines_benchmark import run_pipelines_benchmark

        summary = run_pipelines_benchmark(kafka_client().servers, ledger_database().url, args.pipelines,
                                          args.partitions, max(args.rounds, 1), args.load_minutes,
                                          args.rate_per_pipeline)
        report(summary)
        return 0 if summary["ok"] else 1
    if args.sizes:
        from tools.size_benchmark import BACKLOG_CAP, run_sizes

        summary = run_sizes(kafka_client().servers, ledger_database().url, args.runtime or deployment_spark_runtime(),
                            max(args.rounds, 1), BACKLOG_CAP if args.cap == CAP_DEFAULT else args.cap, report,
                            keep=args.keep)
        report(summary)
        return 0 if summary["exact"] else 1
    if args.freshness:
        from tools.freshness import run_freshness

        summary = run_freshness(kafka_client().servers, ledger_database().url, args.rate, args.minutes, args.partitions,
                                peer="none" if args.no_peer else "after" if args.peer_after else "beside",
                                busy_cores=args.busy_cores)
        report(summary)
        return 0 if summary["exact"] else 1
    records = SMALL_BATCH if args.small else args.records
    servers, dsn = kafka_client().servers, ledger_database().url
    run_id = uuid.uuid4().hex[:8]
    topic = f"bench-{run_id}"
    runtime = args.runtime or deployment_spark_runtime()
    setup = Setup(servers, dsn, topic, records, args.cap, runtime, Path(tempfile.mkdtemp(prefix="kl-benchmark-")),
                  sink=args.sink, entity_keys=args.entity_keys,
                  registered_topic=f"{topic}-{args.format}" if args.format != "json" else None,
                  registered_format=args.format if args.format != "json" else None,
                  cdc_topic=f"{topic}-cdc" if args.cdc else None, cdc_keys=args.cdc, cdc_table=args.cdc_table)
    admin = AdminClient(kafka_for(servers).confluent())
    for name in filter(None, (topic, setup.registered_topic, setup.cdc_topic)):
        create_topic(admin, name, args.partitions)
    # Warm, as a worker is: the Airflow connection look-up imported once (the runtimes are imported above), and
    # the Spark Connect client started once, so that the first round times the server, not this process's
    # start-up (a fresh task process's own start-up is measured with --airflow).
    if runtime == "connect":
        from kafka_ledger.runtimes.connect.batch import client_session, close_session, configure

        client = client_session(str(uuid.uuid4()))
        configure(client)
        close_session(client, release_session=True)
    load_before = os.getloadavg()[0]  # the 1-minute load average as the run starts, and as it ends
    try:
        rate = produce(servers, topic, records, args.partitions, args.entity_keys or 5000)
        report({"produced": records, "partitions": args.partitions, "produce_records_per_s": round(rate)})
        if setup.registered_topic and setup.registered_format:
            rate = produce_registered(servers, setup.registered_topic, records, args.partitions,
                                      setup.registered_format, args.entity_keys or 5000)
            report({f"produced_{setup.registered_format}": records, "produce_records_per_s": round(rate)})
        if setup.cdc_topic and setup.cdc_keys:
            rate, setup.cdc_records = produce_cdc(servers, setup.cdc_topic, records, setup.cdc_keys, setup.cdc_table)
            report({"produced_cdc": setup.cdc_records, "events": records, "keys": setup.cdc_keys,
                    "cdc_table": setup.cdc_table,
                    "produce_records_per_s": round(rate)})
        if args.verify:
            lines = run_verify(setup, args.partitions, args.verify_extra)
            for line in lines:
                report(line)
            return 0 if all(line.get("ok", True) for line in lines) else 1
        declared = None
        if args.after_restart:
            # Round 1's pipeline is declared before the restart, as a deployment's pipelines are: the stack's
            # warm-up (unless KL_SPARK_CONNECT_WARM_UP=0) reads its newest records.
            declared = round_pipeline(setup, args.delivery_mode)
            stack_command("restart-spark-connect")
        rounds = []
        for round_no in range(args.rounds):
            contender = (run_under_airflow(setup, round_no) if args.airflow else run_kafka_ledger(
                setup, declared if declared and round_no == 0 else round_pipeline(setup, args.delivery_mode)))
            result: dict[str, Any] = {"round": round_no + 1, "kafka_ledger": contender}
            if args.entity_keys:
                result["entity"] = run_kafka_ledger(setup, round_pipeline(setup, args.delivery_mode, write="upsert"))
            if setup.cdc_topic:
                result["cdc_append"] = run_kafka_ledger(setup, round_pipeline(setup, args.delivery_mode, cdc=True))
                result["cdc"] = run_kafka_ledger(setup, round_pipeline(setup, args.delivery_mode, write="upsert",
                                                                       cdc=True))
            fmt = setup.registered_format
            if fmt:
                result[f"kafka_ledger_{fmt}"] = run_kafka_ledger(setup, round_pipeline(setup, args.delivery_mode,
                                                                                       value_format=fmt))
                if args.peers:
                    result[f"python_{fmt}_peer"] = run_python_peer(setup, round_no, fmt)
            if args.stages and runtime == "connect" and not args.airflow and args.sink == "postgres":
                result["spark_stages"] = run_spark_stages(setup, contender)
            if args.peers and args.sink == "iceberg":
                result["postgres_sink"] = run_kafka_ledger(setup, round_pipeline(setup, args.delivery_mode, "postgres"))
                result["spark_peer"] = run_spark_peer(setup, round_no)
            elif args.peers and not setup.registered_topic:
                result["python_peer"] = run_python_peer(setup, round_no)
                result["spark_peer"] = run_spark_peer(setup, round_no)
                if not args.airflow:
                    result["floor"] = run_floor(setup, round_no, contender["table"])
            rounds.append(result)
            report(result)
        summary = summarise(setup, rounds, args.partitions)
        summary["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        summary["commit"] = git_commit()
        if args.airflow:
            summary.update(cap_per_partition=args.cap, under_airflow=True,
                           dag_runs=rounds[0]["kafka_ledger"]["dag_runs"])
    finally:
        if not args.keep:
            _clean_up(setup, admin)
    report(summary)
    return 0 if summary["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
