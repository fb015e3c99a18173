"""The demo: produce ad impressions (some malformed), run the pipeline's DAG twice, then let its doorbell run it; or,
with `--cdc`, let Debezium capture a source table's changes and compare the entity table with it.

With `--format avro` the impressions are Avro, written by Confluent's AvroSerializer through the stack's schema
registry; a second version of their schema (a field added with a default) is registered before the first run, and
the output is checked value by value against Kafka's records decoded by Confluent's AvroDeserializer.

`bash scripts/demo.sh` sets up the stack, then runs `python -m tools.demo` from the project root, which ends
with one JSON line counted from Kafka and the output (Postgres, or with `--sink iceberg` the lake's table):
{"produced": N, "output_rows": M, "dead_letters": D, "duplicates": 0, "lag": 0, ...}
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_ledger.config.pipeline import PipelineConfig, get_pipeline
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import kafka_client, kafka_for, task_services
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ops.metrics import KAFKA_CACHE_SECONDS
from kafka_ledger.ops.readback import kafka_record_ids, lag
from kafka_ledger.ops.verify import verify_pipeline
from tools import prometheus

log = logging.getLogger("tools.demo")

# The demo's pipeline for each sink (config/pipelines.yaml): the same topic into a Postgres table, or into the lake;
# and the Avro impressions' pipeline.
DEMO_PIPELINES = {"postgres": "impressions", "iceberg": "impressions_lake"}
# The Avro and the Protobuf impressions' pipelines.
REGISTERED_PIPELINES = {"avro": "impressions_avro", "protobuf": "impressions_protobuf"}
DEMO_PARTITIONS = 18  # the reference deployment in the Spark + Kafka integration talk
COUNTRIES = ["ES", "FR", "DE", "GB", "US", "BR", "MX", "IN", "JP", "IT"]
DEVICES = ["android", "ios", "desktop", "tablet"]


def ensure_topic(servers: str, topic: str, partitions: int) -> None:
    """Create the topic if it does not exist (idempotent)."""
    admin = AdminClient(kafka_for(servers).confluent())
    if topic in admin.list_topics(timeout=10).topics:
        return
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result()
    log.info("created topic %s with %d partitions", topic, partitions)


def impression_events(count: int, rng: random.Random, malformed_ratio: float = 0.02) -> Iterator[
    tuple[bytes | None, bytes | None]
]:
    """(key, value) pairs of JSON ad impressions; about `malformed_ratio` of them are bad on purpose."""
    start = datetime.now(UTC) - timedelta(hours=1)
    for _ in range(count):
        user = f"user-{rng.randrange(50_000)}"
        event = {
            "impression_id": uuid.UUID(int=rng.getrandbits(128)).hex,
            "ad_id": f"ad-{rng.randrange(2_000)}",
            "campaign_id": rng.randrange(1, 300),
            "user_id": user,
            "country": rng.choice(COUNTRIES),
            "device": rng.choice(DEVICES),
            "bid_price": round(rng.uniform(0.01, 3.0), 4),
            "clicked": rng.random() < 0.03,
            "event_time": (start + timedelta(milliseconds=rng.randrange(3_600_000))).isoformat(),
        }
        key = user.encode()
        if rng.random() >= malformed_ratio:
            yield key, json.dumps(event).encode()
            continue
        kind = rng.randrange(5)
        if kind == 0:
            yield key, json.dumps(event).encode()[:-7]  # truncated JSON
        elif kind == 1:
            del event["impression_id"]
            yield key, json.dumps(event).encode()  # required field missing
        elif kind == 2:
            event["bid_price"] = "cheap"
            yield key, json.dumps(event).encode()  # wrong type
        elif kind == 3:
            yield key, b"\xff\xfe" + json.dumps(event).encode()  # not UTF-8
        else:
            yield key, None  # tombstone


def produce_impressions(servers: str, topic: str, count: int, seed: int) -> None:
    """Produce `count` impressions with an idempotent producer (no duplicates from producer retries)."""
    producer = Producer(kafka_for(servers).confluent(**{"enable.idempotence": True, "linger.ms": 20}))
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:  # noqa: ANN001 - confluent-kafka callback
        if err is not None:
            failures.append(str(err))

    for key, value in impression_events(count, random.Random(seed)):
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.5)
        producer.poll(0)
    producer.flush(60)
    if failures:
        raise RuntimeError(f"{len(failures)} impressions were not delivered: {failures[0]}")
    log.info("produced %d impressions to %s", count, topic)


# The Avro impressions' schema, version 1; version 2 adds `placement` with a default.
IMPRESSION_V1 = {"type": "record", "name": "Impression", "namespace": "demo.ads", "fields": [
    {"name": "impression_id", "type": "string"},
    {"name": "ad_id", "type": "string"},
    {"name": "campaign_id", "type": "long"},
    {"name": "geo", "type": {"type": "record", "name": "Geo", "fields": [
        {"name": "country", "type": "string"}, {"name": "region", "type": ["null", "string"], "default": None}]}},
    {"name": "device", "type": {"type": "enum", "name": "Device", "symbols": [d.upper() for d in DEVICES]}},
    {"name": "bid_price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 4}},
    {"name": "clicked", "type": "boolean"},
    {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}
IMPRESSION_V2 = {**IMPRESSION_V1, "fields": [*IMPRESSION_V1["fields"],
                                             {"name": "placement", "type": "string", "default": "feed"}]}
PLACEMENTS = ["feed", "story", "search"]


def registered_impression(rng: random.Random, start: datetime, fields: set[str]) -> dict:
    """An Avro or Protobuf impression's fields (`placement` when the schema has it)."""
    from decimal import Decimal

    event = {
        "impression_id": uuid.UUID(int=rng.getrandbits(128)).hex, "ad_id": f"ad-{rng.randrange(2_000)}",
        "campaign_id": rng.randrange(1, 300), "geo": {"country": rng.choice(COUNTRIES), "region": None},
        "device": rng.choice(DEVICES).upper(), "bid_price": Decimal(rng.randrange(100, 30_000)) / 10_000,
        "clicked": rng.random() < 0.03,
        "event_time": start + timedelta(milliseconds=rng.randrange(3_600_000)),
    }
    if "placement" in fields:
        event["placement"] = rng.choice(PLACEMENTS)
    return event


