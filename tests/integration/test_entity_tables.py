"""Entity tables (write: upsert) on the real stack: one row per key, the newest record by Kafka order, tombstones
delete, and no replay, time window, backfill or older batch moves an entity backwards; both Spark runtimes, a
compacted topic."""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from confluent_kafka import Producer
from integration_support import (
    BAD_VALUES,
    COMPACT_NOW,
    batches,
    cli,
    drain,
    pipeline_name,
    positions_equal_end_offsets,
    query,
    wait_until_compacted,
)
from psycopg2.extras import execute_values

from kafka_ledger.batch.plan import plan_batch
from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import kafka_for
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ops import readback as audit
from kafka_ledger.runtimes import run_batch
from kafka_ledger.sinks import sink_for
from kafka_ledger.sinks.postgres import sql

pytestmark = pytest.mark.integration

MALFORMED, MALFORMED_REASON = BAD_VALUES[0]
NO_KEY_REASON = "tombstone (null value) without a Kafka key"


def entity(key: str, version: int) -> bytes:
    return json.dumps({"event_id": key, "amount": version}).encode()


def model(messages) -> tuple[dict, dict, dict]:
    """What an entity table must hold after reading `messages` (Kafka's records, in any order): per key the record
    with the greatest (timestamp, topic, partition, offset), the order kafka_ledger.supersedes keeps when timestamps
    do not go back within a partition; (rows {key: (coordinates, amount)}, tombstones {key: coordinates}, dead
    letters {coordinates: reason})."""
    newest, dead = {}, {}
    for m in messages:
        at = (m.topic(), m.partition(), m.offset())
        if m.value() is None:
            if m.key() is None:
                dead[at] = NO_KEY_REASON
                continue
            key, amount = m.key().decode(), None
        elif m.value() == MALFORMED:
            dead[at] = MALFORMED_REASON
            continue
        else:
            value = json.loads(m.value())
            key, amount = value["event_id"], value["amount"]
        order = (m.timestamp()[1], *at)
        if key not in newest or order > newest[key][0]:
            newest[key] = (order, at, m.value() is None, amount)
    rows = {key: (at, amount) for key, (_, at, tombstone, amount) in newest.items() if not tombstone}
    tombstones = {key: at for key, (_, at, tombstone, _) in newest.items() if tombstone}
    return rows, tombstones, dead


def stored(dsn: str, pipeline) -> tuple[dict, dict, dict]:
    """The entity table, its tombstones and the dead letters, in model()'s shape."""
    rows = {key: ((t, p, o), amount) for key, t, p, o, amount in query(
        dsn, f"SELECT event_id, kafka_topic, kafka_partition, kafka_offset, amount FROM "
             f"{pipeline.output_schema}.{pipeline.output_table}")}
    tombstones = {key: (t, p, o) for key, t, p, o in query(
        dsn, f"SELECT event_id, kafka_topic, kafka_partition, kafka_offset FROM {sql.TOMBSTONES_SCHEMA}."
             f"{pipeline.name}")}
    dead = {(t, p, o): error for t, p, o, error in query(
        dsn, "SELECT kafka_topic, kafka_partition, kafka_offset, error FROM kafka_ledger.dead_letters "
             "WHERE pipeline = %s", pipeline.name)}
    return rows, tombstones, dead


def assert_matches_kafka(dsn: str, servers: str, pipeline) -> dict:
    expected = model(audit.read_back(kafka_for(servers), pipeline.topics))
    assert stored(dsn, pipeline) == expected
    positions_equal_end_offsets(dsn, servers, pipeline)
    return expected[0]


def produce(servers: str, topic: str, records: list[tuple[str | None, bytes | None, int | None]]) -> None:
    """(key, value, partition) in order; partition None: Kafka's own choice by key."""
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
    for key, value, partition in records:
        producer.produce(topic, key=key.encode() if key is not None else None, value=value,
                         **({"partition": partition} if partition is not None else {}))
        producer.poll(0)
    assert producer.flush(30) == 0


