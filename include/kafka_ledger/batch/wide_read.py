"""Wide reads: a batch of many partitions read by a few Spark tasks, each with one Kafka consumer for all its ranges.

Spark's Kafka source gives every topic-partition a consumer of its own (its pool keeps 64), so a batch of
10,000 one-record partitions set up 10,000 consumers: 353 s. Here each task's one consumer is assigned its whole
group of ranges and fetches them together, with the Kafka source's guarantees: committed records only
(read_committed), exactly the offsets [from, until) of each range, a deleted offset or a partition that ends
short of its range fails the read, never skips. The rows have the Kafka source's columns and types, so decoding
and publishing do not know which reader read them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kafka_ledger.model.ranges import OffsetRange

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

# Beyond this many partitions in one batch, the batch is read wide: Spark's Kafka source keeps 64 consumers
# (spark.kafka.consumer.cache.capacity) and sets up a new one, about 35 ms, for every partition beyond.
WIDE_READ_PARTITIONS = 64
# An Arrow batch handed to Spark holds at most this many records, or about this many bytes of keys and values
# (records up to Kafka's message size limit must not make a batch of gigabytes).
ROWS_PER_ARROW_BATCH = 10_000
BYTES_PER_ARROW_BATCH = 32 << 20
# Records taken from the consumer at a time: a few hundred keeps what one call holds small with records of a
# megabyte, and costs small records little.
RECORDS_PER_CONSUME = 200

# Spark's Kafka source schema (KafkaRecordToRowConverter), with and without the headers column.
RECORD_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                 "timestampType int")
HEADERS_SCHEMA = ", headers array<struct<key: string, value: binary>>"


class WideReadError(RuntimeError):
    """Kafka did not deliver a range as the batch recorded it (an offset deleted, a partition ending short)."""


def reads_wide(ranges: list[OffsetRange]) -> bool:
    return len(ranges) > WIDE_READ_PARTITIONS


def range_groups(ranges: list[OffsetRange], offsets_per_task: int) -> list[list[OffsetRange]]:
    """`ranges` in groups of about `offsets_per_task` offsets (a big range alone in its group), consecutive
    partitions together, for one Spark task each."""
    total = sum(r.span for r in ranges)
    share = total / max(1, min(len(ranges), -(-total // offsets_per_task)))
    groups: list[list[OffsetRange]] = [[]]
    filled = 0
    for r in sorted(ranges):
        if groups[-1] and filled >= share:
            groups.append([])
            filled = 0
        groups[-1].append(r)
        filled += r.span
    return groups


def read_wide(spark: SparkSession, ranges: list[OffsetRange], consumer_config: dict[str, object],
              offsets_per_task: int, headers: bool = False, poll_timeout_s: float = 60.0) -> DataFrame:
    """A bounded read of exactly `ranges`, one Spark task and one consumer per group of ranges."""
    import sys

    from pyspark import cloudpickle

    # The reader travels to the executors as code, not as a name to import there: an executor's Python needs
    # confluent-kafka and pyarrow, never kafka-ledger itself (a cluster's workers do not have it installed).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    groups = range_groups(ranges, offsets_per_task)
    spec = [[(r.topic, r.partition, r.from_offset, r.until_offset) for r in group] for group in groups]
    reader = functools.partial(read_groups, consumer_config, spec, headers, poll_timeout_s)
    return (spark.range(len(groups), numPartitions=len(groups))
            .mapInArrow(reader, RECORD_SCHEMA + (HEADERS_SCHEMA if headers else "")))


def read_groups(consumer_config: dict[str, object], spec: list[list[tuple[str, int, int, int]]], headers: bool,
                poll_timeout_s: float, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In a Spark task: the records of the groups whose numbers `batches` (Spark's range column `id`) carry."""
    for batch in batches:
        for group in batch.column(0).to_pylist():
            yield from read_group(consumer_config, spec[group], headers, poll_timeout_s)


