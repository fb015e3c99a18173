"""The `connect` runtime's Airflow task: read the planned batch on the Spark Connect server and commit it (and, in a
run the doorbell started, the batches after it: batch/carry.py)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from kafka_ledger.batch.carry import CarryingRun
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import PipelineConfig, get_pipeline
from kafka_ledger.config.settings import task_services
from kafka_ledger.runtimes.airflow_tasks import (
    PLAN_TASK,
    carry,
    carrying_run,
    committed,
    output_asset,
    refusals_fail_at_once,
    spark_task_args,
)
from kafka_ledger.runtimes.connect.batch import ConnectBatch


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
