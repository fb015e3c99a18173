"""The `submit` runtime: one spark-submit per batch stages its rows; a commit task then publishes them.

spark_jobs/ingest_batch.py is the application (`run_job`): it reads the batch's ranges and appends every
record, decoded or with its dead-letter reason, to the pipeline's staging table, then marks the batch written.
The commit (commit.commit_batch) copies the staged rows into the output in one transaction with the offsets.
An Iceberg sink's batch is published by the job itself, as the connect runtime's task publishes it
(lake_publish): its snapshot is the only copy of its rows, and the commit task finds the batch committed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_ledger.batch import commit, read
from kafka_ledger.batch.commit import CommitResult, log_read, writes_output_directly
from kafka_ledger.config.pipeline import PipelineConfig, config_path, get_pipeline
from kafka_ledger.config.settings import (
    SPARK_SUBMIT_CONN_ID,
    SettingsError,
    deployment_settings,
    env_name,
    jdbc_target,
    kafka_settings,
)
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model.ranges import PartitionReadStats, check_read_coverage
from kafka_ledger.observe import failpoints
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.runtimes.base import AirflowTasks, Runtime
from kafka_ledger.sinks import IcebergSink, sink_for
from kafka_ledger.sinks.iceberg import write as lake_publish

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from pyspark.sql import DataFrame, SparkSession

PROJECT_ROOT = Path(__file__).resolve().parents[4]
SPARK_APPLICATION = PROJECT_ROOT / "spark_jobs" / "ingest_batch.py"
SPARK_LOG_CONFIG = PROJECT_ROOT / "spark_jobs" / "log4j2.properties"

# Fixed settings every Spark job gets; a pipeline's spark_conf may override them.
BASE_SPARK_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": f"-Duser.timezone=UTC -Dlog4j2.configurationFile=file:{SPARK_LOG_CONFIG}",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "8",
}


def spark_jars() -> str:
    """Comma-separated local jars for spark-submit: the Kafka connector and the JDBC driver."""
    jars_dir = deployment_settings().spark_jars_dir
    if jars_dir is None:
        raise SettingsError("no Spark connector jars configured: set KAFKA_LEDGER_SPARK_JARS_DIR to their folder "
                            "(scripts/env.sh sets it for the local stack, and scripts/stack.sh install fills it)")
    jars = sorted(str(p) for p in jars_dir.glob("*.jar"))
    if not jars:
        raise FileNotFoundError(
            f"no Spark connector jars in {jars_dir}: run scripts/stack.sh install (or set KAFKA_LEDGER_SPARK_JARS_DIR)"
        )
    return ",".join(jars)


def spark_conf(pipeline: PipelineConfig) -> dict[str, str]:
    return {**BASE_SPARK_CONF, **pipeline.spark_conf}


def spark_job_environment(dsn: str, servers: str, kafka: dict[str, str]) -> dict[str, str]:
    """What the batch's Spark job reads from its environment: where the ledger, Kafka and the pipelines are.

    It holds secrets, so it reaches spark-submit as the environment it inherits, never as the hook's
    env_vars: on YARN and Kubernetes the Spark provider turns those into `--conf` arguments on its command line.
    """
    return {env_name("db_url"): dsn, env_name("bootstrap_servers"): servers,
            env_name("kafka_config"): json.dumps(kafka), env_name("pipelines"): str(config_path())}


def spark_submit_hook(pipeline: PipelineConfig, batch_id: int) -> SparkSubmitHook:
    """The Spark provider's hook for the batch's Spark job, set up as the DAG's operator sets it up.

    Uses the `spark_default` connection (AIRFLOW_CONN_SPARK_DEFAULT), or local[*] when none is defined.
    The job's settings must be in this process's environment (spark_job_environment).
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    return SparkSubmitHook(
        conf=spark_conf(pipeline),
        jars=spark_jars(),
        name=f"kafka-ledger-{pipeline.name}",
        application_args=["--pipeline", pipeline.name, "--batch-id", str(batch_id)],
    )


def check_master(hook: SparkSubmitHook) -> None:
    """Refuse to submit elsewhere than $KAFKA_LEDGER_SPARK_MASTER says, when it says something.

    The `spark_default` connection is derived from that variable when scripts/env.sh is sourced: one
    exported afterwards would otherwise be ignored, and the job would silently run on the old master.
    """
    wanted = deployment_settings().spark_master
    master = hook._connection["master"]  # the provider's own reading of the connection (host and port)
    if wanted and wanted != master:
        raise SettingsError(
            f"KAFKA_LEDGER_SPARK_MASTER is {wanted!r} but the connection {SPARK_SUBMIT_CONN_ID!r} says {master!r}: "
            f"spark-submit would run there. Source scripts/env.sh after exporting KAFKA_LEDGER_SPARK_MASTER, or "
            f"set AIRFLOW_CONN_SPARK_DEFAULT to the same master"
        )


def submit_batch(pipeline: PipelineConfig, batch_id: int, dsn: str, servers: str) -> None:
    """Run the batch's Spark job with spark-submit outside Airflow (the CLI's replay); raises on failure."""
    os.environ.update(spark_job_environment(dsn, servers, kafka_settings()))
    hook = spark_submit_hook(pipeline, batch_id)
    check_master(hook)
    hook.submit(str(SPARK_APPLICATION))


