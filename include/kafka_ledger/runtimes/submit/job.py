"""The application spark-submit runs for a batch (spark_jobs/ingest_batch.py): read the batch's ranges and stage
every record (decoded, or raw with its dead-letter reason), or publish an artifact sink's batch outright."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from kafka_ledger.batch import read
from kafka_ledger.batch.columns import with_columns
from kafka_ledger.batch.commit import CommitResult, log_read, writes_output_directly
from kafka_ledger.batch.publish import publish_attempt
from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.config.services import Services
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model.ranges import PartitionReadStats, check_read_coverage
from kafka_ledger.observe import failpoints
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.sinks import Sink, TransactionalSink, sink_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from kafka_ledger.formats.base import ValueFormat


# Where a standalone cluster's worker puts the cluster's authentication secret for what it launches (Spark's
# SecurityManager.ENV_AUTH_SECRET).
WORKER_AUTH_SECRET = "_SPARK_AUTH_SECRET"


def run_job(pipeline_name: str, batch_id: int, config: str | None, services: Services) -> dict[str, object]:
    """Begin an attempt of the batch, read it and stage it (or mark it written with nothing to read)."""
    pipeline = with_columns(services.ledger, get_pipeline(pipeline_name, config))
    attempt = read.begin(services, pipeline, batch_id)
    if attempt is None:
        return {"batch_id": batch_id, "staged": False}
    if not attempt.readable:
        read.mark_nothing_to_read(services.ledger, attempt)
        return {"batch_id": batch_id, "records_read": 0}

    # A Spark Connect client in the launching process (the connect runtime's task, a test) marks its
    # environment for Spark Connect, and spark-submit passes the mark on: this job's session is a classic one.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    from pyspark.sql import SparkSession  # heavy: only once we know there is work

    builder = SparkSession.builder.appName(f"kafka-ledger {pipeline.name} batch {batch_id}")
    if os.environ.get(WORKER_AUTH_SECRET):
        # A driver in cluster deploy mode on a standalone cluster: its worker hands it the cluster's secret in its
        # environment (the settings it got from the submission drop it on the way), while Spark's driver asks for
        # the setting.
        builder = builder.config("spark.authenticate.secret", os.environ[WORKER_AUTH_SECRET])
    spark = builder.getOrCreate()
    try:
        started = time.monotonic()
        sink = sink_for(pipeline)
        records = read.read_records(spark, attempt, services.kafka)

        def staged(sink: TransactionalSink) -> dict[str, object]:
            return stage(records, sink, attempt, services, started)

        published = publish_attempt(records, attempt, sink, services, in_transaction=staged, started=started,
                                    clock=Stopwatch())
    finally:
        spark.stop()
    if isinstance(published, CommitResult):  # an artifact sink's batch, committed by the job itself
        return {"batch_id": batch_id, "committed": True, "records_written": published.records_written,
                "records_dead_lettered": published.records_dead_lettered}
    return published


def to_staging_rows(records: DataFrame, sink: Sink, batch_id: int, attempt: int,
                    fmt: ValueFormat | None = None) -> DataFrame:
    """Kafka source rows -> the staging table's layout (ledger.sql.staging_columns): decoded columns (by the attempt's
    format `fmt`), or raw bytes plus the error."""
    from pyspark.sql import functions as F

    from kafka_ledger.formats.decode import decode_records

    pipeline = sink.pipeline
    decoded = decode_records(records, pipeline, sink.envelope, fmt=fmt)
    good = F.col("error").isNull()
    values = {
        "batch_id": F.lit(batch_id).cast("long"),
        "attempt": F.lit(attempt).cast("int"),
        # The raw record is kept for dead letters only; a decoded row keeps its columns instead.
        "kafka_key": F.when(~good, F.col("kafka_key")),
        "kafka_value": F.when(~good, F.col("kafka_value")),
        **{c.name: F.when(good, F.col(c.name)) for c in pipeline.columns},
    }
    return decoded.select(*[values.get(name, F.col(name)).alias(name)
                            for name in sql.staging_columns(pipeline, sink.staged_extra())])


def _read_stats(staged: DataFrame) -> list[PartitionReadStats]:
    """Per-partition counts of what was read, computed by Spark (for rows that skip the staging table)."""
    from pyspark.sql import functions as F

    rows = staged.groupBy("kafka_topic", "kafka_partition").agg(
        F.count(F.lit(1)), F.countDistinct("kafka_offset"), F.min("kafka_offset"), F.max("kafka_offset"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)),
        F.max(F.when(F.col("error").isNull(), F.col("kafka_timestamp"))),
    ).collect()
    return [PartitionReadStats(*r) for r in rows]


def stage(records: DataFrame, sink: TransactionalSink, attempt: read.Attempt, services: Services, started: float
          ) -> dict[str, object]:
    """Stage every record of the attempt (decoded, or raw with its reason) for the commit; mark it written."""
    from pyspark.sql import functions as F

    pipeline, batch = sink.pipeline, attempt.batch
    staged = to_staging_rows(records, sink, batch.batch_id, attempt.number, attempt.value_format)
    target = services.ledger.jdbc()

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
        staged = staged.persist()
        spark_stats = _read_stats(staged)
        append(staged.where(F.col("error").isNull()).select(*sink.output_columns()), sink.jdbc_table)
        append(staged.where(F.col("error").isNotNull()), sql.staging_table_name(pipeline))
    else:
        append(staged, sql.staging_table_name(pipeline))
    read_seconds = time.monotonic() - started
    failpoints.hit("after_staging")
    # No log-start check here: offsets deleted during the read fail it (failOnDataLoss), and offsets
    # deleted after it are safely staged; failing now would turn a complete read into a loss on retry.
    with ledger.transaction(services.ledger) as cur:
        stats = spark_stats if direct else ledger.staged_read_stats(cur, pipeline, batch.batch_id, attempt.number)
        problems = check_read_coverage(batch.ranges, stats)
        if problems:
            raise ledger.LedgerError(f"batch {batch.batch_id} was not read completely: " + "; ".join(problems))
        ledger.mark_written(cur, batch.batch_id, attempt.number, stats, read_seconds)
    return log_read(services.observer, batch, attempt.number, stats, read_seconds)
