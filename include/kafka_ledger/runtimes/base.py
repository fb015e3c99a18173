"""The interface of a Spark runtime: run this batch id here and now, the Airflow tasks it adds to a DAG, and the
Spark sessions its pipelines' other work gets."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import CarrierDeclaration, PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.spark.sessions import SparkSessions


class Runtime(ABC):
    """Where a batch's Spark work runs. One per pipeline (its `spark_runtime`, else the deployment's), chosen
    once by runtimes.runtime_for(); the DAG, the CLI, the benchmark and the fault campaign all go through it.

    Whatever the runtime, a batch ends the same ways: read and committed in one publishing transaction
    (batch/commit.py), an empty batch marked written with no records and committed, a failed one left to be resumed
    with the same ranges.
    """

    name: ClassVar[str]
    # The Airflow task that runs the Spark work, and the one that commits (None: the Spark task commits).
    spark_task_id: ClassVar[str]
    commit_task_id: ClassVar[str | None]

    @abstractmethod
    def run_batch(self, pipeline: PipelineConfig, batch_id: int, services: Services) -> CommitResult:
        """Read, publish and commit one planned batch here and now (the CLI, the benchmark, the fault campaign)."""

    @abstractmethod
    def build_tasks(self, pipeline: PipelineConfig, plan: Any) -> tuple[Any, Any]:
        """This runtime's tasks in the pipeline's DAG being built, after the `plan` task: (the Spark task, the
        committing task). Called inside the DAG's context (runtimes/<name>/airflow.py makes them)."""

    def build_carrier_task(self, carrier: CarrierDeclaration) -> Any:
        """The tasks of a carrier's DAG being built (config CarrierDeclaration), in this runtime; the last one."""
        raise NotImplementedError(f"the {self.name} runtime carries no batches")

    @abstractmethod
    def spark_sessions(self) -> SparkSessions:
        """Where the pipeline's Spark work outside a batch (the lake's upkeep) gets its session."""

    def describe(self) -> str:
        """What the runtime's tasks do, for the DAG's documentation."""
        return ""