def produce_registered_impressions(servers: str, topic: str, count: int, seed: int, schema: dict | str) -> None:
    """`count` Avro impressions written with `schema` by Confluent's AvroSerializer (which registers it under
    `<topic>-value`), or Protobuf ones by its ProtobufSerializer (`schema` a .proto text); about 2% bad on purpose:
    not framed, an unknown schema id, a truncated payload, a tombstone."""

    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_ledger.config.settings import schema_registry

    if isinstance(schema, str):
        encode = protobuf_serializer(topic, schema)
        fields = {"placement"} if "placement" in schema else set()
    else:
        avro = AvroSerializer(schema_registry().client(), json.dumps(schema))
        context = SerializationContext(topic, MessageField.VALUE)
        fields = {f["name"] for f in schema["fields"]}

        def encode(event: dict) -> bytes:
            return avro(event, context)

    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(hours=1)
    producer = Producer(kafka_for(servers).confluent(**{"enable.idempotence": True, "linger.ms": 20}))
    for _ in range(count):
        user = f"user-{rng.randrange(50_000)}"
        event = registered_impression(rng, start, fields)
        value: bytes | None = encode(event)
        if rng.random() < 0.02:
            bad = rng.randrange(4)
            value = (json.dumps({"impression_id": event["impression_id"]}).encode(),  # not framed
                     b"\x00" + (2**31 - 1).to_bytes(4, "big") + value[5:],  # an id the registry does not know
                     value[:7],  # truncated
                     None)[bad]  # a tombstone
        while True:
            try:
                producer.produce(topic, key=user.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.5)
        producer.poll(0)
    producer.flush(60)
    log.info("produced %d %s impressions to %s", count, "Protobuf" if isinstance(schema, str) else "Avro", topic)


# The Protobuf impressions' schema, version 1 (.proto text); version 2 adds `placement`. A bid is a string holding
# its decimal text, read exactly into decimal(10,4).
IMPRESSION_PROTO_V1 = """syntax = "proto3";
package demo.ads;
import "google/protobuf/timestamp.proto";
enum Device { ANDROID = 0; IOS = 1; DESKTOP = 2; TABLET = 3; }
message Impression {
  string impression_id = 1;
  string ad_id = 2;
  int64 campaign_id = 3;
  message Geo { string country = 1; optional string region = 2; }
  Geo geo = 4;
  Device device = 5;
  string bid_price = 6;
  bool clicked = 7;
  google.protobuf.Timestamp event_time = 8;
}
"""
IMPRESSION_PROTO_V2 = IMPRESSION_PROTO_V1.replace("  google.protobuf.Timestamp event_time = 8;\n",
                                                  "  google.protobuf.Timestamp event_time = 8;\n"
                                                  "  string placement = 9;\n")


