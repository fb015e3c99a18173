"""Freshness in each Spark runtime and sink: the newest published record's Kafka timestamp per partition, its age,
and the lag in seconds (how long the oldest record not yet published has waited), as `status`, the page and its API
report them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from integration_support import BAD_VALUES, good_value

from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ops.overview import pipeline_status
from kafka_ledger.runtimes import run_batch

pytestmark = pytest.mark.integration

START = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


def millis(at: datetime) -> int:
    return int(at.timestamp() * 1000)


@pytest.mark.parametrize("key", ["fresh_connect", "fresh_submit", "fresh_iceberg"])
def test_status_gives_the_newest_published_records_time_and_the_lag_in_seconds(
        dsn, servers, pipeline_factory, producer, key, services):
    pipeline = pipeline_factory(key, partitions=2)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(20)], partition=0, timestamp_ms=millis(START))
    # A dead letter newer than every published record: freshness counts what was published.
    producer.send(topic, [BAD_VALUES[0][0]], partition=0, timestamp_ms=millis(START + timedelta(minutes=5)))
    run_batch(pipeline, plan_next_batch(services, pipeline).batch_id, services)

    status = pipeline_status(services, pipeline)
    by_partition = {p["partition"]: p for p in status["partitions"]}
    assert by_partition[0]["newest_published_at"] == START and by_partition[0]["lag_seconds"] == 0.0
    assert by_partition[0]["age_seconds"] >= 3600
    # Partition 1 holds nothing: nothing published, nothing waits.
    assert (by_partition[1]["newest_published_at"], by_partition[1]["lag_seconds"]) == (None, 0.0)
    assert status["newest_published_at"] == START and status["lag_seconds"] == 0.0

    # Records wait, made about an hour ago: the lag in seconds is how long the oldest of them has waited.
    producer.send(topic, [good_value(i) for i in range(5)], partition=0, timestamp_ms=millis(START + timedelta(
        seconds=90)))
    before = datetime.now(UTC)
    status = pipeline_status(services, pipeline)
    waiting = {p["partition"]: p for p in status["partitions"]}[0]
    expected = (before - (START + timedelta(seconds=90))).total_seconds()
    assert waiting["lag"] == 5 and expected <= waiting["lag_seconds"] < expected + 60
    assert status["lag_seconds"] == waiting["lag_seconds"]

    run_batch(pipeline, plan_next_batch(services, pipeline).batch_id, services)
    status = pipeline_status(services, pipeline)
    caught_up = {p["partition"]: p for p in status["partitions"]}[0]
    assert caught_up["newest_published_at"] == START + timedelta(seconds=90) and caught_up["lag_seconds"] == 0.0
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        assert ledger.positions(cur, pipeline.name)  # the positions moved with the newest timestamps
