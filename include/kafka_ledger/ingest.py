"""A batch's Spark work: read its exact Kafka ranges from the ledger, decode them, then stage or publish them.

Both Spark runtimes start here. spark-submit's job stages the rows for the commit task (`stage`); the
Spark Connect client publishes them itself, in the commit's transaction (`publish`). Either way the job
takes a batch id, never offsets: the ranges come from the ledger.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_ledger import failpoints, kafka_offsets, kafka_security, ledger, sql
from kafka_ledger.config import PipelineConfig
from kafka_ledger.planning import LostDataError, OffsetRange, PartitionReadStats, check_read_coverage, lost_ranges
from kafka_ledger.settings import jdbc_target, kafka_settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from kafka_ledger.batches import CommitResult

log = logging.getLogger("kafka_ledger.ingest_batch")

# Tuned options of Spark's Kafka source (measured in the README's Benchmark section).
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


def kafka_read_options(ranges: list[OffsetRange], servers: str, pipeline: str) -> dict[str, str]:
    """Options of a bounded Kafka read of exactly `ranges` (ends exclusive), committed records only."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.from_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.until_offset
    client = {"kafka.bootstrap.servers": servers, **kafka_security.spark_options(kafka_settings()),
              "kafka.isolation.level": "read_committed", **KAFKA_READER_TUNING}
    return {
        **client,
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
        # Offsets deleted under our feet must fail the read, never be skipped silently.
        "failOnDataLoss": "true",
        "includeHeaders": "false",
        "kafka.group.id": consumer_group(pipeline, client),
    }


def consumer_group(pipeline: str, client: dict[str, str]) -> str:
    """The group id of a pipeline's reads: the same while its Kafka client settings are the same, so a warm
    Spark reuses its pooled consumers batch after batch (partitions are assigned, never subscribed: no group
    membership, no offsets committed to Kafka); another one when they change (a rotated password, other
    servers), since Spark fails a read whose settings differ from its pooled consumer's for the same group
    and partition. The settings hold secrets: scrypt makes guessing them from a logged group id costly.
    """
    settings = json.dumps(client, sort_keys=True).encode()
    fingerprint = hashlib.scrypt(settings, salt=b"kafka-ledger consumer group", n=2**14, r=8, p=1, dklen=6).hex()
    return f"kafka-ledger-{pipeline}-{fingerprint}"


def check_not_deleted(servers: str, ranges: list[OffsetRange]) -> None:
    """Fail if retention deleted any offset of the ranges (the log start moved past a from-offset)."""
    lost = lost_ranges(ranges, kafka_offsets.partition_offsets(servers, sorted({r.topic for r in ranges})))
    if lost:
        raise LostDataError(lost)


@dataclass(frozen=True)
class Attempt:
    """One attempt at reading a batch: only the newest attempt of a batch may stage or publish it."""

    batch: ledger.Batch
    number: int

    @property
    def readable(self) -> list[OffsetRange]:
        # A range can be empty when on_data_loss: skip moved it over deleted offsets: nothing to read there.
        return [r for r in self.batch.ranges if r.span > 0]


def begin(dsn: str, servers: str, pipeline: PipelineConfig, batch_id: int) -> Attempt | None:
    """Start the next attempt of a batch (None if it is already written or committed: nothing to read).

    Rows staged by earlier attempts are deleted first.
    """
    conn = ledger.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            batch = ledger.get_batch(cur, batch_id)
        if batch.pipeline != pipeline.name:
            raise ledger.LedgerError(f"batch {batch_id} belongs to pipeline {batch.pipeline!r}, not {pipeline.name!r}")
        if batch.status in ("committed", "written"):
            log.info("batch %s is already %s (attempt %s staged it): nothing to read", batch_id, batch.status,
                     batch.staged_attempt)
            return None
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
    finally:
        conn.close()
    log.info(
        "batch %s of %s, attempt %d: reading %d range(s), %d offsets%s",
        batch_id, pipeline.name, number, len(batch.ranges), sum(r.span for r in batch.ranges),
        f" (removed {removed} rows staged by earlier attempts)" if removed else "",
    )
    check_not_deleted(servers, batch.ranges)
    failpoints.hit("before_read")
    return Attempt(batch, number)


# Small partitions share a Spark task up to about this many offsets: each task costs ~10 ms of scheduling
# and consumer set-up, which would dominate a batch of many small partitions. Big partitions keep one task
# each (Spark's Kafka source never merges partitions by itself).
OFFSETS_PER_TASK = 25_000