def impression_class(text: str) -> type:
    """The Impression message's class of a schema version, built from its text (no generated code)."""
    from kafka_ledger.formats.protobuf import message_class

    return message_class(text, "demo.ads.Impression")


def protobuf_serializer(topic: str, text: str) -> Any:
    """Confluent's ProtobufSerializer of a schema version (it registers it under `<topic>-value` on first use): a
    function of an impression's fields to its framed value."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_ledger.config.settings import schema_registry

    impression = impression_class(text)
    serialize = ProtobufSerializer(impression, schema_registry().client(), {"auto.register.schemas": True})
    context = SerializationContext(topic, MessageField.VALUE)

    def encode(event: dict) -> bytes:
        message = impression(**{k: v for k, v in event.items() if k not in ("geo", "event_time", "bid_price",
                                                                              "device")},
                             bid_price=str(event["bid_price"]), device=event["device"])
        message.geo.country = event["geo"]["country"]
        message.event_time.FromDatetime(event["event_time"])
        return serialize(message, context)

    return encode


def register_schema(topic: str, schema: dict) -> int:
    """Register `schema` as the newest version of subject `<topic>-value`; its id."""
    from confluent_kafka.schema_registry import Schema

    from kafka_ledger.config.settings import schema_registry

    return schema_registry().client().register_schema(f"{topic}-value", Schema(json.dumps(schema), "AVRO"))


def wrong_registered_values(services: Services, pipeline: PipelineConfig) -> int:
    """Output rows whose values differ from their Kafka record decoded by Confluent's AvroDeserializer (with the
    newest schema as its reader, as the demo's batches had), or for Protobuf values by its ProtobufDeserializer (with
    version 2's class): kafka-ledger's decoding checked independently."""
    from decimal import Decimal

    import psycopg2
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_ledger.config.settings import schema_registry

    client = schema_registry().client()
    topic = pipeline.topics[0]
    if pipeline.value.format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        protobuf = ProtobufDeserializer(impression_class(IMPRESSION_PROTO_V2), {"use.deprecated.format": False})

        def deserialize(value: bytes, context: SerializationContext) -> dict:
            message = protobuf(value, context)
            return {"impression_id": message.impression_id, "ad_id": message.ad_id,
                    "campaign_id": message.campaign_id, "geo": {"country": message.geo.country},
                    "device": message.DESCRIPTOR.fields_by_name["device"].enum_type.values_by_number[
                        message.device].name,
                    "bid_price": message.bid_price, "clicked": message.clicked,
                    "event_time": message.event_time.ToDatetime(tzinfo=UTC), "placement": message.placement}
    else:
        reader = client.get_latest_version(f"{topic}-value").schema
        deserialize = AvroDeserializer(client, reader.schema_str)
    with psycopg2.connect(services.ledger.libpq()) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT kafka_partition, kafka_offset, impression_id, ad_id, campaign_id, user_id, country, "
                    f"device, bid_price, clicked, event_time, placement FROM {pipeline.qualified_output_table}")
        rows = {(r[0], r[1]): r[2:] for r in cur.fetchall()}
    conn.close()
    consumer = Consumer(services.kafka.confluent(**{"group.id": f"demo-check-{uuid.uuid4().hex}",
                                                     "enable.auto.commit": False}))
    ends = kafka_offsets.partition_offsets(services.kafka, [topic])
    consumer.assign([TopicPartition(tp.topic, tp.partition, o.log_start) for tp, o in ends.items()])
    wrong, seen, total = 0, 0, sum(o.end - o.log_start for o in ends.values())
    while seen < total:
        message = consumer.poll(10)
        if message is None:
            raise RuntimeError(f"Kafka gave {seen} of {total} records back")
        if message.error():
            continue
        seen += 1
        row = rows.get((message.partition(), message.offset()))
        if row is None:
            continue  # a dead letter: verify accounts for it
        event = deserialize(message.value(), SerializationContext(topic, MessageField.VALUE))
        expected = (event["impression_id"], event["ad_id"], event["campaign_id"], message.key().decode(),
                    event["geo"]["country"], event["device"], Decimal(event["bid_price"]), event["clicked"],
                    event["event_time"], event["placement"])
        wrong += row != expected
    consumer.close()
    return wrong


def run_until_caught_up(pipeline: PipelineConfig, max_runs: int = 20) -> int:
    """Run the pipeline's DAG (dag.test: real tasks, real Spark) until its lag is 0; returns runs made."""
    from kafka_ledger.airflow.dags import run_pipeline_dag  # Airflow is heavy: imported when the demo runs

    services = task_services()
    for run in range(1, max_runs + 1):
        outcome = run_pipeline_dag(pipeline)
        if outcome.state != "success":
            raise RuntimeError(f"DAG run {outcome.run_id} of {pipeline.dag_id} ended {outcome.state}: {outcome.tasks}")
        remaining = lag(services.ledger, services.kafka, pipeline)
        log.info("run %d (%s): tasks %s; lag now %d", run, outcome.run_id, outcome.tasks, remaining)
        if remaining == 0:
            return run
    raise RuntimeError(f"{pipeline.dag_id} still lags after {max_runs} runs")


