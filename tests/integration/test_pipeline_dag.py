"""The pipeline DAG end to end on the real stack: Kafka, Postgres, spark-submit and Airflow's dag.test()."""

from __future__ import annotations

import os
from collections import Counter

import psycopg2
import pytest
from integration_support import BAD_VALUES, assert_exactly_once, batches, good_value, spark_task, stored

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.batch.commit import Written, commit
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import kafka_for
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ops import readback as audit

pytestmark = pytest.mark.integration


def test_two_runs_publish_every_record_exactly_once(dsn, servers, pipeline_factory, producer):
    pipeline = pipeline_factory("exact", partitions=4)
    topic = pipeline.topics[0]
    bad = [value for value, _ in BAD_VALUES]
    first = producer.send(topic, [good_value(i) for i in range(300)] + bad)
    expected_dead = {first[300 + i]: reason for i, (_, reason) in enumerate(BAD_VALUES)}

    outcome = run_pipeline_dag(pipeline)
    assert outcome.state == "success", outcome
    assert outcome.tasks[spark_task(pipeline)] == "success"
    assert outcome.tasks["drain_backlog"] == "skipped"  # everything fit under the cap
    assert_exactly_once(dsn, servers, pipeline, expected_dead)

    second = producer.send(topic, [good_value(i) for i in range(300, 500)] + [None])
    expected_dead[second[-1]] = "null value (tombstone)"
    assert run_pipeline_dag(pipeline).state == "success"
    assert_exactly_once(dsn, servers, pipeline, expected_dead)

    done = batches(dsn, pipeline)
    assert [b.status for b in done] == ["committed", "committed"]
    assert [b.records_read for b in done] == [305, 201]
    assert [(b.records_written, b.records_dead_lettered) for b in done] == [(300, 5), (200, 1)]
    # The two batches' ranges tile each partition from 0 to its end offset.
    ends = kafka_offsets.partition_offsets(kafka_for(servers), pipeline.topics)
    for tp, offsets in ends.items():
        spans = sorted((r.from_offset, r.until_offset) for b in done for r in b.ranges if r.topic_partition == tp)
        assert spans[0][0] == 0 and spans[-1][1] == offsets.end
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_run_without_new_data_writes_nothing_and_starts_no_spark_job(dsn, servers, pipeline_factory, producer):
    pipeline = pipeline_factory("noop", partitions=2)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(40)])
    assert run_pipeline_dag(pipeline).state == "success"
    before_batches = batches(dsn, pipeline)
    before_rows, _ = stored(dsn, pipeline)

    outcome = run_pipeline_dag(pipeline)

    assert outcome.state == "success"
    assert outcome.tasks["plan_batch"] == "skipped"
    assert outcome.tasks[spark_task(pipeline)] == "skipped"  # no Spark work at all
    assert all(state == "skipped" for state in outcome.tasks.values())
    assert batches(dsn, pipeline) == before_batches
    assert stored(dsn, pipeline)[0] == before_rows


def test_backlog_over_the_cap_drains_in_capped_batches(dsn, servers, pipeline_factory, producer):
    pipeline = pipeline_factory("drain", partitions=2)  # cap: 50 records per partition and batch
    producer.send(pipeline.topics[0], [good_value(i) for i in range(120)], partition=0)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(30)], partition=1)

    first = run_pipeline_dag(pipeline)
    assert first.state == "success"
    assert first.tasks["drain_backlog"] == "success"  # the next run was triggered, no operator needed
    runs = 1
    while audit.lag(LedgerDatabase(dsn), kafka_for(servers), pipeline) > 0:
        # dag.test() does not run the triggered run itself; run it as the scheduler would.
        assert run_pipeline_dag(pipeline).state == "success"
        runs += 1
        assert runs <= 5

    done = batches(dsn, pipeline)
    assert len(done) == 3 and runs == 3
    assert all(r.span <= 50 for b in done for r in b.ranges)
    assert [[(r.partition, r.from_offset, r.until_offset) for r in b.ranges] for b in done] == [
        [(0, 0, 50), (1, 0, 30)],
        [(0, 50, 100)],
        [(0, 100, 120)],
    ]
    assert_exactly_once(dsn, servers, pipeline, {})


def test_spark_killed_after_staging_is_retried_without_duplicates(
    dsn, servers, pipeline_factory, producer, monkeypatch, tmp_path
):
    pipeline = pipeline_factory("kill", partitions=3)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(200)] + [b"not json"])
    # SIGKILL the Spark driver once, right after it staged its rows and before it declared them written.
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "after_staging=kill")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR", str(tmp_path))

    outcome = run_pipeline_dag(pipeline)

    assert (tmp_path / "after_staging").exists(), "the fail point never fired"
    assert outcome.state == "success", outcome
    (batch,) = batches(dsn, pipeline)
    assert (batch.status, batch.attempts, batch.staged_attempt) == ("committed", 2, 2)
    dead_offset = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).dead_letters
    assert len(dead_offset) == 1
    assert_exactly_once(dsn, servers, pipeline, {dead_offset[0]: "malformed JSON (not a JSON object)"})
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM kafka_ledger_staging.{pipeline.name}")
        assert cur.fetchone()[0] == 0, "staging rows of the killed attempt leaked"


def test_failed_batch_is_resumed_with_its_recorded_ranges(dsn, servers, pipeline_factory, producer, monkeypatch):
    pipeline = pipeline_factory("resume", partitions=2)  # retries: 0, so one failure fails the run
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(60)])
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "before_read=raise")

    failed = run_pipeline_dag(pipeline)

    assert failed.state == "failed"
    assert failed.tasks[spark_task(pipeline)] == "failed"
    (batch,) = batches(dsn, pipeline)
    assert batch.status == "failed" and "Spark task failed" in batch.last_error
    planned_ranges = batch.ranges
    assert stored(dsn, pipeline)[0] == Counter()  # nothing published, no position moved
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        assert set(ledger.positions(cur, pipeline.name).values()) == {0}

    producer.send(topic, [good_value(i) for i in range(60, 90)])  # arrives while the batch is failed
    monkeypatch.delenv("KAFKA_LEDGER_FAILPOINTS")
    resumed = run_pipeline_dag(pipeline)

    assert resumed.state == "success"
    assert resumed.tasks["drain_backlog"] == "success"  # the newer records are left for the next run
    first, = batches(dsn, pipeline)
    assert first.batch_id == batch.batch_id and first.ranges == planned_ranges and first.status == "committed"
    assert first.run_id == resumed.run_id  # the resuming run owns the batch now
    assert run_pipeline_dag(pipeline).state == "success"
    assert_exactly_once(dsn, servers, pipeline, {})


def test_second_commit_of_a_batch_is_a_no_op(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("grow", partitions=2)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(50)] + [None])
    assert run_pipeline_dag(pipeline).state == "success"
    (batch,) = batches(dsn, pipeline)
    rows_before, dead_before = stored(dsn, pipeline)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        positions_before = ledger.positions(cur, pipeline.name)

    again = commit(services, pipeline, batch.batch_id, Written())

    assert again.already_committed
    assert (again.records_written, again.records_dead_lettered) == (50, 1)
    assert stored(dsn, pipeline) == (rows_before, dead_before)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        assert ledger.positions(cur, pipeline.name) == positions_before
    assert batches(dsn, pipeline) == [batch]
    assert os.environ.get("KAFKA_LEDGER_FAILPOINTS") is None
