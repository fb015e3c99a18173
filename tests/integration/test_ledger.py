"""Planning and committing against the real Kafka and Postgres, and the rules the database itself enforces."""

from __future__ import annotations

import time

import psycopg2
import psycopg2.errors
import pytest
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from integration_support import RecordedProducer, good_value, output_count, stage_rows

from kafka_ledger.batch.commit import CommitError, Written, commit
from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import services_for
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model.ranges import LostDataError, OffsetRange
from kafka_ledger.runtimes import run_batch

pytestmark = pytest.mark.integration


def test_plan_fails_naming_the_lost_ranges_when_retention_deleted_unread_data(
        dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("lost", partitions=2)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(100)], partition=0)
    producer.send(topic, [good_value(i) for i in range(10)], partition=1)
    planned = plan_next_batch(services, pipeline)
    assert planned.ranges == [OffsetRange(topic, 0, 0, 100), OffsetRange(topic, 1, 0, 10)]
    # Retention deletes offsets 0..39 of partition 0 before the batch is read.
    deleted = KafkaTopicPartition(topic, 0, 40)
    admin = AdminClient({"bootstrap.servers": servers})  # keep a reference until the future resolves
    admin.delete_records([deleted])[deleted].result(timeout=30)

    with pytest.raises(LostDataError) as raised:
        plan_next_batch(services, pipeline)

    assert raised.value.lost == [OffsetRange(topic, 0, 0, 40)]
    assert f"{topic}-0 [0, 40)" in str(raised.value)
    # The read, before it begins, finds the same (the log start offsets looked up again).
    with pytest.raises(LostDataError) as raised:
        run_batch(pipeline, planned.batch_id, services)
    assert raised.value.lost == [OffsetRange(topic, 0, 0, 40)]
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        assert set(ledger.positions(cur, pipeline.name).values()) == {0}  # no offset moved


def test_latest_start_position_skips_history_and_reads_what_follows(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("latest", partitions=2)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(20)], partition=0)

    assert plan_next_batch(services, pipeline).batch_id is None
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        assert {tp.partition: pos for tp, pos in ledger.positions(cur, pipeline.name).items()} == {0: 20, 1: 0}

    producer.send(topic, [good_value(i) for i in range(5)], partition=0)
    planned = plan_next_batch(services, pipeline)
    assert planned.ranges == [OffsetRange(topic, 0, 20, 25)]


def test_partitions_added_between_runs_start_at_the_log_start(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("partitions", partitions=1)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(3)], partition=0)
    first = plan_next_batch(services, pipeline)
    assert first.ranges == [OffsetRange(topic, 0, 0, 3)]
    # Forget it: this test is about planning only.
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM kafka_ledger.batches WHERE batch_id = %s", (first.batch_id,))

    admin = AdminClient({"bootstrap.servers": servers})  # keep a reference until the future resolves
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
    RecordedProducer(servers).send(topic, [good_value(i) for i in range(4)], partition=2)  # fresh metadata

    planned = plan_next_batch(services, pipeline)
    assert planned.ranges == [OffsetRange(topic, 0, 0, 3), OffsetRange(topic, 2, 0, 4)]


def test_commit_refuses_a_moved_position_and_writes_nothing(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("cas", partitions=1)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(10)])
    planned = plan_next_batch(services, pipeline)
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        attempt = ledger.begin_attempt(cur, planned.batch_id)
        stage_rows(cur, pipeline, planned.batch_id, attempt, planned.ranges)
        # Someone else (a zombie run, a hand-made fix) moved the position since the batch was planned.
        cur.execute("UPDATE kafka_ledger.positions SET position = 4 WHERE pipeline = %s", (pipeline.name,))

    with pytest.raises(CommitError, match=rf"compare-and-set.*{topic}-0: ledger position 4, batch starts at 0"):
        commit(services, pipeline, planned.batch_id, Written())

    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        assert output_count(cur, pipeline) == 0
        batch = ledger.get_batch(cur, planned.batch_id)
        assert batch.status == "written" and "compare-and-set" in batch.last_error
        cur.execute("SELECT count(*) FROM kafka_ledger.committed_ranges WHERE pipeline = %s", (pipeline.name,))
        assert cur.fetchone()[0] == 0
        cur.execute("UPDATE kafka_ledger.positions SET position = 0 WHERE pipeline = %s", (pipeline.name,))

    result = commit(services, pipeline, planned.batch_id, Written())  # with the position restored, it commits
    assert (result.already_committed, result.records_written) == (False, 10)
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        assert output_count(cur, pipeline) == 10
        assert ledger.positions(cur, pipeline.name)[planned.ranges[0].topic_partition] == 10