def ring_the_doorbell(pipeline: PipelineConfig, records: int, seed: int) -> dict[str, object]:
    """The doorbell under the stack's own Airflow (scheduler and triggerer, `scripts/stack.sh airflow`): unpause the
    pipeline's DAG, produce `records` impressions, and time the run the doorbell starts; the DAG is left paused or
    unpaused as it was found. Returns what it saw."""
    from tools.airflow_server import stack_airflow  # the stack's Airflow: started when the demo asks for it

    with stack_airflow() as airflow:
        airflow.wait_for_dag(pipeline.dag_id, timeout=180)
        was_paused = airflow.dag(pipeline.dag_id)["is_paused"]
        before = len(airflow.runs(pipeline.dag_id, "asset_triggered"))
        airflow.set_paused(pipeline.dag_id, False)
        try:
            # Unpaused, the hourly schedule's latest run starts at once: let it end before the impressions come.
            time.sleep(3)
            airflow.wait_until_idle(pipeline.dag_id, timeout=300)
            produce_impressions(kafka_client().servers, pipeline.topics[0], records, seed)
            produced_at = time.monotonic()
            log.info("produced %d impressions: waiting for the doorbell's run (the first ring after unpausing waits "
                     "for the DAG's next parse, which registers its watcher with the triggerer)", records)
            started = airflow.wait_for_runs(pipeline.dag_id, "asset_triggered", count=before + 1, timeout=300)
            run_started_after = time.monotonic() - produced_at
            # Published once the ledger's positions reach Kafka's end offsets (the run then carries on a while,
            # looking for more: docs/how-it-works.md#carrying-runs).
            services = task_services()
            while lag(services.ledger, services.kafka, pipeline) and time.monotonic() - produced_at < 300:
                time.sleep(0.2)
            published_after = time.monotonic() - produced_at
            run = airflow.wait_for_run(pipeline.dag_id, started[-1]["dag_run_id"], timeout=600)
            if run["state"] != "success":
                raise RuntimeError(f"the doorbell's run {run['dag_run_id']} ended {run['state']}:\n"
                                   + airflow.describe_run(pipeline.dag_id, run["dag_run_id"]))
            airflow.wait_until_idle(pipeline.dag_id, timeout=300)
            runs = len(airflow.runs(pipeline.dag_id, "asset_triggered")) - before
        finally:
            airflow.set_paused(pipeline.dag_id, was_paused)
    log.info("the doorbell rang: its run started %.1f s after the impressions were produced and had published them "
             "%.1f s after (its run in the Airflow UI: `scripts/stack.sh airflow`, then http://127.0.0.1:%s/dags/%s)",
             run_started_after, published_after, os.environ.get("KL_AIRFLOW_PORT"), pipeline.dag_id)
    return {"doorbell_runs": runs, "doorbell_run_started_after_s": round(run_started_after, 1),
            "doorbell_published_after_s": round(published_after, 1)}


