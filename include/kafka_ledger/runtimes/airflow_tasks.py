"""What every runtime's Airflow tasks share: the Spark pool, the output's asset, the epilogue of a committing task,
and what a failed Spark task records. Imported where a DAG is built or a task runs (it needs Airflow)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, AssetAlias
from airflow.sdk import log as task_log
from airflow.sdk.exceptions import AirflowFailException

from kafka_ledger.batch import commit
from kafka_ledger.batch.carry import CarryingRun
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import DAG_ID_PREFIX, PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import task_services
from kafka_ledger.formats.known import value_format
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import join_consecutive
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


def mask_secrets(services: Services, *pipelines: PipelineConfig) -> None:
    """Register every secret the services hold (the ledger's connection string and its password on its own, Kafka's
    passwords) and, where a pipeline's format needs the schema registry, the registry's credentials with Airflow's
    masker, so that task logs and the UI show *** in their place."""
    registry = services.registry().secrets() if any(value_format(p).uses_registry for p in pipelines) else []
    for secret in [*services.secrets(), *registry]:
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


def committed(context: Any, services: Services, pipeline: PipelineConfig, results: list[CommitResult]
              ) -> dict[str, Any]:
    """The epilogue of every committing task: the commits' after-effects (commit.after_commit, once, after the last),
    and the output table's asset event describing the task's batches (`batches_event`). Returns the task's result."""
    context["outlet_events"][output_asset(pipeline)].extra = batches_event(services, pipeline, results)
    result = commit.after_commit(services, pipeline, results[-1])
    if len(results) > 1:
        result = {**result, "batch_ids": [r.batch_id for r in results], "batches": len(results),
                  "records_written": sum(r.records_written for r in results),
                  "records_dead_lettered": sum(r.records_dead_lettered for r in results)}
    return result


def batches_event(services: Services, pipeline: PipelineConfig, results: list[CommitResult]) -> dict[str, Any]:
    """The extra of the output table's asset event for a task's committed batches (one, or the several a carrying run
    or a carrier committed): the first's id and kind, every id, the ranges (joined per partition) and the counts."""
    with ledger.transaction(services.ledger) as cur:
        batches = [ledger.get_batch(cur, result.batch_id) for result in results]
    first, last = batches[0], batches[-1]
    # One range per partition, from the first batch's start to the last one's end (a single batch's own ranges).
    ranges, _ = join_consecutive(b.ranges for b in batches)
    return {
        "pipeline": pipeline.name, "batch_id": first.batch_id, "batch_ids": [b.batch_id for b in batches],
        "kind": first.kind, "replay_of": first.replay_of,
        "already_committed": all(r.already_committed for r in results),
        "records_written": sum(r.records_written for r in results),
        "records_dead_lettered": sum(r.records_dead_lettered for r in results),
        "ranges": [{"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
                   for r in ranges],
        **({"snapshot_id": last.snapshot_id} if last.snapshot_id is not None else {}),
    }


def carrier_outputs(carrier: str) -> AssetAlias:
    """The alias through which a carrier's task updates the output assets of the members it committed (only theirs:
    a member that committed nothing gets no event)."""
    return AssetAlias(name=f"kafka_ledger.carrier.{carrier}.outputs", group="kafka-ledger")


def run_kind(dag_run: Any) -> str | None:
    """How a DAG run was started (`scheduled`, `manual`, `backfill`, `asset_triggered`, ...), as a string."""
    run_type = getattr(dag_run, "run_type", None)
    return getattr(run_type, "value", run_type)


def carrying_run(context: Any, services: Services, pipeline: PipelineConfig, plan: dict[str, Any],
                 run_batch: Callable[[int], CommitResult]) -> CarryingRun | None:
    """The carrying of a run the doorbell started to read a catch-up batch (batch/carry.py), when its pipeline
    carries (`carry_seconds` > 0); None for every other run: scheduled, manual, backfill, a replay, a cleared run."""
    bell = pipeline.doorbell
    if (bell is None or not bell.carry_seconds or run_kind(context.get("dag_run")) != "asset_triggered"
            or plan.get("kind") != "catch_up"):
        return None
    return CarryingRun(services, pipeline, context["dag"].dag_id, context["run_id"], run_batch,
                       seconds=bell.carry_seconds, pace_seconds=bell.poll_seconds)


def carry(carrying: CarryingRun | None, first: Callable[[], CommitResult]) -> list[CommitResult]:
    """The task's first batch, then, for a carrying run, the batches it carries after it, under its lease (released
    when the task ends, whichever way)."""
    if carrying is None:
        return [first()]
    carrying.hold()
    try:
        results = [first()]
        carried = carrying.carry_on()
    finally:
        try:
            carrying.release()
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself; the task's own outcome matters more
            log.warning("could not release the carrying lease of run %s (%s): it expires by itself",
                        carrying.run_id, exc)
    results += carried.results
    log.info("run %s carried %d batch(es) in %.1f s (%s): %d records written, %d dead-lettered", carrying.run_id,
             len(results), time.monotonic() - carrying.started, carried.ended, sum(r.records_written for r in results),
             sum(r.records_dead_lettered for r in results))
    return results


def record_spark_failure(context: dict[str, Any]) -> None:
    """on_failure_callback of the Spark task: the run's unfinished batch (its plan's, or the one a carrying run was
    in) is marked failed, and stays open to be resumed by the next run."""
    plan = context["ti"].xcom_pull(task_ids=PLAN_TASK) or {}
    if plan.get("batch_id") is None:
        return
    services = task_services()
    dag_id = context["ti"].dag_id
    pipeline = dag_id.removeprefix(DAG_ID_PREFIX)
    with ledger.transaction(services.ledger) as cur:
        open_batch = ledger.run_open_batch(cur, pipeline, dag_id, context["ti"].run_id)
    error = f"Spark task failed after {context['ti'].try_number} tries: {context.get('exception')}"
    commit.fail_batch(services, pipeline, plan["batch_id"] if open_batch is None else open_batch.batch_id, error)
