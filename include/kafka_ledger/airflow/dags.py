"""Builds one Airflow DAG per declared pipeline: plan -> the runtime's Spark work and commit -> drain backlog.

The Spark part is the pipeline's runtime's (runtimes/): it asks this module's task factory for the tasks it
needs (`connect`: one task that reads on the warm server and commits; `submit`: spark-submit's staging, then a
commit task). Every task calls into include/kafka_ledger; nothing here decides what a batch reads or writes.
A doorbell pipeline's DAG has no drain: its doorbell rings again after a commit while data waits.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, AssetWatcher, BaseOperator, Param, task
from airflow.sdk import log as task_log
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.timetables.interval import CronDataIntervalTimetable
from pydantic import BaseModel

from kafka_ledger.airflow.doorbell import DoorbellTrigger
from kafka_ledger.batch import commit
from kafka_ledger.batch import plan as planner
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.batch.requests import RequestError, parse_request, trigger_form_fields
from kafka_ledger.config.pipeline import IcebergSinkSpec, PipelineConfig, get_pipeline
from kafka_ledger.config.settings import (
    KAFKA_CONN_ID,
    LEDGER_DB_CONN_ID,
    SPARK_SUBMIT_CONN_ID,
    bootstrap_servers,
    deployment_settings,
    ledger_dsn,
    secret_values,
)
from kafka_ledger.kafka import headroom
from kafka_ledger.ledger import db as ledger
from kafka_ledger.runtimes import RUNTIMES, runtime_for
from kafka_ledger.runtimes.connect.batch import ConnectBatch
from kafka_ledger.runtimes.submit.runtime import (
    BASE_SPARK_CONF,
    SPARK_APPLICATION,
    check_master,
    spark_conf,
    spark_jars,
    spark_job_environment,
)
from kafka_ledger.sinks.iceberg import maintenance as lake_maintenance

__all__ = ["BASE_SPARK_CONF", "SPARK_APPLICATION", "SPARK_POOL", "SPARK_TASK", "build_lake_maintenance_dag",
           "build_pipeline_dag", "doorbell_asset", "output_asset", "run_pipeline_dag"]

log = logging.getLogger(__name__)

SPARK_POOL = "kafka_ledger_spark"
PLAN_TASK = "plan_batch"
RETENTION_CHECK_TASK = "check_retention_headroom"
# The task that runs a batch's Spark work, by runtime.
SPARK_TASK = {name: runtime.spark_task_id for name, runtime in RUNTIMES.items()}


def mask_secrets(settings: BaseModel) -> None:
    """Register every secret the settings hold (settings.secret_values: the SecretStr values, a connection
    string's password too) with Airflow's masker, so that task logs and the UI show *** in their place."""
    for secret in secret_values(settings):
        task_log.mask_secret(secret)


class SubmitBatchOperator(SparkSubmitOperator):
    """spark-submit of a batch's job, its settings (secrets among them) in the environment spark-submit inherits.

    Resolved in the worker when the task runs (environment first, then Airflow connections) and registered
    with the secret masker; never env_vars, which the Spark provider puts on the command line on YARN and
    Kubernetes, and never a rendered template field, which the UI shows.
    """

    def execute(self, context: Any) -> None:
        check_master(self._get_hook())
        settings = deployment_settings(LEDGER_DB_CONN_ID, KAFKA_CONN_ID)
        mask_secrets(settings)
        os.environ.update(spark_job_environment(settings.ledger_dsn(), settings.kafka_servers(),
                                                settings.kafka_client_settings()))
        super().execute(context)


def output_asset(pipeline: PipelineConfig) -> Asset:
    """The Airflow Asset of a pipeline's output table: updated by every commit, so downstream DAGs can schedule on it.

    `schedule=[output_asset(get_pipeline("impressions"))]`, or `Asset.ref(name="kafka_ledger.public.impressions")`
    (an Iceberg sink's: `kafka_ledger.<catalog>.<namespace>.<table>`, URI `iceberg://<catalog>/<namespace>/<table>`).
    """
    table = pipeline.qualified_output_table
    if isinstance(pipeline.sink, IcebergSinkSpec):
        uri = f"iceberg://{pipeline.sink.catalog}/{pipeline.sink.namespace}/{pipeline.sink.table}"
    else:
        uri = f"kafka-ledger://{pipeline.output_schema}/{pipeline.output_table}"
    return Asset(name=f"kafka_ledger.{table}", uri=uri, group="kafka-ledger")


def doorbell_asset(pipeline: PipelineConfig) -> Asset | None:
    """The asset a doorbell pipeline's DAG is scheduled on: its watcher, run by Airflow's triggerer, rings when new
    data waits (doorbell.DoorbellTrigger). None for a pipeline without a doorbell."""
    bell = pipeline.doorbell
    if bell is None:
        return None
    trigger = DoorbellTrigger(pipeline.name, bell.min_backlog, bell.poll_seconds, bell.ring_again_seconds)
    return Asset(name=f"kafka_ledger.airflow.doorbell.{pipeline.name}", uri=f"kafka-ledger://doorbell/{pipeline.name}",
                 group="kafka-ledger", watchers=[AssetWatcher(name=f"kafka_ledger_doorbell_{pipeline.name}",
                                                              trigger=trigger)])


def committed(context: Any, pipeline: PipelineConfig, result: CommitResult) -> dict[str, Any]:
    """The epilogue of every committing task: the commit's after-effects (commit.after_commit), and the output
    table's asset event describing the batch: its id, kind, ranges and counts. Returns the task's result."""
    with ledger.transaction(ledger_dsn()) as cur:
        batch = ledger.get_batch(cur, result.batch_id)
    context["outlet_events"][output_asset(pipeline)].extra = {
        "pipeline": pipeline.name, "batch_id": batch.batch_id, "kind": batch.kind,
        "replay_of": batch.replay_of, "already_committed": result.already_committed,
        "records_written": result.records_written, "records_dead_lettered": result.records_dead_lettered,
        "ranges": [{"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
                   for r in batch.ranges],
        **({"snapshot_id": batch.snapshot_id} if batch.snapshot_id is not None else {}),
    }
    return commit.after_commit(ledger_dsn(), bootstrap_servers(), pipeline, result)


def trigger_form(pipeline: PipelineConfig) -> dict[str, Param]:
    """The trigger form of a pipeline's DAG (batch_requests.BatchRequest's fields): what a manual run (UI form or
    REST conf) should read, its example the pipeline's first topic."""
    fields = trigger_form_fields(pipeline.topics[0] if pipeline.topics else "topic")
    return {name: Param(field.default, description=field.description, **field.schema) for name, field in fields.items()}


def plan_task(pipeline_name: str, dag_id: str, **context: Any) -> dict[str, Any]:
    """Plan (or resume) this run's batch; skip the rest of the run when there is nothing to read.

    Reads the run's form (params) and type: a backfill run rewrites its data interval. The ledger
    records which DAG run owns the batch, and who asked.
    """
    dag_run = context.get("dag_run")
    run_id = context.get("run_id")
    conf = dict(context.get("params") or {})
    backfill_window = None
    try:
        request = parse_request(conf)
        run_type = getattr(dag_run, "run_type", None)
        if getattr(run_type, "value", run_type) == "backfill":
            if request.mode != "catch_up":
                raise RequestError("a backfill run always rewrites its own data interval: leave mode at catch_up")
            backfill_window = (context["data_interval_start"], context["data_interval_end"])
        run_kind = getattr(run_type, "value", run_type)
        # The only asset a pipeline's DAG is scheduled on is its doorbell's.
        requested_by = (getattr(dag_run, "triggering_user_name", None)
                        or ("doorbell" if run_kind == "asset_triggered" else run_kind))
        pipeline = get_pipeline(pipeline_name)
        planned = planner.plan_batch(ledger_dsn(), bootstrap_servers(), pipeline, request,
                                     dag_id=dag_id, run_id=run_id, requested_by=requested_by,
                                     backfill_window=backfill_window)
    except RequestError as exc:
        # Retrying cannot fix a bad request: fail the run at once, with the reason in the task log as one
        # sentence (not chained to the validation error's traceback, which says the same less clearly).
        raise AirflowFailException(f"refused, nothing was written: {exc}") from None
    if planned.batch_id is None:
        raise AirflowSkipException(f"nothing to read for this {planned.kind} run: no Spark job launched")
    return {
        "batch_id": planned.batch_id,
        "kind": planned.kind,
        "resumed": planned.resumed,
        "partitions": len(planned.ranges),
        "offsets": planned.offsets,
        "backlog_after": planned.backlog_after,
        "retention_warning": headroom.warning(pipeline, planned.headroom or []),
    }


def check_retention_task(plan: dict[str, Any]) -> None:
    """Fail, beside the batch's Spark work and never blocking it, when the plan found partitions whose oldest unread
    offset is close to retention's deletion: a failed task is what Airflow's alerting (failure callbacks, e-mail,
    the run's state) already reports."""
    if plan.get("retention_warning"):
        raise AirflowFailException(plan["retention_warning"])
    log.info("retention headroom: no partition under the warning threshold (see the plan task's log)")


def commit_task(pipeline_name: str, plan: dict[str, Any], **context: Any) -> dict[str, Any]:
    """Publish the staged batch and advance its offsets in one Postgres transaction."""
    pipeline = get_pipeline(pipeline_name)
    result = commit.commit_batch(ledger_dsn(), bootstrap_servers(), pipeline, plan["batch_id"])
    return committed(context, pipeline, result)


class ReadAndCommitOperator(BaseOperator):
    """The `connect` runtime's Spark task: read the planned batch on the Spark Connect server and commit it.

    The rows and the offsets are published in one Postgres transaction by this task, the Spark Connect
    client (runtimes.connect.ConnectBatch). Killed by Airflow (timeout, marked failed), it interrupts its
    query on the server by its tag.
    """

    ui_color = "#fde3a7"

    def __init__(self, *, pipeline_name: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline_name = pipeline_name
        self._batch: ConnectBatch | None = None

    def execute(self, context: Any) -> dict[str, Any]:
        plan = context["ti"].xcom_pull(task_ids=PLAN_TASK)
        pipeline = get_pipeline(self.pipeline_name)
        self._batch = ConnectBatch(pipeline, plan["batch_id"])
        return committed(context, pipeline, self._batch.run(ledger_dsn(), bootstrap_servers()))

    def on_kill(self) -> None:
        if self._batch is not None:
            self._batch.interrupt()


def record_spark_failure(context: dict[str, Any]) -> None:
    """on_failure_callback of the Spark task: the batch stays open and is resumed by the next run."""
    plan = context["ti"].xcom_pull(task_ids=PLAN_TASK) or {}
    if plan.get("batch_id") is not None:
        error = f"Spark task failed after {context['ti'].try_number} tries: {context.get('exception')}"
        commit.fail_batch(ledger_dsn(), plan["batch_id"], error)
        log.error("batch %s marked failed; the next run resumes it with the same ranges", plan["batch_id"])


@dataclass
class _PipelineTasks:
    """The task factory a runtime asks for its tasks (runtimes.base.AirflowTasks), for one pipeline's DAG."""

    pipeline: PipelineConfig
    plan: Any

    def _spark_args(self) -> dict[str, Any]:
        # One Spark task of the pipeline at a time, over all its runs (scheduled, manual, backfill); the
        # pool caps the deployment's concurrent Spark batches over all pipelines at its slots.
        return {
            "pool": SPARK_POOL,
            "max_active_tis_per_dag": 1,
            "execution_timeout": timedelta(minutes=self.pipeline.spark_timeout_minutes),
            "on_failure_callback": record_spark_failure,
        }

    def read_and_commit(self, task_id: str) -> Any:
        spark = ReadAndCommitOperator(task_id=task_id, pipeline_name=self.pipeline.name,
                                      outlets=[output_asset(self.pipeline)], **self._spark_args())
        self.plan >> spark
        return spark

    def spark_submit(self, task_id: str) -> Any:
        spark = SubmitBatchOperator(
            task_id=task_id,
            application=str(SPARK_APPLICATION),
            conn_id=SPARK_SUBMIT_CONN_ID,
            name=f"kafka-ledger-{self.pipeline.name}",
            application_args=[
                "--pipeline", self.pipeline.name,
                "--batch-id", f"{{{{ ti.xcom_pull(task_ids='{PLAN_TASK}')['batch_id'] }}}}",
            ],
            jars="{{ spark_jars() }}",
            conf=spark_conf(self.pipeline),
            **self._spark_args(),
        )
        self.plan >> spark
        return spark

    def commit(self, task_id: str) -> Any:
        return task(commit_task, task_id=task_id, execution_timeout=timedelta(minutes=30),
                    outlets=[output_asset(self.pipeline)])(self.pipeline.name, self.plan)


def _timetable(schedule: str | None) -> Any:
    # An interval timetable makes each hourly run cover the hour before it (a cron string alone gives a
    # zero-length data interval in Airflow 3).
    if schedule is None:
        return None
    cron = {"@hourly": "0 * * * *", "@daily": "0 0 * * *"}.get(schedule, schedule)
    return CronDataIntervalTimetable(cron, timezone="UTC")


def _schedule(pipeline: PipelineConfig) -> Any:
    """The schedule, the doorbell, or either of them (a doorbell's runs start beside the scheduled ones)."""
    timetable, bell = _timetable(pipeline.schedule), doorbell_asset(pipeline)
    if bell is None or timetable is None:
        return bell or timetable
    return AssetOrTimeSchedule(timetable=timetable, assets=bell)


def _doc(pipeline: PipelineConfig) -> str:
    runtime = runtime_for(pipeline)
    spark = runtime.describe()
    return (
        f"### kafka-ledger pipeline `{pipeline.name}`\n\n"
        f"{pipeline.subscription} -> `{pipeline.qualified_output_table}` ({pipeline.delivery_mode}, Spark runtime "
        f"`{runtime.name}`), at most {pipeline.max_records_per_partition} records per partition per "
        "batch.\n\n"
        + (f"Runs also start when new data waits: the doorbell (Airflow's triggerer) rings once at least "
           f"{pipeline.doorbell.min_backlog} offsets wait, looking every {pipeline.doorbell.poll_seconds:g} s.\n\n"
           if pipeline.doorbell else "")
        + "`plan_batch` records the exact offset ranges in the ledger before anything is read (or resumes the "
        f"unfinished batch), {spark}, and "
        + ("the doorbell rings again after each commit while data waits (the per-partition cap left some, or more "
           "came)." if pipeline.doorbell else
           "`drain_backlog` starts another run at once when the per-partition cap left data unread.")
        + " Beside the Spark work, `check_retention_headroom` fails when a partition's oldest unread "
        f"offset has less than {pipeline.retention_warning_fraction:.0%} of its retention window left.\n\n"
        "Trigger with config to re-read offset ranges, a time window or a recorded batch; a backfill run "
        "re-reads its data interval (one hour per hourly run). **Clearing** a run that committed its batch "
        "re-reads that batch's recorded ranges and replaces their rows (a replay; positions do not move; a "
        "backfill run rewrites its interval). "
        "The pipeline's ranges, lag and dead letters: the *Kafka Ledger* tab. See docs/operating.md."
    )


def _drain_tasks(dag_id: str, plan: Any) -> Any:
    """backlog_remains >> drain_backlog: when the per-partition cap left offsets unread, the next run starts at once."""

    @task.short_circuit(task_id="backlog_remains", ignore_downstream_trigger_rules=True)
    def backlog_remains(plan: dict[str, Any]) -> bool:
        """True when the cap left offsets unread: another run starts right away to drain them."""
        if plan["backlog_after"] > 0:
            log.info("%d offsets remain beyond this batch's cap: starting another run", plan["backlog_after"])
            return True
        log.info("caught up: no offsets left beyond this batch")
        return False

    remains = backlog_remains(plan)
    remains >> TriggerDagRunOperator(
        task_id="drain_backlog",
        trigger_dag_id=dag_id,
        logical_date=None,
        conf={"reason": "drain backlog left by the per-partition cap"},
    )
    return remains


def build_pipeline_dag(pipeline: PipelineConfig) -> DAG:
    """The DAG of one pipeline. Building it does no I/O: every look-up happens inside the tasks."""
    with DAG(
        dag_id=pipeline.dag_id,
        description=pipeline.description or f"Exactly-once ingest of {pipeline.subscription}",
        schedule=_schedule(pipeline),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["kafka-ledger", pipeline.name],
        doc_md=_doc(pipeline),
        params=trigger_form(pipeline),
        default_args={
            "owner": pipeline.owner,
            "retries": pipeline.retries,
            "retry_delay": timedelta(seconds=pipeline.retry_delay_seconds),
            "retry_exponential_backoff": 2.0,
            "max_retry_delay": timedelta(minutes=30),
        },
        user_defined_macros={
            "spark_jars": spark_jars,
        },
    ) as dag:
        plan = task(plan_task, task_id=PLAN_TASK, execution_timeout=timedelta(minutes=10))(
            pipeline.name, pipeline.dag_id)
        _, committing = runtime_for(pipeline).airflow_tasks(_PipelineTasks(pipeline, plan))
        # Retrying the check cannot add headroom: it fails once, loudly, and the next run checks again.
        task(check_retention_task, task_id=RETENTION_CHECK_TASK, retries=0)(plan)

        if pipeline.doorbell is None:
            committing >> _drain_tasks(pipeline.dag_id, plan)
        # A doorbell pipeline needs no drain: its doorbell rings again once a commit moved the positions while
        # offsets still wait (doorbell.RingRule), and its run ends, letting the next one start, a task sooner.
    return dag


def maintain_lake_task(pipeline_name: str) -> dict[str, Any]:
    """Compact the pipeline's Iceberg table and expire its old snapshots (lake_maintenance.maintain)."""
    return lake_maintenance.maintain(ledger_dsn(), get_pipeline(pipeline_name)).as_dict()


def build_lake_maintenance_dag(pipeline: PipelineConfig) -> DAG:
    """The DAG that maintains an Iceberg sink's table on the schedule of its `maintenance`. No I/O while building."""
    assert isinstance(pipeline.sink, IcebergSinkSpec) and pipeline.lake_maintenance_dag_id is not None
    spec = pipeline.sink.maintenance
    with DAG(
        dag_id=pipeline.lake_maintenance_dag_id,
        description=f"Compaction and snapshot expiry of {pipeline.sink.qualified_table}",
        schedule=spec.schedule,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["kafka-ledger", pipeline.name, "lake"],
        doc_md=(
            f"### Lake maintenance of `{pipeline.sink.qualified_table}` (pipeline `{pipeline.name}`)\n\n"
            "Rewrites small data files into bigger ones (compaction) and expires snapshots older than "
            f"{spec.expire_after_hours} h (keeping the newest {spec.retain_last}), never the snapshot of a batch the "
            "ledger has not finished nor any newer one. No row changes. See docs/deployment.md, The lake."
        ),
        default_args={"owner": pipeline.owner, "retries": pipeline.retries,
                      "retry_delay": timedelta(seconds=pipeline.retry_delay_seconds)},
    ) as dag:
        task(maintain_lake_task, task_id="maintain_lake", pool=SPARK_POOL,
             execution_timeout=timedelta(minutes=pipeline.spark_timeout_minutes))(pipeline.name)
    return dag


@dataclass(frozen=True)
class DagRunOutcome:
    """How one in-process DAG run ended, with the final state of each task."""

    run_id: str
    state: str
    tasks: dict[str, str]


def run_pipeline_dag(pipeline: PipelineConfig, conf: dict[str, Any] | None = None) -> DagRunOutcome:
    """Run the pipeline's DAG once in this process with dag.test(): real tasks, real spark-submit.

    The DAG must also be generated by the dags folder (dag.test() registers it from there), which is
    the case for every pipeline of the pipelines file in use.
    """
    dag = build_pipeline_dag(pipeline)
    run = dag.test(run_conf=conf)
    tasks = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    return DagRunOutcome(run_id=run.run_id, state=str(run.state), tasks=tasks)