class SubmitRuntime(Runtime):
    """One spark-submit per batch (no server to keep running); the commit is a task of its own."""

    name = "submit"
    sinks = frozenset({"postgres", "iceberg"})
    spark_task_id = "read_and_stage"
    commit_task_id = "commit_batch"

    def run_batch(self, pipeline: PipelineConfig, batch_id: int, dsn: str, servers: str) -> CommitResult:
        submit_batch(pipeline, batch_id, dsn, servers)
        return commit.commit_batch(dsn, servers, pipeline, batch_id)

    def airflow_tasks(self, tasks: AirflowTasks) -> tuple[Any, Any]:
        spark = tasks.spark_submit(self.spark_task_id)
        committed = tasks.commit(self.commit_task_id)
        spark >> committed
        return spark, committed

    def describe(self) -> str:
        return (f"`{self.spark_task_id}` reads exactly those ranges with spark-submit and stages the rows, "
                f"`{self.commit_task_id}` publishes them and advances the offsets in one Postgres transaction "
                "(an Iceberg sink's batch: the Spark job writes its snapshot and commits it with the offsets)")


# --- the application spark-submit runs (spark_jobs/ingest_batch.py) -------------------------------------------
def run_job(pipeline_name: str, batch_id: int, config: str | None, dsn: str, servers: str) -> dict[str, object]:
    """Begin an attempt of the batch, read it and stage it (or mark it written with nothing to read)."""
    pipeline = get_pipeline(pipeline_name, config)
    attempt = read.begin(dsn, servers, pipeline, batch_id)
    if attempt is None:
        return {"batch_id": batch_id, "staged": False}
    if not attempt.readable:
        read.mark_nothing_to_read(dsn, attempt)
        return {"batch_id": batch_id, "records_read": 0}

    # A Spark Connect client in the launching process (the connect runtime's task, a test) marks its
    # environment for Spark Connect, and spark-submit passes the mark on: this job's session is a classic one.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    from pyspark.sql import SparkSession  # heavy: only once we know there is work

    spark = SparkSession.builder.appName(f"kafka-ledger {pipeline.name} batch {batch_id}").getOrCreate()
    try:
        sink = sink_for(pipeline)
        if isinstance(sink, IcebergSink):
            return publish_snapshot(spark, sink, attempt, dsn, servers)
        return stage(spark, pipeline, attempt, dsn, servers)
    finally:
        spark.stop()


def publish_snapshot(spark: SparkSession, sink: IcebergSink, attempt: read.Attempt, dsn: str, servers: str
                     ) -> dict[str, object]:
    """An Iceberg sink's batch: read the attempt's ranges, write them as the batch's one snapshot (or adopt the
    snapshot an earlier attempt left) and commit it with the offsets, as the connect runtime does."""
    from kafka_ledger.batch.publish import publish_frame
    from kafka_ledger.formats.decode import decode_records

    started = time.monotonic()
    batch_id = attempt.batch.batch_id
    rows = publish_frame(decode_records(read.read_records(spark, attempt, servers), sink.pipeline), sink.pipeline,
                         batch_id)
    result = lake_publish.publish_attempt(sink, rows, attempt, dsn, servers, started=started, clock=Stopwatch())
    return {"batch_id": batch_id, "committed": True, "records_written": result.records_written,
            "records_dead_lettered": result.records_dead_lettered}


def _read_stats(staged: DataFrame) -> list[PartitionReadStats]:
    """Per-partition counts of what was read, computed by Spark (for rows that skip the staging table)."""
    from pyspark.sql import functions as F

    rows = staged.groupBy("kafka_topic", "kafka_partition").agg(
        F.count(F.lit(1)), F.countDistinct("kafka_offset"), F.min("kafka_offset"), F.max("kafka_offset"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)),
        F.max(F.when(F.col("error").isNull(), F.col("kafka_timestamp"))),
    ).collect()
    return [PartitionReadStats(*r) for r in rows]


def stage(
    spark: SparkSession, pipeline: PipelineConfig, attempt: read.Attempt, dsn: str, servers: str
) -> dict[str, object]:
    """Read the attempt's ranges and stage every record (decoded, or raw with its reason); mark it written."""
    from pyspark.sql import functions as F

    # decode builds Spark columns: PySpark is imported once a batch is read, not by every user of the runtimes.
    from kafka_ledger.formats.decode import to_staging_rows

    batch = attempt.batch
    started = time.monotonic()
    staged = to_staging_rows(read.read_records(spark, attempt, servers), pipeline, batch.batch_id, attempt.number)
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
    with ledger.transaction(dsn) as cur:
        stats = spark_stats if direct else ledger.staged_read_stats(cur, pipeline, batch.batch_id, attempt.number)
        problems = check_read_coverage(batch.ranges, stats)
        if problems:
            raise ledger.LedgerError(f"batch {batch.batch_id} was not read completely: " + "; ".join(problems))
        ledger.mark_written(cur, batch.batch_id, attempt.number, stats, read_seconds)
    return log_read(batch, attempt.number, stats, read_seconds)