@dataclass(frozen=True)
class CapturedTable:
    """A source table of the CDC demo (cdc.public.<table>), the pipeline of its entity table, and how Debezium's
    connector writes it (tools/cdc.Capture's settings)."""

    pipeline: str
    table: str
    connector: str
    capture: dict[str, Any]
    create: Callable[[Any, str], None]
    # The rows its snapshot reads (made before the connector starts), then a round of changes: (made, next free id).
    snapshot: Callable[[Any, str, random.Random, int], Counter]
    change: Callable[[Any, str, random.Random, int, int], tuple[Counter, int]]
    # Its rows by id as the source holds them, and as the entity table (schema-qualified) holds them.
    source_rows: Callable[[Any, str], dict]
    output_rows: Callable[[Any, str], dict]


def _captured_tables() -> list[CapturedTable]:
    from tools import cdc

    def customers_snapshot(cur: Any, table: str, rng: random.Random, changes: int) -> Counter:
        cdc.populate_source(cur, table, changes)
        return Counter(insert=changes)

    def typed_snapshot(cur: Any, table: str, rng: random.Random, changes: int) -> Counter:
        return cdc.change_typed_source(cur, table, rng, changes, next_id=1)[0]

    return [
        # Numerics as text, no schemas: as many deployments set their connector.
        CapturedTable("customers", "customers", "kafka-ledger-demo-customers", {}, cdc.create_source_table,
                      customers_snapshot, cdc.change_source, cdc.source_rows,
                      cdc.source_rows),
        # Debezium's and the JsonConverter's defaults (schemas, numerics as unscaled bytes), intervals as text.
        CapturedTable("everyday_types", "everyday_types", "kafka-ledger-demo-everyday-types",
                      {"value_schemas": True, "decimal_handling_mode": "precise", "interval_handling_mode": "string"},
                      cdc.create_typed_table, typed_snapshot, cdc.change_typed_source, cdc.typed_rows,
                      lambda cur, table: cdc.typed_rows(cur, table, cdc.ENTITY_SELECT)),
    ]


CDC_PIPELINES = ("customers", "everyday_types")


def change_data_capture(changes: int, seed: int) -> dict[str, object]:
    """The CDC demo (`--cdc`): Debezium on the stack's Kafka Connect captures the source tables cdc.public.customers
    and cdc.public.everyday_types (PostgreSQL's everyday types: `changes` rows or changes when it starts, its
    snapshot); two rounds of `changes` inserts, updates (leaving TOASTed values unchanged), deletes and key changes,
    each carried to Kafka and then published by runs of each table's pipeline DAG; each entity table compared with its
    source table row by row."""
    from tools import cdc

    cdc.start_worker()
    tables = {t.pipeline: _capture_table(t, changes, random.Random(f"{seed}-{t.table}")) for t in _captured_tables()}
    return {"tables": tables, "matches_source": all(t["matches_source"] for t in tables.values()),
            "exact": all(t.pop("exact") for t in tables.values())}


