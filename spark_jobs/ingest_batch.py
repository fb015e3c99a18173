"""Spark batch job: read one ledger batch's exact Kafka ranges, decode them and stage the rows in Postgres.

Launched by spark-submit (the pipeline DAG's Spark task):

    spark-submit ... spark_jobs/ingest_batch.py --pipeline impressions --batch-id 42

The ledger is the only source of truth for what to read: the job takes a batch id, never offsets.
It needs KAFKA_LEDGER_DB_URL and KAFKA_LEDGER_BOOTSTRAP_SERVERS in its environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from kafka_ledger import failpoints, kafka_offsets, ledger, sql
from kafka_ledger.config import get_pipeline
from kafka_ledger.planning import LostDataError, OffsetRange, PartitionReadStats, check_read_coverage, lost_ranges
from kafka_ledger.settings import bootstrap_servers, jdbc_target, ledger_dsn

log = logging.getLogger("kafka_ledger.ingest_batch")


def kafka_read_options(ranges: list[OffsetRange], servers: str) -> dict[str, str]:
    """Options of a bounded Kafka read of exactly `ranges` (ends exclusive), committed records only."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.from_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.until_offset
    return {
        "kafka.bootstrap.servers": servers,
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
        "kafka.isolation.level": "read_committed",
        # Offsets deleted under our feet must fail the read, never be skipped silently.
        "failOnDataLoss": "true",
        "includeHeaders": "false",
    }


def check_not_deleted(servers: str, ranges: list[OffsetRange]) -> None:
    """Fail if retention deleted any offset of the ranges (the log start moved past a from-offset)."""
    lost = lost_ranges(ranges, kafka_offsets.partition_offsets(servers, sorted({r.topic for r in ranges})))
    if lost:
        raise LostDataError(lost)


def read_stats(staged) -> list[PartitionReadStats]:  # noqa: ANN001 - a Spark DataFrame
    """Per-partition counts of what was read, computed by Spark (for rows that skip the staging table)."""
    from pyspark.sql import functions as F

    rows = staged.groupBy("kafka_topic", "kafka_partition").agg(
        F.count(F.lit(1)), F.countDistinct("kafka_offset"), F.min("kafka_offset"), F.max("kafka_offset"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)),
    ).collect()
    return [PartitionReadStats(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]


def run(pipeline_name: str, batch_id: int, config_path: str | None) -> int:
    pipeline = get_pipeline(pipeline_name, config_path)
    dsn, servers = ledger_dsn(), bootstrap_servers()
    conn = ledger.connect(dsn)
    with conn, conn.cursor() as cur:
        batch = ledger.get_batch(cur, batch_id)
    if batch.pipeline != pipeline.name:
        raise ledger.LedgerError(f"batch {batch_id} belongs to pipeline {batch.pipeline!r}, not {pipeline.name!r}")
    if batch.status in ("committed", "written"):
        log.info("batch %s is already %s (attempt %s staged it): nothing to read", batch_id, batch.status,
                 batch.staged_attempt)
        return 0
    with conn, conn.cursor() as cur:
        attempt = ledger.begin_attempt(cur, batch_id)
        removed = ledger.delete_older_staged(cur, pipeline, batch_id, attempt)
    log.info(
        "batch %s of %s, attempt %d: reading %d range(s), %d offsets%s",
        batch_id, pipeline.name, attempt, len(batch.ranges), sum(r.span for r in batch.ranges),
        f" (removed {removed} rows staged by earlier attempts)" if removed else "",
    )
    check_not_deleted(servers, batch.ranges)
    failpoints.hit("before_read")

    # A range can be empty when on_data_loss: skip moved it over deleted offsets: there is nothing to read.
    readable = [r for r in batch.ranges if r.span > 0]
    if not readable:
        with conn, conn.cursor() as cur:
            ledger.mark_written(cur, batch_id, attempt, [], 0.0)
        log.info("batch %s has no offsets to read (all skipped): marked written with 0 records", batch_id)
        conn.close()
        return 0

    from pyspark.sql import SparkSession  # heavy: only once we know there is work

    from kafka_ledger.decode import to_staging_rows

    spark = SparkSession.builder.appName(f"kafka-ledger {pipeline.name} batch {batch_id}").getOrCreate()
    started = time.monotonic()
    records = spark.read.format("kafka").options(**kafka_read_options(readable, servers)).load()
    staged = to_staging_rows(records, pipeline, batch_id, attempt)
    target = jdbc_target(dsn)

    def append(frame, table: str) -> None:  # noqa: ANN001 - a Spark DataFrame
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

    staging = f"kafka_ledger_staging.{pipeline.name}"
    direct = pipeline.delivery_mode == "at_least_once" and batch.kind == "catch_up"
    if direct:
        # at_least_once: decoded rows go straight to the output table (no staging copy, no commit-time
        # copy); a failure before the commit re-delivers them on the next attempt.
        from pyspark.sql import functions as F

        staged = staged.persist()
        spark_stats = read_stats(staged)
        append(staged.where(F.col("error").isNull()).select(*sql.output_columns(pipeline)),
               f"{pipeline.output_schema}.{pipeline.output_table}")
        append(staged.where(F.col("error").isNotNull()), staging)
    else:
        append(staged, staging)
    read_seconds = time.monotonic() - started
    failpoints.hit("after_staging")
    # No log-start check here: offsets deleted during the read fail it (failOnDataLoss), and offsets
    # deleted after it are safely staged; failing now would turn a complete read into a loss on retry.

    with conn, conn.cursor() as cur:
        stats = spark_stats if direct else ledger.staged_read_stats(cur, pipeline, batch_id, attempt)
        problems = check_read_coverage(batch.ranges, stats)
        if problems:
            raise ledger.LedgerError(f"batch {batch_id} was not read completely: " + "; ".join(problems))
        ledger.mark_written(cur, batch_id, attempt, stats, read_seconds)
    conn.close()

    total = sum(s.records for s in stats)
    dead = sum(s.dead_letters for s in stats)
    gaps = sum(r.span for r in batch.ranges) - total
    log.info(
        "batch %s staged: %d records read in %.1fs (%.0f records/s), %d to dead letters, %d offset gap(s) "
        "(transaction markers, aborted or compacted records)",
        batch_id, total, read_seconds, total / read_seconds if read_seconds else 0.0, dead, gaps,
    )
    print(json.dumps({"batch_id": batch_id, "attempt": attempt, "records_read": total,
                      "read_seconds": round(read_seconds, 3), "offset_gaps": gaps}))
    spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Read one kafka-ledger batch and stage its rows.")
    parser.add_argument("--pipeline", required=True, help="pipeline name, as declared in the pipelines file")
    parser.add_argument("--batch-id", required=True, type=int, help="ledger batch id to read")
    parser.add_argument("--config", default=os.environ.get("KAFKA_LEDGER_PIPELINES"), help="pipelines file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    return run(args.pipeline, args.batch_id, args.config)


if __name__ == "__main__":
    sys.exit(main())