# spark-submit's twin in the long lane: the merge is Postgres's whichever runtime staged the batch, and the default
# run merges spark-submit's batches of Debezium's events (test_debezium.py, with replays and a backfill).
@pytest.mark.parametrize("key", ["entity_connect", pytest.param("entity_submit", marks=pytest.mark.long)])
def test_an_entity_table_holds_the_newest_record_per_key_whatever_is_replayed(
        dsn, servers, pipeline_factory, key, services):
    pipeline = pipeline_factory(key, partitions=3)
    topic = pipeline.topics[0]
    started = datetime.now(UTC) - timedelta(seconds=1)
    keys = [f"user-{i}" for i in range(12)]
    # Three versions of every key, interleaved; tombstones for four keys, one of which comes back; one key moves to
    # another partition (an explicit one) with a later version; a tombstone without a key; a malformed value.
    records = [(k, entity(k, version), None) for version in (1, 2, 3) for k in keys]
    records += [(k, None, None) for k in keys[:4]]
    records += [(keys[0], entity(keys[0], 4), None), (None, None, 0), ("user-x", MALFORMED, 1)]
    produce(servers, topic, records)
    drain(dsn, servers, pipeline)
    rows = assert_matches_kafka(dsn, servers, pipeline)
    assert {k: amount for k, (_, amount) in rows.items()} == {keys[0]: 4, **{k: 3 for k in keys[4:]}}
    middle = datetime.now(UTC)

    # Moves and more versions after the first catch-up; the moved key's versions go to every partition.
    moving = keys[5]
    produce(servers, topic, [(moving, entity(moving, 10 + p), p) for p in range(3)] + [(keys[6], None, None)])
    drain(dsn, servers, pipeline)
    rows = assert_matches_kafka(dsn, servers, pipeline)
    assert rows[moving][1] == 12 and keys[6] not in rows

    # A replay of the oldest offsets, a time window and a backfill over the first minutes: older records, no entity
    # moves back.
    code, data, err = cli("replay", pipeline.name, *[f"--range={topic}:{p}:0:5" for p in range(3)],
                          "--reason", "old range")
    assert code == 0, (data, err)
    code, data, err = cli("replay", pipeline.name, "--from", started.isoformat(), "--to", middle.isoformat())
    assert code == 0, (data, err)
    # An Airflow backfill run of the first hour, as its plan task plans one (its data interval), then its Spark work.
    backfill = plan_batch(services, pipeline, dag_id=pipeline.dag_id, run_id="backfill__entity",
                          requested_by="backfill", backfill_window=(started, middle))
    assert backfill.batch_id is not None and not backfill.resumed
    run_batch(pipeline, backfill.batch_id, services)
    assert [b.kind for b in batches(dsn, pipeline)][-3:] == ["offset_ranges", "time_window", "backfill"]
    assert all(b.status == "committed" for b in batches(dsn, pipeline))
    assert_matches_kafka(dsn, servers, pipeline)

    code, data, err = cli("verify", pipeline.name, "--full")
    assert code == 0, (data, err)
    assert any("entity table" in w for w in data["pipelines"][0]["warnings"])


def test_an_entity_table_on_a_compacted_topic(dsn, servers, pipeline_factory):
    """Kafka keeps the newest record of each key; the table ends the same whether the reads saw the older ones."""
    # Tombstones kept an hour: a consumer that reads a deleted key's tombstone later than delete.retention.ms misses
    # the delete (Kafka's rule for every consumer, documented in configuration.md#entity-tables).
    pipeline = pipeline_factory("entity_compacted", partitions=1,
                                topic_config={**COMPACT_NOW, "delete.retention.ms": "3600000"})
    topic = pipeline.topics[0]
    keys = [f"a{i}" for i in range(5)]
    # Each step in a segment of its own (segment.ms is 100): the next one rolls it, and the cleaner may take it.
    produce(servers, topic, [(k, entity(k, 0), 0) for k in keys])           # offsets 0-4, read before compaction
    drain(dsn, servers, pipeline)
    for step in ([(k, entity(k, 1), 0) for k in keys],                       # offsets 5-9, never read
                 [(k, entity(k, 2), 0) for k in keys],                       # offsets 10-14
                 [(keys[0], None, 0)],                                       # offset 15: a0 deleted
                 [("filler", entity("filler", 0), 0)]):                      # offset 16
        produce(servers, topic, step)
        time.sleep(0.3)
    wait_until_compacted(servers, topic, [(topic, 0, offset) for offset in range(5, 10)])
    drain(dsn, servers, pipeline)
    rows, tombstones, _ = stored(dsn, pipeline)
    assert rows == {**{k: ((topic, 0, 10 + i), 2) for i, k in enumerate(keys) if i}, "filler": ((topic, 0, 16), 0)}
    assert tombstones == {keys[0]: (topic, 0, 15)}
    assert [(r.from_offset, r.until_offset) for b in batches(dsn, pipeline) for r in b.ranges] == [
        (0, 5), (5, 12), (12, 17)]


