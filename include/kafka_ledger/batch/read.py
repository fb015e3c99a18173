"""A batch's Spark read: begin an attempt, then read exactly its Kafka ranges from the ledger, committed records only.

Both Spark runtimes read here (runtimes/): the job takes a batch id, never offsets; the ranges come from the
ledger. What becomes of the records (staged, or streamed into the commit's transaction) is the runtime's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_ledger.batch import wide_read
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient, LedgerDatabase, Services
from kafka_ledger.formats.base import ValueFormat
from kafka_ledger.formats.known import value_format
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import LostDataError, OffsetRange, TopicPartition, lost_ranges
from kafka_ledger.observe import failpoints
from kafka_ledger.observe.events import AttemptStarted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Tuned options of Spark's Kafka source (measured in docs/benchmark.md).
KAFKA_READER_TUNING = {
    # Spark's Kafka reader asks the broker for the partition's offset range after every poll, and the
    # consumer has already sent its next fetch by then. At the end of a partition that fetch finds no data
    # and the broker holds it for fetch.max.wait.ms (500 ms by default); the broker answers one request per
    # connection at a time, so the offset look-up waits behind it and every task ends with a 500 ms stall.
    # A bounded read never waits for new data (its ranges end at or before the last stable offset at plan
    # time), so not waiting at all changes nothing but the stall.
    "kafka.fetch.max.wait.ms": "0",
    # Fewer polls (each followed by those two offset look-ups): a fetch of 1 MB holds ~10,000 small records.
    "kafka.max.poll.records": "10000",
    # Spark's own default is a 64 KB socket buffer; let the OS size it.
    "kafka.receive.buffer.bytes": "-1",
}


# How long Spark's Kafka consumer waits for one fetch before the read fails (Spark's default is
# spark.network.timeout, 120 s). The records of a bounded read exist and are committed: a broker that sends none
# for this long is unreachable or stuck, and the task's retry resumes the batch with the same ranges.
KAFKA_POLL_TIMEOUT_MS = 60_000
# How long one of the consumer's offset look-ups may take (default.api.timeout.ms, Kafka's default, pinned here):
# a poll that got nothing is followed by one, so a broker that stops answering mid-read fails it within
# KAFKA_POLL_TIMEOUT_MS + KAFKA_LOOKUP_TIMEOUT_MS.
KAFKA_LOOKUP_TIMEOUT_MS = 60_000


def kafka_read_options(ranges: list[OffsetRange], kafka: KafkaClient, pipeline: str, headers: bool = False
                       ) -> dict[str, str]:
    """Options of a bounded Kafka read of exactly `ranges` (ends exclusive), committed records only; with the
    records' headers if `headers` (a column reads one)."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.from_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.until_offset
    client = _reader_client(kafka)
    return {
        **client,
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
        # Offsets deleted under our feet must fail the read, never be skipped silently.
        "failOnDataLoss": "true",
        "includeHeaders": str(headers).lower(),
        "kafkaConsumer.pollTimeoutMs": str(KAFKA_POLL_TIMEOUT_MS),
        "kafka.default.api.timeout.ms": str(KAFKA_LOOKUP_TIMEOUT_MS),
        "kafka.group.id": read_group_id(pipeline, client),
    }


def _reader_client(kafka: KafkaClient) -> dict[str, str]:
    """The Kafka client settings of every read of a batch (Spark's Kafka source's names)."""
    return {**kafka.spark_options(), "kafka.isolation.level": "read_committed", **KAFKA_READER_TUNING}


def read_group_id(pipeline: str, client: dict[str, str]) -> str:
    """The group id of a pipeline's reads: the same while its Kafka client settings are the same, so a warm
    Spark reuses its pooled consumers batch after batch (partitions are assigned, never subscribed: no group
    membership, no offsets committed to Kafka); another one when they change (a rotated password, other
    servers), since Spark fails a read whose settings differ from its pooled consumer's for the same group
    and partition. The settings hold secrets: scrypt makes guessing them from a logged group id costly.
    """
    return f"kafka-ledger-{pipeline}-{_settings_fingerprint(json.dumps(client, sort_keys=True).encode())}"


# Computed once per process and settings: scrypt is slow on purpose (about 0.06 s), and a run carrying a batch a
# second would pay it every batch.
@functools.lru_cache(maxsize=16)
def _settings_fingerprint(settings: bytes) -> str:
    return hashlib.scrypt(settings, salt=b"kafka-ledger consumer group", n=2**14, r=8, p=1, dklen=6).hex()


def check_not_deleted(kafka: KafkaClient, ranges: list[OffsetRange], log_starts: dict[TopicPartition, int] | None = None
                      ) -> None:
    """Fail if retention deleted any offset of the ranges (the log start moved past a from-offset); `log_starts`:
    looked up already (a carrier's one look-up for all its members), else Kafka is asked."""
    if log_starts is None:
        log_starts = kafka_offsets.log_start_offsets(kafka, sorted({r.topic for r in ranges}))
    lost = lost_ranges(ranges, log_starts)
    if lost:
        raise LostDataError(lost)


