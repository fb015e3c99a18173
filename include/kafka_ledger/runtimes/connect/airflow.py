"""The `connect` runtime's Airflow task: read the planned batch on the Spark Connect server and commit it (and, in a
run the doorbell started, the batches after it: batch/carry.py)."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, task
from airflow.sdk.exceptions import AirflowFailException

from kafka_ledger.batch.carry import CarryingLease, CarryingRun
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import CarrierDeclaration, PipelineConfig, get_pipeline, read_pipelines
from kafka_ledger.config.settings import runtime_name, task_services
from kafka_ledger.ledger import db as ledger
from kafka_ledger.runtimes.airflow_tasks import (
    PLAN_TASK,
    SPARK_POOL,
    batches_event,
    carrier_outputs,
    carry,
    carrying_run,
    committed,
    mask_secrets,
    output_asset,
    refusals_fail_at_once,
    spark_task_args,
)
from kafka_ledger.runtimes.connect import CARRY_TASK, CHECK_MEMBERS_TASK, CONNECT
from kafka_ledger.runtimes.connect.batch import ConnectBatch
from kafka_ledger.runtimes.connect.carrier import Carrier, carry_for, reason

log = logging.getLogger(__name__)


class ReadAndCommitOperator(BaseOperator):
    """The `connect` runtime's Spark task: read the planned batch on the Spark Connect server and commit it.

    The rows and the offsets are published in one Postgres transaction by this task, the Spark Connect
    client (runtimes/connect/batch.ConnectBatch). Killed by Airflow (timeout, marked failed), it interrupts its
    query on the server by its tag.
    """

    ui_color = "#fde3a7"

    def __init__(self, *, pipeline_name: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline_name = pipeline_name
        self._batch: ConnectBatch | None = None
        self._carrying: CarryingRun | None = None

    def execute(self, context: Any) -> dict[str, Any]:
        plan = context["ti"].xcom_pull(task_ids=PLAN_TASK)
        with refusals_fail_at_once():
            pipeline = get_pipeline(self.pipeline_name)
            services = task_services()

            def run_batch(batch_id: int) -> CommitResult:
                self._batch = ConnectBatch(pipeline, batch_id)
                return self._batch.run(services)

            # A run the doorbell started carries batch after batch (batch/carry.py); any other run reads one.
            self._carrying = carrying_run(context, services, pipeline, plan, run_batch)
            results = carry(self._carrying, lambda: run_batch(plan["batch_id"]))
            return committed(context, services, pipeline, results)

    def on_kill(self) -> None:
        if self._carrying is not None:
            self._carrying.stop()
        if self._batch is not None:
            self._batch.interrupt()


def build_tasks(task_id: str, pipeline: PipelineConfig, plan: Any) -> tuple[Any, Any]:
    """One task after `plan` that reads and commits: both the Spark task and the committing one."""
    spark = ReadAndCommitOperator(task_id=task_id, pipeline_name=pipeline.name, outlets=[output_asset(pipeline)],
                                  **spark_task_args(pipeline))
    plan >> spark
    return spark, spark


class CarryOperator(BaseOperator):
    """A carrier's one task (runtimes/connect/carrier.py): carries its members' batches, cycle after cycle, for the
    carrier's carry_seconds, holding every member's carrying lease meanwhile (the carrier's doorbell keeps quiet).

    Each member's batch is planned, read and committed as its own run's would be, in its own transaction. A member
    whose batch failed in its last cycle is named in the task's result, which `check_members` fails on; its batch
    stays open and the next run resumes it with the same ranges. A task that dies (killed, the server lost) is
    retried: its retry resumes the run's open batches. Killed by Airflow, it stops after the running cycle's query is
    interrupted: nothing that cycle read is published.
    """

    ui_color = "#fde3a7"

    def __init__(self, *, carrier_name: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.carrier_name = carrier_name
        self._carrier: Carrier | None = None
        self._stopped = threading.Event()

    def execute(self, context: Any) -> dict[str, Any]:
        with refusals_fail_at_once():
            declaration = read_pipelines().carrier(self.carrier_name)
            services = task_services()
            members = list(declaration.members)
            elsewhere = [m.name for m in members if runtime_name(m) != CONNECT]
            if elsewhere:
                raise AirflowFailException(
                    f"carrier {self.carrier_name} reads on the Spark Connect server: pipeline(s) "
                    f"{', '.join(elsewhere)} run on another runtime (spark_runtime, or the deployment's default): "
                    f"declare spark_runtime: {CONNECT} or take trigger.carrier away")
            # The services' secrets, and the registry's where a member's format needs it.
            mask_secrets(services, *members)
        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        lease = CarryingLease(services, [m.name for m in members], dag_id, run_id)
        self._carrier = carrier = Carrier(self.carrier_name, services)
        lease.hold()
        try:
            carried = carry_for(carrier, members, seconds=declaration.carry_seconds,
                                pace_seconds=declaration.poll_seconds, dag_id=dag_id, run_id=run_id,
                                stopped=self._stopped)
        finally:
            try:
                lease.release()
            except Exception as exc:  # noqa: BLE001 - the lease expires by itself
                log.warning("could not release the carrying lease of run %s (%s): it expires by itself", run_id, exc)
            carrier.close()
        results = [r for committed in carried.results.values() for r in committed]
        written = sum(r.records_written for r in results)
        dead = sum(r.records_dead_lettered for r in results)
        log.info("carrier %s: %d cycle(s), %d batch(es) of %d pipeline(s) committed (%s): %d records written, %d "
                 "dead-lettered", self.carrier_name, carried.cycles, len(results), len(carried.results),
                 carried.ended, written, dead)
        # Each member that committed updates its output table's asset, as its own run's task would.
        outputs = context["outlet_events"][carrier_outputs(self.carrier_name)]
        with ledger.keeping_connections():  # one ledger connection for every member's event, not one each
            for member in members:
                if member.name in carried.results:
                    outputs.add(output_asset(member),
                                extra=batches_event(services, member, carried.results[member.name]))
        return {"carrier": self.carrier_name, "cycles": carried.cycles, "batches": len(results),
                "pipelines_committed": len(carried.results), "records_written": written,
                "records_dead_lettered": dead, "ended": carried.ended,
                "failing": {name: reason(exc) for name, exc in sorted(carried.failing.items())}}

    def on_kill(self) -> None:
        self._stopped.set()
        if self._carrier is not None:
            self._carrier.interrupt()


def check_members(carried: dict[str, Any]) -> None:
    """Fail, naming them, when members' batches failed in the carrier's run (each stays open for the next run); the
    carrying task has succeeded, so the members that committed have their asset events."""
    if carried["failing"]:
        raise AirflowFailException(
            f"carrier {carried['carrier']}: the batch of {len(carried['failing'])} pipeline(s) failed in its last "
            "cycle and stays open for the next run: " + "; ".join(
                f"{name}: {why}" for name, why in carried["failing"].items()))
    log.info("carrier %s: no member's batch failed", carried["carrier"])


def build_carrier_task(carrier: CarrierDeclaration) -> Any:
    """The carrier DAG's tasks: `carry_batches`, in the Spark pool (one slot for all its members), timed out after its
    carrying budget and its members' longest Spark timeout, retried as its most patient member's task would be (a
    killed task's retry resumes the open batches of its run); then `check_members`, which fails when a member's batch
    failed (not retried: the next run resumes it)."""
    members = carrier.members
    carry = CarryOperator(
        task_id=CARRY_TASK, carrier_name=carrier.name, pool=SPARK_POOL, outlets=[carrier_outputs(carrier.name)],
        retries=max(m.retries for m in members),
        retry_delay=timedelta(seconds=min(m.retry_delay_seconds for m in members)),
        execution_timeout=timedelta(seconds=carrier.carry_seconds,
                                    minutes=max(m.spark_timeout_minutes for m in members)))
    return task(check_members, task_id=CHECK_MEMBERS_TASK, retries=0)(carry.output)
