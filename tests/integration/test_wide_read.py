"""A batch of more partitions than Spark's Kafka source keeps consumers for is read wide (batch/wide_read.py): the
very rows the Kafka source reads, committed records only, each range to its end and not one offset beyond."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from integration_support import BAD_VALUES, assert_exactly_once, catch_up, cli, good_value, query

from kafka_ledger.batch import read, wide_read
from kafka_ledger.config.services import KafkaClient
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.model.ranges import OffsetRange
from kafka_ledger.ops.cli import EXIT_PROBLEMS
from tools.kafka_topics import create_topic

pytestmark = pytest.mark.integration

PARTITIONS = wide_read.WIDE_READ_PARTITIONS + 36


def _rows(frame) -> list[tuple]:
    return [tuple(row) for row in frame.orderBy("topic", "partition", "offset").collect()]


@pytest.fixture(scope="module")
def wide_topic(servers: str) -> Iterator[tuple[str, list[OffsetRange]]]:
    """A topic of 100 partitions: plain records (keys, none, tombstones, headers), an aborted and a committed
    transaction in every fifth one; the ranges skip each partition's first record and its last two."""
    topic = f"it-wide-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": servers})
    create_topic(admin, topic, PARTITIONS)
    plain = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})
    transactional = Producer({"bootstrap.servers": servers, "transactional.id": f"it-wide-{topic}"})
    transactional.init_transactions(30)
    for partition in range(PARTITIONS):
        for i in range(3 + partition % 4):
            plain.produce(topic, partition=partition, key=None if i == 1 else f"k{partition}-{i}".encode(),
                          value=None if i == 2 else f'{{"p": {partition}, "i": {i}}}'.encode(),
                          headers=[("h", f"{i}".encode()), ("empty", b"")] if i % 2 else None)
        plain.flush(30)
        if partition % 5 == 0:
            for commit in (False, True):
                transactional.begin_transaction()
                transactional.produce(topic, partition=partition, value=f"txn {commit}".encode())
                transactional.flush(30)  # on the log before the abort (an abort purges what is still queued)
                (transactional.commit_transaction if commit else transactional.abort_transaction)(30)
            plain.produce(topic, partition=partition, value=b"after the transactions")
            plain.produce(topic, partition=partition, value=b"last")
            plain.flush(30)
    ends = {tp.partition: offsets.end
            for tp, offsets in kafka_offsets.partition_offsets(KafkaClient(servers), [topic]).items()}
    ranges = [OffsetRange(topic, p, 1, ends[p] - 2) for p in range(PARTITIONS)]
    yield topic, ranges
    admin.delete_topics([topic])[topic].result(timeout=30)