@dataclass(frozen=True)
class Attempt:
    """One attempt at reading a batch: only the newest attempt of a batch may stage or publish it."""

    batch: ledger.Batch
    number: int
    # Whether the pipeline's columns read the records' headers.
    headers: bool = False
    # The format bound to the batch (an Avro batch's schemas); None: the pipeline's own.
    value_format: ValueFormat | None = None

    @property
    def readable(self) -> list[OffsetRange]:
        # A range can be empty when on_data_loss: skip moved it over deleted offsets: nothing to read there.
        return [r for r in self.batch.ranges if r.span > 0]


def begin(services: Services, pipeline: PipelineConfig, batch_id: int,
          log_starts: dict[TopicPartition, int] | None = None) -> Attempt | None:
    """Start the next attempt of a batch (None if it is already written or committed: nothing to read).

    Rows staged by earlier attempts are deleted first. `log_starts`: the partitions' log starts looked up already
    (check_not_deleted).
    """
    with ledger.session(services.ledger) as conn:
        with conn, conn.cursor() as cur:
            batch = ledger.pipeline_batch(cur, pipeline.name, batch_id)
        if batch.status in ("committed", "written"):
            log.info("batch %s is already %s (attempt %s staged it): nothing to read", batch_id, batch.status,
                     batch.staged_attempt)
            return None
        # A registry format's schemas, as the plan pinned them, fetched before the attempt begins: a registry away
        # fails it with nothing begun.
        fmt = value_format(pipeline)
        bound = None
        if fmt.binds:
            with conn, conn.cursor() as cur:
                pins = ledger.schema_pins(cur, batch_id)
            bound = fmt.bound(services.registry().client(), pipeline, pins, {r.topic for r in batch.ranges},
                              batch_id)
        try:
            with conn, conn.cursor() as cur:
                number = ledger.begin_attempt(cur, batch_id)
                removed = ledger.delete_older_staged(cur, pipeline, batch_id, number)
        except ledger.LedgerError:
            with conn, conn.cursor() as cur:
                batch = ledger.get_batch(cur, batch_id)
            if batch.status in ("committed", "written"):  # a racing attempt finished it meanwhile
                log.info("batch %s was %s by another attempt meanwhile: nothing to read", batch_id, batch.status)
                return None
            raise
    services.observer.notify(AttemptStarted(pipeline.name, batch_id, number, len(batch.ranges),
                                            sum(r.span for r in batch.ranges), removed))
    check_not_deleted(services.kafka, batch.ranges, log_starts)
    failpoints.hit("before_read")
    return Attempt(batch, number, pipeline.reads_headers, bound)


# Small partitions share a Spark task up to about this many offsets: each task costs ~10 ms of scheduling
# and consumer set-up, which would dominate a batch of many small partitions. Big partitions keep one task
# each (Spark's Kafka source never merges partitions by itself).
OFFSETS_PER_TASK = 25_000


def read_tasks(ranges: list[OffsetRange]) -> int | None:
    """How many Spark tasks should read `ranges`, when fewer than one per partition (else None)."""
    tasks = max(1, -(-sum(r.span for r in ranges) // OFFSETS_PER_TASK))
    return tasks if tasks < len(ranges) else None


def read_records(spark: SparkSession, attempt: Attempt, kafka: KafkaClient) -> DataFrame:
    """The attempt's records, as Spark's Kafka source reads them (a bounded read of exactly its ranges)."""
    return read_ranges(spark, attempt.readable, kafka, attempt.batch.pipeline, attempt.headers)


def read_ranges(spark: SparkSession, ranges: list[OffsetRange], kafka: KafkaClient, pipeline: str,
                headers: bool = False, wide: bool = False) -> DataFrame:
    """A bounded read of exactly `ranges` as the pipeline's batches read them (its consumer group, its tuning):
    by Spark's Kafka source, or wide (wide_read.py) when they are more partitions than its consumers, or `wide`
    (a carrier's reads: many pipelines' small ranges, runtimes/connect/carrier.py)."""
    if wide or wide_read.reads_wide(ranges):
        group = read_group_id(pipeline, _reader_client(kafka))  # the pipeline's one read group, either reader
        return wide_read.read_wide(spark, ranges, kafka.confluent(**{"group.id": group}), OFFSETS_PER_TASK,
                                   headers, KAFKA_POLL_TIMEOUT_MS / 1000)
    records = spark.read.format("kafka").options(**kafka_read_options(ranges, kafka, pipeline, headers)).load()
    tasks = read_tasks(ranges)
    return records.coalesce(tasks) if tasks else records


def mark_nothing_to_read(db: LedgerDatabase, attempt: Attempt) -> None:
    """A batch whose ranges are all empty (skipped over deleted offsets) is written with 0 records; its commit
    (batch/commit.Written) then commits it like any other, in either runtime."""
    with ledger.transaction(db) as cur:
        ledger.mark_written(cur, attempt.batch.batch_id, attempt.number, [], 0.0)
    log.info("batch %s has no offsets to read (all skipped): marked written with 0 records", attempt.batch.batch_id)