def test_the_merge_keeps_the_newest_record_whatever_order_batches_commit_in(dsn):
    """The merge's SQL against a model: random batches of three partitions' records, committed in a random order with
    replays between them; timestamps never go back within a partition, ties across partitions included; rows
    without a key (a Debezium delete's Kafka tombstone) change nothing."""
    pipeline = get_pipeline(pipeline_name("entity_merge"))
    sink = sink_for(pipeline)
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        sink.prepare(cur)
    rng = random.Random(20261125)
    columns = list(sink.published_columns())
    start = datetime(2026, 11, 25, tzinfo=UTC)
    records = []
    for partition in range(3):
        at = start
        for offset in range(60):
            at += timedelta(seconds=rng.choice([0, 1, 2]))
            tombstone = rng.random() < 0.2
            # A row without its key (a Debezium delete's Kafka tombstone) changes nothing.
            no_key = tombstone and rng.random() < 0.3
            records.append({"event_id": None if no_key else f"k{rng.randrange(8)}",
                            "amount": None if tombstone else offset,
                            "price": None, "ok": None, "event_time": None, "kafka_topic": "t",
                            "kafka_partition": partition, "kafka_offset": offset, "kafka_timestamp": at,
                            "batch_id": 1, "kafka_tombstone": tombstone})
    newest = {}
    for r in records:
        order = (r["kafka_timestamp"], r["kafka_topic"], r["kafka_partition"], r["kafka_offset"])
        if r["event_id"] is None:
            continue
        if r["event_id"] not in newest or order > newest[r["event_id"]][0]:
            newest[r["event_id"]] = (order, r)
    expected = {k: (r["kafka_partition"], r["kafka_offset"]) for k, (_, r) in newest.items()
                if not r["kafka_tombstone"]}
    buried = {k: (r["kafka_partition"], r["kafka_offset"]) for k, (_, r) in newest.items() if r["kafka_tombstone"]}
    table = f"{pipeline.output_schema}.{pipeline.output_table}"
    for _ in range(20):
        query(dsn, f"TRUNCATE {table}, {sql.TOMBSTONES_SCHEMA}.{pipeline.name}")
        batches_ = []
        for partition in range(3):
            cuts = [0, *sorted(rng.sample(range(1, 60), 4)), 60]
            batches_ += [[r for r in records if r["kafka_partition"] == partition and a <= r["kafka_offset"] < b]
                         for a, b in zip(cuts, cuts[1:], strict=False)]
        rng.shuffle(batches_)
        for batch in batches_ + [rng.choice(batches_) for _ in range(5)]:
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.execute(sql.create_incoming_table(pipeline, sink_for(pipeline).envelope.extra_columns))
                execute_values(cur, f"INSERT INTO {sql.INCOMING_TABLE} ({', '.join(columns)}) VALUES %s",
                               [tuple(r[c] for c in columns) for r in batch])
                for _, statement in sql.merge_entities(pipeline):
                    cur.execute(statement)
            conn.close()
        assert {k: (p, o) for k, p, o in query(dsn, f"SELECT event_id, kafka_partition, kafka_offset FROM {table}")} \
            == expected
        assert {k: (p, o) for k, p, o in query(
            dsn, f"SELECT event_id, kafka_partition, kafka_offset FROM {sql.TOMBSTONES_SCHEMA}.{pipeline.name}")} \
            == buried
