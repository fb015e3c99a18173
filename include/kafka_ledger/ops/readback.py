"""Reading Kafka back, independently of the pipeline: what verify compares with the rows, and the tests' tallies."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient, LedgerDatabase
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model.ranges import OffsetRange, PartitionOffsets, RecordId, TopicPartition, partition_lag
from kafka_ledger.sinks import sink_for


class KafkaReadError(RuntimeError):
    """Kafka answered a read with an error (other than reaching the partition's end)."""


# For a consumer that reads one partition at a time (partition_record_offsets): 4 MB fetches, fetched again at
# once, with a small prefetch queue read 555,000-record partitions at about 280,000 records/s in 150 MiB
# (librdkafka's defaults: 125,000/s; 16 MB fetches and the default 64 MB queue: a little faster, 340 MiB).
ONE_PARTITION_FETCH = {"max.partition.fetch.bytes": 4 << 20, "queued.max.messages.kbytes": 8 << 10,
                       "fetch.queue.backoff.ms": 0}


def readback_consumer(kafka: KafkaClient, **extra: object) -> Consumer:
    """A read_committed consumer of its own (no group offsets) that reports reaching a partition's end: every read
    here is bounded by offsets known beforehand (kafka_offsets.bounded_consumer)."""
    return kafka_offsets.bounded_consumer(kafka, "readback", **extra)


def partition_record_offsets(
    consumer: Consumer, tp: TopicPartition, from_offset: int, until_offset: int, deadline: float
) -> Iterator[int]:
    """Offsets of the committed records of one partition in [from, until), ascending, read as they stream.

    Gap-aware: transaction markers, aborted and compacted records hold no record, so the read ends at the
    first offset at or past `until` or at the partition's end, never by counting. Raises TimeoutError once
    time.monotonic() passes `deadline`.
    """
    if from_offset >= until_offset:
        return
    consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, from_offset)])
    next_offset = from_offset
    try:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {tp} [{from_offset}, {until_offset}) back from Kafka passed its deadline")
            # consume() waits for all the messages asked for (or the timeout): never ask for more than the
            # offsets left, so the last call of a range returns at once (gaps end it through the records after
            # the range or the end-of-partition event, which count as messages too).
            wanted = max(1, min(10_000, until_offset - next_offset))
            for message in consumer.consume(num_messages=wanted, timeout=1.0):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        return
                    raise KafkaReadError(f"reading {tp} back from Kafka failed: {message.error()}")
                offset = message.offset()
                if offset >= until_offset:
                    return
                next_offset = offset + 1
                yield offset
                if offset + 1 >= until_offset:
                    return
    finally:
        consumer.unassign()


def ranges_record_offsets(
    consumer: Consumer, ranges: Sequence[OffsetRange], deadline: float
) -> dict[TopicPartition, list[int]]:
    """Offsets of the committed records in each of these ranges (one per partition), ascending, read by one
    assignment of all their partitions and held: for many small ranges (see partition_record_offsets, which streams
    one). Gap-aware the same way; raises TimeoutError once time.monotonic() passes `deadline`."""
    found: dict[TopicPartition, list[int]] = {r.topic_partition: [] for r in ranges}
    if len(found) != len(ranges):
        raise ValueError("ranges_record_offsets reads one range a partition")
    remaining = {(r.topic, r.partition): r for r in ranges if r.from_offset < r.until_offset}
    next_offsets = {key: r.from_offset for key, r in remaining.items()}
    if not remaining:
        return found
    consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.from_offset) for r in remaining.values()])

    def done(key: tuple[str, int]) -> None:
        del remaining[key]
        consumer.pause([KafkaTopicPartition(*key)])  # the rest of its fetch is not wanted

    try:
        while remaining:
            if time.monotonic() > deadline:
                shown = ", ".join(str(r) for r in list(remaining.values())[:3])
                raise TimeoutError(f"reading {len(remaining)} range(s) back from Kafka ({shown}, ...) passed its "
                                   "deadline")
            # As in partition_record_offsets: never more messages than the offsets left (each range's end comes as
            # its last record, a record past it or the partition's end), so the last call returns at once.
            left = sum(remaining[key].until_offset - next_offsets[key] for key in remaining)
            for message in consumer.consume(num_messages=max(1, min(10_000, left)), timeout=1.0):
                key = (message.topic(), message.partition())
                r = remaining.get(key)
                if r is None:
                    continue
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        done(key)
                        continue
                    raise KafkaReadError(f"reading {r.topic_partition} back from Kafka failed: {message.error()}")
                offset = message.offset()
                if offset < r.until_offset:
                    found[r.topic_partition].append(offset)
                    next_offsets[key] = offset + 1
                if offset + 1 >= r.until_offset:
                    done(key)
    finally:
        consumer.unassign()
    return found