def read_tasks(ranges: list[OffsetRange]) -> int | None:
    """How many Spark tasks should read `ranges`, when fewer than one per partition (else None)."""
    tasks = max(1, -(-sum(r.span for r in ranges) // OFFSETS_PER_TASK))
    return tasks if tasks < len(ranges) else None


def read_records(spark: SparkSession, attempt: Attempt, servers: str) -> DataFrame:
    records = spark.read.format("kafka").options(
        **kafka_read_options(attempt.readable, servers, attempt.batch.pipeline)).load()
    tasks = read_tasks(attempt.readable)
    return records.coalesce(tasks) if tasks else records


def log_read(
    batch: ledger.Batch, attempt: int, stats: list[PartitionReadStats], read_seconds: float
) -> dict[str, object]:
    """Log what an attempt read (records, rate, dead letters, offset gaps); returns the same as a dict."""
    total = sum(s.records for s in stats)
    dead = sum(s.dead_letters for s in stats)
    gaps = sum(r.span for r in batch.ranges) - total
    log.info(
        "batch %s read: %d records in %.1fs (%.0f records/s), %d to dead letters, %d offset gap(s) "
        "(transaction markers, aborted or compacted records)",
        batch.batch_id, total, read_seconds, total / read_seconds if read_seconds else 0.0, dead, gaps,
    )
    return {"batch_id": batch.batch_id, "attempt": attempt, "records_read": total,
            "read_seconds": round(read_seconds, 3), "offset_gaps": gaps}


# --- spark-submit: stage for the commit task ------------------------------------------------------------------
def _read_stats(staged: DataFrame) -> list[PartitionReadStats]:
    """Per-partition counts of what was read, computed by Spark (for rows that skip the staging table)."""
    from pyspark.sql import functions as F

    rows = staged.groupBy("kafka_topic", "kafka_partition").agg(
        F.count(F.lit(1)), F.countDistinct("kafka_offset"), F.min("kafka_offset"), F.max("kafka_offset"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)),
    ).collect()
    return [PartitionReadStats(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]


def stage(
    spark: SparkSession, pipeline: PipelineConfig, attempt: Attempt, dsn: str, servers: str
) -> dict[str, object]:
    """Read the attempt's ranges and stage every record (decoded, or raw with its reason); mark it written."""
    from kafka_ledger.batches import writes_output_directly
    from kafka_ledger.decode import to_staging_rows

    batch = attempt.batch
    started = time.monotonic()
    staged = to_staging_rows(read_records(spark, attempt, servers), pipeline, batch.batch_id, attempt.number)
    target = jdbc_target(dsn)

    def append(frame: DataFrame, table: str) -> None:
        (
            frame.write.format("jdbc")
            .option("url", target.url)
            .option("dbtable", table)
            .option("user", target.user)
            .option("password", target.password)
            .option("driver", "org.postgresql.Driver")
            .option("batchsize", "10000")
            .mode("append")
            .save()
        )

    direct = writes_output_directly(pipeline, batch)
    if direct:
        # at_least_once: decoded rows go straight to the output table (no staging copy, no commit-time
        # copy); a failure before the commit re-delivers them on the next attempt.
        from pyspark.sql import functions as F

        staged = staged.persist()
        spark_stats = _read_stats(staged)
        append(staged.where(F.col("error").isNull()).select(*sql.output_columns(pipeline)),
               pipeline.qualified_output_table)
        append(staged.where(F.col("error").isNotNull()), sql.staging_table_name(pipeline))
    else:
        append(staged, sql.staging_table_name(pipeline))
    read_seconds = time.monotonic() - started
    failpoints.hit("after_staging")
    # No log-start check here: offsets deleted during the read fail it (failOnDataLoss), and offsets
    # deleted after it are safely staged; failing now would turn a complete read into a loss on retry.
    conn = ledger.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            stats = spark_stats if direct else ledger.staged_read_stats(cur, pipeline, batch.batch_id, attempt.number)
            problems = check_read_coverage(batch.ranges, stats)
            if problems:
                raise ledger.LedgerError(f"batch {batch.batch_id} was not read completely: " + "; ".join(problems))
            ledger.mark_written(cur, batch.batch_id, attempt.number, stats, read_seconds)
    finally:
        conn.close()
    return log_read(batch, attempt.number, stats, read_seconds)


def mark_nothing_to_read(dsn: str, attempt: Attempt) -> None:
    """A batch whose ranges are all empty (skipped over deleted offsets) is written with 0 records."""
    conn = ledger.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            ledger.mark_written(cur, attempt.batch.batch_id, attempt.number, [], 0.0)
    finally:
        conn.close()
    log.info("batch %s has no offsets to read (all skipped): marked written with 0 records", attempt.batch.batch_id)


# --- Spark Connect: publish in the commit's transaction -------------------------------------------------------
class AttemptInterrupted(RuntimeError):
    """The attempt was interrupted (its task is being stopped): nothing it read is published."""


def publish(
    spark: SparkSession | None, pipeline: PipelineConfig, attempt: Attempt, dsn: str, servers: str,
    interrupted: threading.Event | None = None,
) -> CommitResult:
    """Read the attempt's ranges and publish them and the offsets in ONE transaction (see batches.publish_batch).

    The rows stream from the Spark Connect server into COPY as Spark produces them. `spark` may be None
    when there is nothing to read. Once `interrupted` is set, the stream stops and nothing is published.
    """
    from kafka_ledger.batches import publish_batch

    if not attempt.readable:
        return publish_batch(dsn, pipeline, attempt.batch.batch_id, attempt.number, iter(()),
                             started=time.monotonic())
    from kafka_ledger.decode import decode_records
    from kafka_ledger.publish import copy_lines

    started = time.monotonic()
    lines = copy_lines(decode_records(read_records(spark, attempt, servers), pipeline), pipeline,
                       attempt.batch.batch_id)
    return publish_batch(dsn, pipeline, attempt.batch.batch_id, attempt.number,
                         arrow_stream(lines, attempt, interrupted), started=started)


def arrow_stream(frame: DataFrame, attempt: Attempt, interrupted: threading.Event | None = None):  # noqa: ANN201
    """The frame's rows as Arrow tables, as the Spark Connect server sends them (not all at once)."""
    client = frame.sparkSession.client
    # DataFrame.toArrow() would hold the whole batch in memory; the client's iterator yields each
    # Arrow batch as it arrives (PySpark 4.0 exposes it only on the client object).
    def stop_if_interrupted() -> None:
        # An interruption that came before the query started on the server, or after its last rows came
        # in, is caught here: the stream fails and the transaction with it.
        if interrupted is not None and interrupted.is_set():
            raise AttemptInterrupted(f"attempt {attempt.number} of batch {attempt.batch.batch_id} was interrupted")

    for item in client.to_table_as_iterator(frame._plan.to_proto(client), {}):
        stop_if_interrupted()
        if not hasattr(item, "fields"):  # the first item is the schema
            yield item
    stop_if_interrupted()
