"""Hostile topics on the real stack: transactions with aborts and markers at range edges, an empty topic."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from integration_support import good_value
from test_operator_controls import positions, verify_ok
from test_pipeline_dag import assert_exactly_once, batches

from kafka_ledger import audit
from kafka_ledger.airflow_dag import run_pipeline_dag

pytestmark = pytest.mark.integration


def transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value, partition=0)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def test_aborted_transactions_and_markers_leave_gaps_that_batches_tile_exactly(
    dsn, servers, pipeline_factory
):
    pipeline = pipeline_factory("txn", partitions=1)
    topic = pipeline.topics[0]
    producer = Producer({"bootstrap.servers": servers, "transactional.id": f"kafka-ledger-it-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    # Offsets: 0-2 committed, 3 commit marker | 4-6 aborted, 7 abort marker | 8-9 committed, 10 commit marker.
    transaction(producer, topic, [good_value(i) for i in range(3)], commit=True)
    transaction(producer, topic, [good_value(i) for i in range(3, 6)], commit=False)
    transaction(producer, topic, [good_value(i) for i in range(6, 8)], commit=True)

    # Cap 4: the first batch ends right after a commit marker, the second holds no data record at all.
    for _ in range(3):
        assert run_pipeline_dag(pipeline).state == "success"
    done = batches(dsn, pipeline)
    assert [(r.from_offset, r.until_offset) for b in done for r in b.ranges] == [(0, 4), (4, 8), (8, 11)]
    assert [(b.status, b.records_read, b.records_written) for b in done] == [
        ("committed", 3, 3), ("committed", 0, 0), ("committed", 2, 2)]
    output = audit.postgres_record_ids(dsn, pipeline).output
    assert sorted(output) == [(topic, 0, o) for o in (0, 1, 2, 8, 9)]
    assert positions(dsn, pipeline) == {(topic, 0): 11}
    assert_exactly_once(dsn, servers, pipeline, {})
    assert verify_ok(pipeline)["kafka_records"] == 5
    # Nothing new: the next run plans nothing and starts no Spark job.
    outcome = run_pipeline_dag(pipeline)
    assert outcome.tasks["plan_batch"] == "skipped" and len(batches(dsn, pipeline)) == 3


def test_an_empty_topic_plans_nothing_and_verifies(dsn, servers, pipeline_factory):
    pipeline = pipeline_factory("empty", partitions=2)
    outcome = run_pipeline_dag(pipeline)
    assert outcome.state == "success" and outcome.tasks["plan_batch"] == "skipped", outcome
    assert batches(dsn, pipeline) == []
    assert positions(dsn, pipeline) == {(pipeline.topics[0], 0): 0, (pipeline.topics[0], 1): 0}
    assert verify_ok(pipeline)["kafka_records"] == 0