def _capture_table(captured: CapturedTable, changes: int, rng: random.Random) -> dict[str, Any]:
    """One source table of the CDC demo, captured, changed twice, published and compared (change_data_capture)."""
    import psycopg2
    from psycopg2 import sql as pg

    from kafka_ledger.sinks import remove_pipeline
    from tools import cdc

    pipeline = get_pipeline(captured.pipeline)
    services = task_services()
    servers = kafka_client().servers
    topic = pipeline.topics[0]
    capture = cdc.Capture(name=captured.connector, topic_prefix=topic.split(".")[0],
                          tables=(f"public.{captured.table}",), partitions=6, keep_slot=True, **captured.capture)
    source = psycopg2.connect(cdc.source_dsn())
    source.autocommit = True
    cur = source.cursor()
    made: Counter = Counter()
    # A worker started again has forgotten its connectors but kept their offsets, and the slot kept the changes
    # since: registered again, the connector goes on where it was.
    fresh = capture.failed() or not (capture.exists() or capture.slot_exists())
    if fresh:
        # A first demo (or one whose capture is gone or failed): the source table, its topic and the pipeline start
        # afresh.
        log.info("starting the capture afresh: source table cdc.public.%s, topic %s, pipeline %s", captured.table,
                 topic, pipeline.name)
        capture.remove()  # its replication slot and publication, if a connector of that name left them
        admin = AdminClient(services.kafka.confluent())
        if topic in admin.list_topics(timeout=10).topics:
            admin.delete_topics([topic])[topic].result()
            time.sleep(2)  # the broker forgets the topic before Debezium creates it again
        with psycopg2.connect(services.ledger.libpq()) as conn, conn.cursor() as ledger_cur:
            remove_pipeline(ledger_cur, pipeline)
        conn.close()
        captured.create(cur, captured.table)
        captured.snapshot(cur, captured.table, rng, changes)
        expected = len(captured.source_rows(cur, captured.table))  # Debezium's snapshot: a read event per row
        capture.start_afresh()
    else:
        expected = cdc.records_in(servers, topic)
        capture.register()
    dag_runs = 0
    for _ in range(2):
        cur.execute(pg.SQL("SELECT coalesce(max(id), 0) + 1 FROM {}").format(pg.Identifier(captured.table)))
        changed, _ = captured.change(cur, captured.table, rng, changes, cur.fetchone()[0])
        made.update(changed)
        expected += cdc.events_of(changed)
        log.info("changed the source table %s (%s): waiting for Debezium's %d events on %s", captured.table,
                 ", ".join(f"{n} {kind}s" for kind, n in sorted(changed.items())), expected, topic)
        cdc.wait_for_records(servers, topic, expected, timeout=300)
        dag_runs += run_until_caught_up(pipeline)
    caught_up = time.time()
    source_rows = captured.source_rows(cur, captured.table)
    source.close()
    with psycopg2.connect(services.ledger.libpq()) as conn, conn.cursor() as out:
        output_rows = captured.output_rows(out, pipeline.qualified_output_table)
        out.execute("SELECT count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s", (pipeline.name,))
        dead_letters = out.fetchone()[0]
    conn.close()
    report = verify_pipeline(services, pipeline, full=True)
    remaining = lag(services.ledger, services.kafka, pipeline)
    seen_lag = prometheus_lag(pipeline, caught_up)
    differing = sorted(key for key in source_rows.keys() | output_rows.keys()
                       if source_rows.get(key) != output_rows.get(key))
    if differing:
        log.error("the entity table of %s differs from the source table at id(s) %s", pipeline.name, differing[:20])
    return {"events": expected, "changes": dict(sorted(made.items())), "source_rows": len(source_rows),
            "output_rows": len(output_rows), "dead_letters": dead_letters, "lag": remaining,
            "verify_ok": report.ok, "dag_runs": dag_runs, "matches_source": not differing, "prometheus_lag": seen_lag,
            "exact": report.ok and remaining == 0 and dead_letters == 0 and not differing and seen_lag == 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the kafka-ledger demo end to end.")
    parser.add_argument("--first", type=int, default=40_000, help="impressions produced before the first run")
    parser.add_argument("--second", type=int, default=25_000, help="impressions produced before the second run")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the generator")
    parser.add_argument("--format", choices=["json", *REGISTERED_PIPELINES], default="json",
                        help="the impressions' format: JSON (default), or Avro through the stack's schema registry "
                             f"(pipeline {REGISTERED_PIPELINES['avro']}: version 1 of the schema, then version 2 with "
                             "a field added with a default, registered before the first run; the output checked value "
                             "by value against Confluent's AvroDeserializer), or the same as Protobuf (pipeline "
                             f"{REGISTERED_PIPELINES['protobuf']}, Confluent's ProtobufSerializer and "
                             "ProtobufDeserializer)")
    parser.add_argument("--sink", choices=sorted(DEMO_PIPELINES), default="postgres",
                        help="where the rows go: the Postgres table of pipeline impressions (default), or the Iceberg "
                             "table of pipeline impressions_lake, counted back without Spark (pyiceberg)")
    parser.add_argument("--doorbell", type=int, default=5_000, metavar="N",
                        help="then N impressions more, published by the run the pipeline's doorbell starts under the "
                             "stack's own Airflow (scheduler and triggerer; started for the while if it is not "
                             "running); 0: no doorbell (default 5000)")
    parser.add_argument("--cdc", type=int, nargs="?", const=2_000, default=None, metavar="CHANGES",
                        help="instead: change data capture. Debezium (the stack's Kafka Connect) captures the source "
                             "tables cdc.public.customers and cdc.public.everyday_types (PostgreSQL's everyday types); "
                             "two rounds of CHANGES (default 2000) inserts, updates, deletes and key changes, each "
                             f"published by runs of pipelines {' and '.join(CDC_PIPELINES)}; each entity table "
                             "compared with its source table row by row (`matches_source`)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    if args.cdc is not None:
        summary = change_data_capture(args.cdc, seed)
        exact = summary.pop("exact")
        sys.stdout.flush()
        print(json.dumps({**summary, "seed": seed}, default=str), flush=True)
        return 0 if exact else 1

    if args.format != "json" and args.sink != "postgres":
        parser.error(f"--format {args.format}: the demo's {args.format} pipeline publishes into Postgres "
                     "(--sink postgres)")
    pipeline = get_pipeline(REGISTERED_PIPELINES.get(args.format) or DEMO_PIPELINES[args.sink])
    servers = kafka_client().servers
    topic = pipeline.topics[0]
    ensure_topic(servers, topic, DEMO_PARTITIONS)

    versions = {"avro": (IMPRESSION_V1, IMPRESSION_V2), "protobuf": (IMPRESSION_PROTO_V1, IMPRESSION_PROTO_V2)}
    if args.format in versions:
        produce_registered_impressions(servers, topic, args.first, seed, versions[args.format][0])
        # The first batches read version 1 values with version 2 (its default for the field it adds).
        if args.format == "avro":
            register_schema(topic, IMPRESSION_V2)
        else:
            protobuf_serializer(topic, IMPRESSION_PROTO_V2)(registered_impression(random.Random(seed), datetime.now(
                UTC), {"placement"}))  # registers version 2, produces nothing
    else:
        produce_impressions(servers, topic, args.first, seed)
    first_runs = run_until_caught_up(pipeline)
    if args.format in versions:
        produce_registered_impressions(servers, topic, args.second, seed + 1, versions[args.format][1])
    else:
        produce_impressions(servers, topic, args.second, seed + 1)
    second_runs = run_until_caught_up(pipeline)
    # The lake's and the Avro demo pipelines have no doorbell: they run on their schedule only.
    doorbell = ring_the_doorbell(pipeline, args.doorbell, seed + 2) if args.doorbell and pipeline.doorbell else {}
    caught_up = time.time()

    figures = accounting(task_services(), pipeline)
    figures["prometheus_lag"] = prometheus_lag(pipeline, caught_up)
    exact = figures.pop("exact") and figures["prometheus_lag"] == 0
    if args.format in versions:
        figures["wrong_values"] = wrong_registered_values(task_services(), pipeline)
        exact = exact and figures["wrong_values"] == 0
    summary = {**figures, "pipeline": pipeline.name, "dag_runs": first_runs + second_runs, **doorbell, "seed": seed}
    sys.stdout.flush()
    print(json.dumps(summary), flush=True)
    return 0 if exact else 1


def prometheus_lag(pipeline: PipelineConfig, caught_up: float) -> int:
    """The pipeline's lag in records as the stack's Prometheus saw it in a scrape after the demo caught up (whose
    Kafka offsets, cached by the endpoint for a few seconds, were asked after that too)."""
    series = prometheus.scraped_after(f'kafka_ledger_partition_lag_records{{pipeline="{pipeline.name}"}}',
                                      since=caught_up + KAFKA_CACHE_SECONDS)
    return int(sum(value for _, value in series))


def accounting(services: Services, pipeline: PipelineConfig) -> dict[str, object]:
    """Kafka against the pipeline's output, counted from both (never from the ledger's own counters).

    `produced` is every record read back from the pipeline's topics; verify --full compares every committed range
    with the output and the dead letters. Exact: verify found nothing, nothing is left to read, and every record
    produced is a row or a dead letter.
    """
    topics = sorted({tp.topic for tp in kafka_offsets.subscribed_offsets(services.kafka, pipeline)})
    produced = len(kafka_record_ids(services.kafka, topics))
    report = verify_pipeline(services, pipeline, full=True)
    remaining = lag(services.ledger, services.kafka, pipeline)
    return {
        "produced": produced, "output_rows": report.output_rows, "dead_letters": report.dead_letters,
        "duplicates": report.duplicates, "missing": report.missing, "unexpected": report.unexpected,
        "lag": remaining,
        "exact": report.ok and remaining == 0 and produced == report.output_rows + report.dead_letters,
    }


if __name__ == "__main__":
    sys.exit(main())
