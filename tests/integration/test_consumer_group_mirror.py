"""Positions mirrored into a Kafka consumer group: written after commits, never able to fail or undo one."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer
from integration_support import catch_up, cli, good_value

from kafka_ledger.batch.commit import mirror_positions
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import kafka_for
from kafka_ledger.kafka import consumer_group
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger

pytestmark = pytest.mark.integration


def ledger_positions(dsn, pipeline) -> dict:
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        return ledger.positions(cur, pipeline.name)


def test_a_mirror_kafka_refuses_leaves_the_commit_standing_and_verify_reports_it(
    dsn, servers, pipeline_factory, producer, services
):
    pipeline = pipeline_factory("mirror", partitions=2)
    topic, group = pipeline.topics[0], pipeline.mirror_consumer_group
    producer.send(topic, [good_value(i) for i in range(30)])
    catch_up(dsn, servers, pipeline)

    assert mirror_positions(services, pipeline) is True
    ends = {tp: o.end for tp, o in kafka_offsets.partition_offsets(kafka_for(servers), [topic]).items()}
    assert consumer_group.read_positions(kafka_for(servers), group) == ledger_positions(dsn, pipeline) == ends
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        last = {r.topic_partition: r.last_batch_id for r in ledger.position_rows(cur, pipeline.name)}
    assert set(last.values()) and all(batch is not None for batch in last.values())

    # A live member in the group: Kafka refuses offsets from outside it. The next batch commits all the same.
    member = Consumer({"bootstrap.servers": servers, "group.id": group, "enable.auto.commit": False})
    member.subscribe([topic])
    deadline = time.monotonic() + 60
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.5)
    assert member.assignment(), "the consumer never joined the group"
    try:
        producer.send(topic, [good_value(i) for i in range(30, 40)])
        second = catch_up(dsn, servers, pipeline)
        assert second.status == "committed"
        assert mirror_positions(services, pipeline) is False
        moved = {tp: o.end for tp, o in kafka_offsets.partition_offsets(kafka_for(servers), [topic]).items()}
        assert ledger_positions(dsn, pipeline) == moved != ends

        # verify: the data is fine (exit 0), and the group that lags the ledger is reported, partition by partition.
        code, data, err = cli("verify", pipeline.name)
        (report,) = data["pipelines"]
        assert code == 0 and report["ok"], (report, err)
        assert report["mirror_differences"] == [
            f"{tp}: ledger {moved[tp]}, group {ends[tp]}" for tp in sorted(moved) if moved[tp] != ends[tp]]
        assert any(f"consumer group {group!r} differs from the ledger" in w for w in report["warnings"])
    finally:
        member.close()

    # Retried with the next commit: the whole set of positions is written again.
    producer.send(topic, [good_value(i) for i in range(40, 45)], partition=0)
    catch_up(dsn, servers, pipeline)
    assert mirror_positions(services, pipeline) is True
    assert consumer_group.read_positions(kafka_for(servers), group) == ledger_positions(dsn, pipeline)
    code, data, _ = cli("verify", pipeline.name)
    assert code == 0 and data["pipelines"][0]["mirror_differences"] == []