def expected_records(servers: str, ranges: list[OffsetRange]) -> list[tuple[str, int, int]]:
    """Every record in the ranges but the aborted ones, as a read_uncommitted consumer sees the log (the
    transactions' markers, written by the coordinator after the commit returns, land where they land)."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "it-wide-check", "enable.partition.eof": True,
                         "isolation.level": "read_uncommitted", "fetch.wait.max.ms": 10})
    expected = []
    try:
        for r in ranges:
            consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.from_offset)])
            while (message := consumer.poll(10)) is not None and message.error() is None:
                if message.offset() >= r.until_offset:
                    break
                if message.value() != b"txn False":
                    expected.append((r.topic, r.partition, message.offset()))
    finally:
        consumer.close()
    return expected


def test_a_wide_read_gives_the_kafka_sources_very_rows_committed_only_and_within_the_ranges(spark, servers,
                                                                                              wide_topic):
    topic, ranges = wide_topic
    kafka = KafkaClient(servers)
    assert wide_read.reads_wide(ranges)
    for headers in (False, True):
        wide = _rows(read.read_ranges(spark, ranges, kafka, "it_wide", headers))
        source = _rows(spark.read.format("kafka").options(
            **read.kafka_read_options(ranges, kafka, "it_wide", headers)).load())
        assert wide == source
        assert [(row[2], row[3], row[4]) for row in wide] == expected_records(servers, ranges)
        assert not any(row[1] == b"txn False" for row in wide)  # the aborted transaction's record
        assert sum(row[1] == b"txn True" for row in wide) == PARTITIONS // 5  # the committed one's
        if headers:
            assert any(row[7] for row in wide) and any(row[7] is None for row in wide)


def test_a_range_past_its_partitions_end_fails_the_read_with_its_reason(servers, wide_topic):
    topic, ranges = wide_topic
    config = KafkaClient(servers).confluent(**{"group.id": "it-wide"})
    first = ranges[3]
    beyond = [(topic, first.partition, first.from_offset, first.until_offset + 10)]
    with pytest.raises(wide_read.WideReadError, match=rf"{topic}-3 ends at offset \d+, before the batch's range"):
        list(wide_read.read_group(config, beyond, False, 10.0))


def test_an_offset_deleted_under_the_read_fails_it_rather_than_skipping(servers):
    topic = f"it-wide-deleted-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": servers})
    create_topic(admin, topic, 1)
    producer = Producer({"bootstrap.servers": servers})
    for i in range(5):
        producer.produce(topic, partition=0, value=f"{i}".encode())
    producer.flush(30)
    deleted = admin.delete_records([KafkaTopicPartition(topic, 0, 2)])
    next(iter(deleted.values())).result(30)
    config = KafkaClient(servers).confluent(**{"group.id": "it-wide"})
    try:
        with pytest.raises(KafkaException, match="(?i)offset"):
            list(wide_read.read_group(config, [(topic, 0, 0, 5)], False, 10.0))
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)


def test_a_batch_of_many_partitions_publishes_exactly_once_and_its_status_comes_in_pages(
        dsn, servers, pipeline_factory, producer):
    """End to end in the submit runtime (a classic Spark session; the comparison above ran on Spark Connect): a
    wide batch's rows and dead letters exact, its partitions a page at a time."""
    pipeline = pipeline_factory("wide", partitions=PARTITIONS)
    topic = pipeline.topics[0]
    expected_dead = {}
    for partition in range(PARTITIONS):
        producer.send(topic, [good_value(partition * 10 + i) for i in range(2)], partition=partition)
        if partition % 9 == 0:
            value, reason = BAD_VALUES[partition % len(BAD_VALUES)]
            (landed,) = producer.send(topic, [value], partition=partition)
            expected_dead[landed] = reason
    batch = catch_up(dsn, servers, pipeline)
    assert batch.status == "committed", batch
    assert_exactly_once(dsn, servers, pipeline, expected_dead)

    code, status, _ = cli("status", pipeline.name, "--page", "2", "--page-size", "30")
    assert code == 0, status
    assert [p["partition"] for p in status["partitions"]] == list(range(30, 60))
    assert (status["page"], status["pages"], status["partitions_total"], status["partitions_lagging"]) == (2, 4, 100, 0)
    code, _, stderr = cli("status", pipeline.name, "--page", "5", "--page-size", "30")
    assert code == 2 and "page 5 does not exist" in stderr

    # Verify checks the hundred partitions together (one query, one consumer assignment), and finds what is planted
    # in any of them.
    code, verified, err = cli("verify", pipeline.name)
    assert code == 0 and verified["pipelines"][0]["ok"], (verified, err)
    assert verified["pipelines"][0]["kafka_records"] == 2 * PARTITIONS + len(expected_dead)
    table = f"{pipeline.output_schema}.{pipeline.output_table}"
    query(dsn, f"DELETE FROM {table} WHERE kafka_partition = 57 AND kafka_offset = 1")
    query(dsn, "INSERT INTO kafka_ledger.dead_letters (pipeline, kafka_topic, kafka_partition, kafka_offset, error, "
               f"batch_id) SELECT %s, kafka_topic, kafka_partition, kafka_offset, 'planted', batch_id FROM {table} "
               "WHERE kafka_partition = 63 AND kafka_offset = 0", pipeline.name)
    code, verified, err = cli("verify", pipeline.name, "--full")
    (report,) = verified["pipelines"]
    assert code == EXIT_PROBLEMS and (report["missing"], report["duplicates"]) == (1, 1), (report, err)
    assert f"{topic}-57@1" in report["problems"][0] and f"{topic}-63@0" in report["problems"][1], report
