"""The `connect` runtime: a warm Spark Connect server; one task reads the batch there and commits it."""

from __future__ import annotations

from typing import Any

from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import CarrierDeclaration, PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.runtimes.base import Runtime
from kafka_ledger.runtimes.connect import CONNECT
from kafka_ledger.runtimes.connect.batch import ConnectBatch
from kafka_ledger.spark.sessions import ConnectSessions, SparkSessions


class ConnectRuntime(Runtime):
    """The warm Spark Connect server; one task reads the batch there and commits it."""

    name = CONNECT
    spark_task_id = "read_and_commit"
    commit_task_id = None

    def run_batch(self, pipeline: PipelineConfig, batch_id: int, services: Services) -> CommitResult:
        return ConnectBatch(pipeline, batch_id).run(services)

    def build_tasks(self, pipeline: PipelineConfig, plan: Any) -> tuple[Any, Any]:
        from kafka_ledger.runtimes.connect import airflow  # Airflow's operators: where a DAG is built only

        return airflow.build_tasks(self.spark_task_id, pipeline, plan)

    def build_carrier_task(self, carrier: CarrierDeclaration) -> Any:
        from kafka_ledger.runtimes.connect import airflow  # Airflow's operators: where a DAG is built only

        return airflow.build_carrier_task(carrier)

    def spark_sessions(self) -> SparkSessions:
        return ConnectSessions()

    def describe(self) -> str:
        return (f"`{self.spark_task_id}` reads exactly those ranges on the warm Spark Connect server and publishes "
                "the rows, the dead letters and the new offsets in one Postgres transaction")