def test_commit_refuses_a_batch_that_was_not_written(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("unwritten", partitions=1)
    producer.send(pipeline.topics[0], [good_value(0)])
    planned = plan_next_batch(services, pipeline)
    with pytest.raises(CommitError, match="is planned, not written"):
        commit(services, pipeline, planned.batch_id, Written())


@pytest.fixture
def ledger_cursor(dsn):
    """A cursor in a transaction that is rolled back after the test."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.rollback()
        conn.close()


def test_database_refuses_overlapping_committed_ranges(ledger_cursor):
    cur = ledger_cursor
    cur.execute("INSERT INTO kafka_ledger.batches (pipeline, status) VALUES ('db_rules', 'planned') RETURNING batch_id")
    batch_id = cur.fetchone()[0]
    insert = (
        "INSERT INTO kafka_ledger.committed_ranges (pipeline, topic, partition, from_offset, until_offset, batch_id) "
        "VALUES ('db_rules', 't', 0, %s, %s, %s)"
    )
    cur.execute(insert, (0, 100, batch_id))
    cur.execute(insert, (100, 200, batch_id))  # adjacent: fine
    cur.execute("SAVEPOINT s")
    with pytest.raises(psycopg2.errors.ExclusionViolation):
        cur.execute(insert, (150, 250, batch_id))
    cur.execute("ROLLBACK TO SAVEPOINT s")
    with pytest.raises(psycopg2.errors.ExclusionViolation):
        cur.execute(insert, (50, 60, batch_id))


def test_database_allows_one_unfinished_batch_per_pipeline(ledger_cursor):
    cur = ledger_cursor
    cur.execute("INSERT INTO kafka_ledger.batches (pipeline, status) VALUES ('db_rules', 'failed')")
    with pytest.raises(psycopg2.errors.UniqueViolation):
        cur.execute("INSERT INTO kafka_ledger.batches (pipeline, status) VALUES ('db_rules', 'planned')")


def test_a_held_pipeline_lock_fails_the_plan_after_its_bound_naming_the_holder(
    dsn, servers, pipeline_factory, producer, monkeypatch, services
):
    pipeline = pipeline_factory("locked", partitions=1)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(5)], partition=0)
    hung = psycopg2.connect(dsn, application_name="hung-commit")  # a commit stuck with its transaction open
    try:
        with hung.cursor() as cur:
            cur.execute(f"SELECT pg_advisory_xact_lock({sql.PIPELINE_LOCK_KEY})", {"pipeline": pipeline.name})
        monkeypatch.setenv("KAFKA_LEDGER_DB_LOCK_TIMEOUT", "2")
        started = time.monotonic()
        with pytest.raises(ledger.LedgerError) as raised:
            plan_next_batch(services_for(dsn, servers), pipeline)  # services with the deployment's bounds of now
        assert 1.5 < time.monotonic() - started < 30
        message = str(raised.value)
        assert f"pipeline {pipeline.name!r}: waited 2 s for its ledger lock" in message
        assert f"pid {hung.get_backend_pid()} (hung-commit, idle in transaction" in message
        assert "Nothing was written" in message
    finally:
        hung.close()
    monkeypatch.delenv("KAFKA_LEDGER_DB_LOCK_TIMEOUT")
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM kafka_ledger.batches WHERE pipeline = %s", (pipeline.name,))
        assert cur.fetchone() == (0,)
        cur.execute("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')")
        assert cur.fetchone() == ("10min", "10min")  # every ledger connection's defaults
    conn.close()
    # The holder gone, the same plan goes through.
    assert plan_next_batch(services, pipeline).ranges == [OffsetRange(topic, 0, 0, 5)]


def test_an_output_table_made_by_hand_needs_the_kafka_columns_and_is_warned_of_without_a_record_index(dsn, caplog):
    from integration_support import pipeline_name, query

    from kafka_ledger.config.pipeline import ConfigError, get_pipeline
    from kafka_ledger.sinks import sink_for

    pipeline = get_pipeline(pipeline_name("hand_made_table"))
    sink, table = sink_for(pipeline), pipeline.qualified_output_table
    columns = {name: kind.postgres_type for name, kind in sink.output_columns().items()}
    query(dsn, f"CREATE SCHEMA IF NOT EXISTS {pipeline.output_schema}; CREATE TABLE {table} (" + ", ".join(
        f"{name} {kind}" for name, kind in columns.items() if name not in ("amount", "kafka_timestamp")) + ")")

    def prepare() -> list[str]:
        caplog.clear()
        with ledger.transaction(LedgerDatabase(dsn)) as cur:
            sink.prepare(cur)
        return [r.getMessage() for r in caplog.records if "has no index leading with" in r.getMessage()]

    # A Kafka column is the table maker's to add; a declared one (amount) the commit of the next batch adds.
    with pytest.raises(ConfigError, match=r"lacks column\(s\) kafka_timestamp; add them with ALTER TABLE"):
        prepare()
    query(dsn, f"ALTER TABLE {table} ADD COLUMN kafka_timestamp {columns['kafka_timestamp']}")
    assert prepare() == [
        f"output table {table} has no index leading with (kafka_topic, kafka_partition, kafka_offset): a replay, "
        "backfill or window deletes the rows of its ranges with a scan of the whole table each; add one: CREATE "
        f'INDEX ON "{pipeline.output_schema}"."{pipeline.output_table}" (kafka_topic, kafka_partition, kafka_offset)']
    query(dsn, f"CREATE INDEX ON {table} (kafka_topic, kafka_partition, kafka_offset, batch_id)")
    assert prepare() == []


def test_two_first_plans_creating_one_output_schema_at_once_both_go_through(dsn):
    """Two pipelines' first plans into one new schema, in transactions open at the same time: the second waits for the
    first's schema instead of failing on pg_namespace's unique index (CREATE SCHEMA IF NOT EXISTS alone did)."""
    import threading
    import uuid

    from kafka_ledger.sinks.postgres.sink import ensure_schema

    schema = f"race_{uuid.uuid4().hex[:8]}"
    first, second = psycopg2.connect(dsn), psycopg2.connect(dsn)
    failures: list[BaseException] = []
    try:
        with first.cursor() as cur:
            ensure_schema(cur, schema)  # created, not committed yet

        def create_too() -> None:
            try:
                with second, second.cursor() as cur:
                    ensure_schema(cur, schema)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                failures.append(exc)

        racing = threading.Thread(target=create_too)
        racing.start()
        racing.join(1.0)
        assert racing.is_alive(), "the second creation did not wait for the first"
        first.commit()
        racing.join(30)
        assert not racing.is_alive() and failures == []
        with first, first.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,))
            assert cur.fetchone()[0] == 1
    finally:
        with first, first.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{schema}"')
        first.close()
        second.close()


def test_a_threads_kept_connection_serves_its_transactions_until_one_fails_or_is_left_open(dsn):
    db = LedgerDatabase(dsn)

    def backend() -> int:
        with ledger.transaction(db) as cur:
            cur.execute("SELECT pg_backend_pid()")
            return cur.fetchone()[0]

    assert backend() != backend()  # outside the block: a connection each
    with ledger.keeping_connections():
        first = backend()
        assert backend() == first
        with pytest.raises(ValueError), ledger.transaction(db) as cur:
            cur.execute("SELECT 1")
            raise ValueError("the block failed")
        after_error = backend()
        assert after_error != first
        with ledger.session(db) as conn:
            conn.cursor().execute("SELECT 1")  # a transaction begun, and left open
        assert backend() not in (first, after_error)