def read_group(consumer_config: dict[str, object], ranges: list[tuple[str, int, int, int]], headers: bool,
               poll_timeout_s: float) -> Iterator[pa.RecordBatch]:
    """The records of `ranges` (topic, partition, from, until: until exclusive) in Arrow batches, read by one
    consumer; fails unless every range is read to its end."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    until = {(topic, partition): end for topic, partition, _, end in ranges}
    begin = {(topic, partition): start for topic, partition, start, _ in ranges}
    last: dict[tuple[str, int], int] = {}
    consumer = Consumer({
        **consumer_config,
        "enable.auto.commit": False, "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        # An offset deleted under the read is an error, never a jump to another offset.
        "auto.offset.reset": "error",
        # The end of a partition is reported: a range ending where aborted records or transaction markers end it
        # delivers no record at its last offsets.
        "enable.partition.eof": True,
        # Every record of a range exists already: no fetch needs to wait for more.
        "fetch.wait.max.ms": 10,
    })
    rows = _Rows(headers)
    try:
        consumer.assign([TopicPartition(topic, partition, start) for topic, partition, start, _ in ranges])
        quiet_since = time.monotonic()
        while until:
            # consume() waits for all it asks for up to its timeout: a short one ends a range's tail soon.
            messages = consumer.consume(num_messages=RECORDS_PER_CONSUME, timeout=0.2)
            if messages:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > poll_timeout_s:
                left = sorted(until)
                raise WideReadError(f"Kafka sent nothing for {poll_timeout_s:.0f} s while {len(left)} range(s) were "
                                    f"unread, e.g. {left[0][0]}-{left[0][1]} from {last.get(left[0], 'its start')}")
            done: list[TopicPartition] = []
            for message in messages:
                key = (message.topic(), message.partition())
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    end = until.get(key)
                    if end is None:
                        continue
                    if message.offset() < end:
                        raise WideReadError(
                            f"{key[0]}-{key[1]} ends at offset {message.offset()}, before the batch's range ends "
                            f"({end}): the topic was truncated or recreated")
                    del until[key]
                    done.append(TopicPartition(*key))
                    continue
                if error is not None:
                    raise KafkaException(error)
                end = until.get(key)
                if end is None:  # a range read to its end already: fetched past it
                    continue
                offset = message.offset()
                if offset >= end:
                    del until[key]
                    done.append(TopicPartition(*key))
                    continue
                if offset < begin[key] or offset <= last.get(key, -1):
                    raise WideReadError(f"{key[0]}-{key[1]} delivered offset {offset} out of order (range from "
                                        f"{begin[key]}, last read {last.get(key)})")
                last[key] = offset
                rows.add(message)
                if offset == end - 1:
                    del until[key]
                    done.append(TopicPartition(*key))
            if done:
                consumer.pause(done)  # fetch no more of them
            if len(rows) >= ROWS_PER_ARROW_BATCH or rows.bytes >= BYTES_PER_ARROW_BATCH:
                yield rows.take()
        if len(rows):
            yield rows.take()
    finally:
        consumer.close()


class _Rows:
    """Records gathered as the Kafka source's columns, handed over as an Arrow batch."""

    def __init__(self, headers: bool):
        self.headers = headers
        self.columns: dict[str, list[Any]] = {name: [] for name in self._names()}
        self.bytes = 0

    def _names(self) -> list[str]:
        return ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                *(["headers"] if self.headers else [])]

    def __len__(self) -> int:
        return len(self.columns["offset"])

    def add(self, message: Any) -> None:
        columns = self.columns
        key, value = message.key(), message.value()
        columns["key"].append(key)
        columns["value"].append(value)
        self.bytes += len(key or b"") + len(value or b"")
        columns["topic"].append(message.topic())
        columns["partition"].append(message.partition())
        columns["offset"].append(message.offset())
        kind, milliseconds = message.timestamp()
        # As the Kafka source: the record's timestamp as it is (-1 where the record has none), and its type as
        # Kafka numbers them (-1 none, 0 create time, 1 log append time; confluent-kafka's are one more).
        columns["timestamp"].append(milliseconds * 1000)
        columns["timestampType"].append(kind - 1)
        if self.headers:
            found = message.headers()
            # As the Kafka source: null for a record without headers.
            columns["headers"].append([{"key": k, "value": v} for k, v in found] if found else None)

    def take(self) -> pa.RecordBatch:
        import pyarrow as pa

        types = {"key": pa.binary(), "value": pa.binary(), "topic": pa.string(), "partition": pa.int32(),
                 "offset": pa.int64(), "timestamp": pa.timestamp("us", tz="UTC"), "timestampType": pa.int32(),
                 "headers": pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))}
        batch = pa.RecordBatch.from_arrays([pa.array(self.columns[name], types[name]) for name in self._names()],
                                           names=self._names())
        self.columns = {name: [] for name in self._names()}
        self.bytes = 0
        return batch