def read_back(
    kafka: KafkaClient,
    topics: list[str],
    timeout: float = 60.0,
    offsets: dict[TopicPartition, PartitionOffsets] | None = None,
) -> Iterator[Message]:
    """Every committed record currently in `topics`, read with a read_committed consumer up to the end offsets.

    `offsets`, when the caller already looked them up, saves a second look-up.
    """
    offsets = offsets if offsets is not None else kafka_offsets.partition_offsets(kafka, topics)
    ends = {(tp.topic, tp.partition): o.end for tp, o in offsets.items()}
    remaining = {(tp.topic, tp.partition) for tp, o in offsets.items() if o.end > o.log_start}
    if not remaining:
        return
    consumer = readback_consumer(kafka)
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([KafkaTopicPartition(t, p, offsets[TopicPartition(t, p)].log_start) for t, p in remaining])
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading back {', '.join(topics)} did not reach the end offsets in {timeout}s")
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                key = (message.topic(), message.partition())
                if message.error() is not None:
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading back failed: {message.error()}")
                    remaining.discard(key)  # at the end: trailing transaction markers hold no record
                    continue
                if message.offset() < ends[key]:
                    yield message
                if message.offset() + 1 >= ends[key]:
                    remaining.discard(key)
    finally:
        consumer.close()


def kafka_record_ids(
    kafka: KafkaClient,
    topics: list[str],
    timeout: float = 60.0,
    offsets: dict[TopicPartition, PartitionOffsets] | None = None,
) -> set[RecordId]:
    """The (topic, partition, offset) of every committed record currently in `topics` (see read_back)."""
    return {(m.topic(), m.partition(), m.offset()) for m in read_back(kafka, topics, timeout, offsets)}


@dataclass(frozen=True)
class PostgresRecords:
    """Kafka coordinates found in a pipeline's output table and in its dead letters."""

    output: list[RecordId]
    dead_letters: list[RecordId]


def record_ids(cur: ledger.Cursor, pipeline: PipelineConfig) -> PostgresRecords:
    """The coordinates of the pipeline's output rows (in whichever sink, read without Spark) and dead letters."""
    output = sink_for(pipeline).output_record_ids(cur)
    cur.execute(sql.SELECT_DEAD_LETTER_IDS, {"pipeline": pipeline.name})
    return PostgresRecords(output, [tuple(row) for row in cur.fetchall()])


def _lag(cur: ledger.Cursor, kafka: KafkaClient, pipeline: PipelineConfig) -> int:
    offsets = kafka_offsets.subscribed_offsets(kafka, pipeline)
    known = ledger.positions(cur, pipeline.name)
    # Partitions the ledger has not seen yet count from where the pipeline would start them.
    return sum(partition_lag(known, offsets, pipeline.start_position).values())


def postgres_record_ids(db: LedgerDatabase, pipeline: PipelineConfig) -> PostgresRecords:
    with ledger.transaction(db) as cur:
        return record_ids(cur, pipeline)


def lag(db: LedgerDatabase, kafka: KafkaClient, pipeline: PipelineConfig) -> int:
    """Offsets between the ledger positions and Kafka's read_committed end offsets, over all partitions."""
    with ledger.transaction(db) as cur:
        return _lag(cur, kafka, pipeline)
