"""Builds one Airflow DAG per declared pipeline: plan -> the runtime's Spark work and commit -> drain backlog.

The Spark part is the pipeline's runtime's: `runtime_for(pipeline).build_tasks(...)` makes its tasks (`connect`: one
task that reads on the warm server and commits; `submit`: spark-submit's staging, then a commit task); this module
knows no runtime. Every task calls into include/kafka_ledger; nothing here decides what a batch reads or writes.
A doorbell pipeline's DAG has no drain: its doorbell rings again after a commit while data waits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, AssetWatcher, Param, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.timetables.interval import CronDataIntervalTimetable

from kafka_ledger.airflow.doorbell import CarrierDoorbellTrigger, DoorbellTrigger
from kafka_ledger.batch import plan as planner
from kafka_ledger.batch.carry import REQUESTED_BY_DOORBELL
from kafka_ledger.batch.requests import RequestError, parse_request, trigger_form_fields
from kafka_ledger.config.pipeline import (
    CARRIER_DAG_ID_PREFIX,
    CarrierDeclaration,
    PipelineConfig,
    carriers_of,
    get_pipeline,
)
from kafka_ledger.config.settings import task_services
from kafka_ledger.kafka import headroom
from kafka_ledger.runtimes import RUNTIMES, build_carrier_task, runtime_for
from kafka_ledger.runtimes.airflow_tasks import (
    PLAN_TASK,
    SPARK_POOL,
    output_asset,
    refusals_fail_at_once,
    run_kind,
)
from kafka_ledger.sinks import sink_for

__all__ = ["SPARK_POOL", "SPARK_TASK", "build_lake_maintenance_dag", "build_pipeline_dag", "doorbell_asset",
           "output_asset", "run_pipeline_dag"]

log = logging.getLogger(__name__)

RETENTION_CHECK_TASK = "check_retention_headroom"
# The task that runs a batch's Spark work, by runtime.
SPARK_TASK = {name: runtime.spark_task_id for name, runtime in RUNTIMES.items()}


def doorbell_asset(pipeline: PipelineConfig) -> Asset | None:
    """The asset a doorbell pipeline's DAG is scheduled on: its watcher, run by Airflow's triggerer, rings when new
    data waits (doorbell.DoorbellTrigger). None for a pipeline without a doorbell, or whose doorbell batches a
    carrier carries (its carrier's doorbell watches it: carrier_doorbell_asset)."""
    bell = pipeline.doorbell
    if bell is None or bell.carrier is not None:
        return None
    trigger = DoorbellTrigger(pipeline.name, bell.min_backlog, bell.poll_seconds, bell.ring_again_seconds)
    return Asset(name=f"kafka_ledger.doorbell.{pipeline.name}", uri=f"kafka-ledger://doorbell/{pipeline.name}",
                 group="kafka-ledger", watchers=[AssetWatcher(name=f"kafka_ledger_doorbell_{pipeline.name}",
                                                              trigger=trigger)])


def carrier_doorbell_asset(carrier: CarrierDeclaration) -> Asset:
    """The asset a carrier's DAG is scheduled on: its watcher rings when any member has data waiting
    (doorbell.CarrierDoorbellTrigger)."""
    trigger = CarrierDoorbellTrigger(carrier.name, carrier.poll_seconds, carrier.ring_again_seconds)
    return Asset(name=f"kafka_ledger.carrier.{carrier.name}", uri=f"kafka-ledger://carrier/{carrier.name}",
                 group="kafka-ledger", watchers=[AssetWatcher(name=f"kafka_ledger_carrier_{carrier.name}",
                                                              trigger=trigger)])


def trigger_form(pipeline: PipelineConfig) -> dict[str, Param]:
    """The trigger form of a pipeline's DAG (batch_requests.BatchRequest's fields): what a manual run (UI form or
    REST conf) should read, its example the pipeline's first topic."""
    fields = trigger_form_fields(pipeline.topics[0] if pipeline.topics else "topic")
    return {name: Param(field.default, description=field.description, **field.schema) for name, field in fields.items()}


def plan_task(pipeline_name: str, dag_id: str, **context: Any) -> dict[str, Any]:
    """Plan (or resume) this run's batch; skip the rest of the run when there is nothing to read.

    Reads the run's form (params) and type: a backfill run rewrites its data interval. The ledger
    records which DAG run owns the batch, and who asked. A refusal (a bad request or declaration, a recreated topic,
    lost data) fails the task at once, without retries.
    """
    dag_run = context.get("dag_run")
    conf = dict(context.get("params") or {})
    backfill_window = None
    with refusals_fail_at_once():
        try:
            request = parse_request(conf)
            started_as = run_kind(dag_run)
            if started_as == "backfill":
                if request.mode != "catch_up":
                    raise RequestError("a backfill run always rewrites its own data interval: leave mode at catch_up")
                backfill_window = (context["data_interval_start"], context["data_interval_end"])
        except RequestError as exc:
            # The reason in the task log as one sentence (not chained to the validation error's traceback, which
            # says the same less clearly).
            raise AirflowFailException(f"refused, nothing was written: {exc}") from None
        # The only asset a pipeline's DAG is scheduled on is its doorbell's.
        requested_by = (getattr(dag_run, "triggering_user_name", None)
                        or (REQUESTED_BY_DOORBELL if started_as == "asset_triggered" else started_as))
        pipeline = get_pipeline(pipeline_name)
        try:
            planned = planner.plan_batch(task_services(), pipeline, request, dag_id=dag_id,
                                         run_id=context.get("run_id"), requested_by=requested_by,
                                         backfill_window=backfill_window)
        except RequestError as exc:
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
        + (f"New data is carried by the carrier `{pipeline.carrier}` (DAG `{CARRIER_DAG_ID_PREFIX}"
           f"{pipeline.carrier}`), with other pipelines' batches; this DAG's runs are the manual ones, replays and "
           "backfills.\n\n" if pipeline.carrier else
           f"Runs also start when new data waits: the doorbell (Airflow's triggerer) rings once at least "
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
    ) as dag:
        plan = task(plan_task, task_id=PLAN_TASK, execution_timeout=timedelta(minutes=10))(
            pipeline.name, pipeline.dag_id)
        _, committing = runtime_for(pipeline).build_tasks(pipeline, plan)
        # Retrying the check cannot add headroom: it fails once, loudly, and the next run checks again.
        task(check_retention_task, task_id=RETENTION_CHECK_TASK, retries=0)(plan)

        if pipeline.doorbell is None:
            committing >> _drain_tasks(pipeline.dag_id, plan)
        # A doorbell pipeline needs no drain: its doorbell rings again once a commit moved the positions while
        # offsets still wait (doorbell.RingRule), and its run ends, letting the next one start, a task sooner.
    return dag


def build_carrier_dag(carrier: CarrierDeclaration) -> DAG:
    """The DAG of a carrier: its doorbell watches all its members; its one task carries their batches
    (runtimes/connect/carrier.py). No I/O while building."""
    names = ", ".join(f"`{m.name}`" for m in carrier.members)
    with DAG(
        dag_id=carrier.dag_id,
        description=f"Carries the doorbell batches of {len(carrier.members)} pipeline(s) together",
        schedule=carrier_doorbell_asset(carrier),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["kafka-ledger", "carrier", carrier.name],
        doc_md=(
            f"### kafka-ledger carrier `{carrier.name}`\n\n"
            f"Carries the batches of {names} whenever one of them has data waiting (its doorbell looks every "
            f"{carrier.poll_seconds:g} s). `carry_batches` plans every member's batch in the ledger before anything "
            "is read, reads all their ranges at once on the Spark Connect server, decodes the members that decode "
            "alike in one Spark job, and commits each member's rows and offsets in that member's own Postgres "
            f"transaction; it goes on, a cycle at most every {carrier.poll_seconds:g} s, for up to "
            f"{carrier.carry_seconds:g} s. A member whose batch failed fails `check_members`, named; its batch is "
            "resumed with the same ranges by the next run. Each member's own DAG keeps its manual runs, replays and "
            "backfills. See docs/operating.md, Carriers."
        ),
        default_args={"owner": carrier.members[0].owner},
    ) as dag:
        build_carrier_task(carrier)
    return dag


def maintain_lake_task(pipeline_name: str) -> dict[str, Any]:
    """Compact the pipeline's Iceberg table and expire its old snapshots (sinks/iceberg/maintenance.py), in a Spark
    session of the pipeline's runtime."""
    with refusals_fail_at_once():
        pipeline = get_pipeline(pipeline_name)
        return sink_for(pipeline).maintain(task_services().ledger, runtime_for(pipeline).spark_sessions())


def build_lake_maintenance_dag(pipeline: PipelineConfig) -> DAG:
    """The DAG that maintains a sink's table on the schedule of its `maintenance` (an Iceberg sink's compaction and
    snapshot expiry). No I/O while building."""
    sink = sink_for(pipeline)
    spec = sink.maintenance()
    assert spec is not None and pipeline.lake_maintenance_dag_id is not None
    with DAG(
        dag_id=pipeline.lake_maintenance_dag_id,
        description=f"Compaction and snapshot expiry of {sink.target}",
        schedule=spec.schedule,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["kafka-ledger", pipeline.name, "lake"],
        doc_md=(
            f"### Lake maintenance of `{sink.target}` (pipeline `{pipeline.name}`)\n\n"
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


def declared_dags(pipelines: Iterable[PipelineConfig], wanted: str | None = None) -> dict[str, DAG]:
    """Each pipeline's DAG and its lake maintenance DAG, and each carrier's DAG, by DAG id; only the DAG `wanted`,
    when a task's process parses the DAG file to run a task of that one (Airflow's parsing context): a DAG takes 7
    ms to build, and with hundreds of pipelines every task would otherwise start by building them all."""
    dags: dict[str, DAG] = {}
    pipelines = list(pipelines)
    for carrier in carriers_of(pipelines).values():
        if wanted in (None, carrier.dag_id):
            dags[carrier.dag_id] = build_carrier_dag(carrier)
    for pipeline in pipelines:
        if wanted in (None, pipeline.dag_id):
            dags[pipeline.dag_id] = build_pipeline_dag(pipeline)
        maintenance = pipeline.lake_maintenance_dag_id
        if maintenance is not None and wanted in (None, maintenance):
            dags[maintenance] = build_lake_maintenance_dag(pipeline)
    return dags


@dataclass(frozen=True)
class DagRunOutcome:
    """How one in-process DAG run ended, with the final state of each task."""

    run_id: str
    state: str
    tasks: dict[str, str]
    # How many times each task ran (its retries included).
    tries: dict[str, int]


def run_pipeline_dag(pipeline: PipelineConfig, conf: dict[str, Any] | None = None) -> DagRunOutcome:
    """Run the pipeline's DAG once in this process with dag.test(): real tasks, real spark-submit.

    The DAG must also be generated by the dags folder (dag.test() registers it from there), which is
    the case for every pipeline of the pipelines file in use.
    """
    dag = build_pipeline_dag(pipeline)
    run = dag.test(run_conf=conf)
    instances = run.get_task_instances()
    tasks = {ti.task_id: str(ti.state) for ti in instances}
    return DagRunOutcome(run_id=run.run_id, state=str(run.state), tasks=tasks,
                         tries={ti.task_id: ti.try_number for ti in instances})
