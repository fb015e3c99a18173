"""What every runtime's Airflow tasks share: the Spark pool, the output's asset, the epilogue of a committing task,
and what a failed Spark task records. Imported where a DAG is built or a task runs (it needs Airflow)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow.sdk import Asset
from airflow.sdk import log as task_log
from airflow.sdk.exceptions import AirflowFailException

from kafka_ledger.batch import commit
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import DAG_ID_PREFIX, PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import task_services
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.refusals import Refusal
from kafka_ledger.sinks import sink_for

log = logging.getLogger(__name__)

SPARK_POOL = "kafka_ledger_spark"
PLAN_TASK = "plan_batch"


@contextmanager
def refusals_fail_at_once() -> Iterator[None]:
    """A refusal (model/refusals.py) fails the task at once, its retries skipped (no retry can change it), with its
    own message; any other error is retried as the task declares."""
    try:
        yield
    except Refusal as exc:
        raise AirflowFailException(f"refused, not retried: {exc}") from exc


def mask_secrets(services: Services) -> None:
    """Register every secret the services hold (the ledger's connection string and its password on its own, Kafka's
    passwords) with Airflow's masker, so that task logs and the UI show *** in their place."""
    for secret in services.secrets():
        task_log.mask_secret(secret)


def output_asset(pipeline: PipelineConfig) -> Asset:
    """The Airflow Asset of a pipeline's output table: updated by every commit, so downstream DAGs can schedule on it.

    `schedule=[output_asset(get_pipeline("impressions"))]`, or `Asset.ref(name="kafka_ledger.public.impressions")`
    (an Iceberg sink's: `kafka_ledger.<catalog>.<namespace>.<table>`, URI `iceberg://<catalog>/<namespace>/<table>`).
    """
    return Asset(name=f"kafka_ledger.{pipeline.qualified_output_table}", uri=sink_for(pipeline).asset_uri,
                 group="kafka-ledger")


def spark_task_args(pipeline: PipelineConfig) -> dict[str, Any]:
    """The arguments of every runtime's Spark task: one Spark task of the pipeline at a time, over all its runs
    (scheduled, manual, backfill); the pool caps the deployment's concurrent Spark batches over all pipelines at its
    slots."""
    return {
        "pool": SPARK_POOL,
        "max_active_tis_per_dag": 1,
        "execution_timeout": timedelta(minutes=pipeline.spark_timeout_minutes),
        "on_failure_callback": record_spark_failure,
    }


def committed(context: Any, services: Services, pipeline: PipelineConfig, result: CommitResult) -> dict[str, Any]:
    """The epilogue of every committing task: the commit's after-effects (commit.after_commit), and the output
    table's asset event describing the batch: its id, kind, ranges and counts. Returns the task's result."""
    with ledger.transaction(services.ledger) as cur:
        batch = ledger.get_batch(cur, result.batch_id)
    context["outlet_events"][output_asset(pipeline)].extra = {
        "pipeline": pipeline.name, "batch_id": batch.batch_id, "kind": batch.kind,
        "replay_of": batch.replay_of, "already_committed": result.already_committed,
        "records_written": result.records_written, "records_dead_lettered": result.records_dead_lettered,
        "ranges": [{"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
                   for r in batch.ranges],
        **({"snapshot_id": batch.snapshot_id} if batch.snapshot_id is not None else {}),
    }
    return commit.after_commit(services, pipeline, result)


def record_spark_failure(context: dict[str, Any]) -> None:
    """on_failure_callback of the Spark task: the batch stays open and is resumed by the next run."""
    plan = context["ti"].xcom_pull(task_ids=PLAN_TASK) or {}
    if plan.get("batch_id") is not None:
        error = f"Spark task failed after {context['ti'].try_number} tries: {context.get('exception')}"
        pipeline = context["ti"].dag_id.removeprefix(DAG_ID_PREFIX)
        commit.fail_batch(task_services(), pipeline, plan["batch_id"], error)
