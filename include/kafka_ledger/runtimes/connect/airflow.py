"""The `connect` runtime's Airflow task: read the planned batch on the Spark Connect server and commit it."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from kafka_ledger.config.pipeline import PipelineConfig, get_pipeline
from kafka_ledger.config.settings import task_services
from kafka_ledger.runtimes.airflow_tasks import (
    PLAN_TASK,
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

    def execute(self, context: Any) -> dict[str, Any]:
        plan = context["ti"].xcom_pull(task_ids=PLAN_TASK)
        with refusals_fail_at_once():
            pipeline = get_pipeline(self.pipeline_name)
            self._batch = ConnectBatch(pipeline, plan["batch_id"])
            services = task_services()
            return committed(context, services, pipeline, self._batch.run(services))

    def on_kill(self) -> None:
        if self._batch is not None:
            self._batch.interrupt()


def build_tasks(task_id: str, pipeline: PipelineConfig, plan: Any) -> tuple[Any, Any]:
    """One task after `plan` that reads and commits: both the Spark task and the committing one."""
    spark = ReadAndCommitOperator(task_id=task_id, pipeline_name=pipeline.name, outlets=[output_asset(pipeline)],
                                  **spark_task_args(pipeline))
    plan >> spark
    return spark, spark
