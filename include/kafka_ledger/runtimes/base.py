"""The interface of a Spark runtime: run this batch id here and now, and the Airflow tasks it adds to a DAG."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import PipelineConfig


class AirflowTasks(Protocol):
    """The tasks the DAG builder (airflow_dag.py) can make; each runtime asks for the ones it needs, in order."""

    def read_and_commit(self, task_id: str) -> Any:
        """A task that reads the batch on a warm Spark and commits it in its own transaction."""

    def spark_submit(self, task_id: str) -> Any:
        """A task that runs the batch's spark-submit job, which stages the rows."""

    def commit(self, task_id: str) -> Any:
        """A task that commits what the Spark task staged."""


class Runtime(ABC):
    """Where a batch's Spark work runs. One per pipeline (its `spark_runtime`, else the deployment's), chosen
    once by runtimes.runtime_for(); the DAG, the CLI, the benchmark and the fault campaign all go through it.

    Whatever the runtime, a batch ends the same ways: read and committed in one publishing transaction
    (commit.py), an empty batch marked written with no records and committed, a failed one left to be resumed
    with the same ranges.
    """

    name: ClassVar[str]
    # The Airflow task that runs the Spark work, and the one that commits (None: the Spark task commits).
    spark_task_id: ClassVar[str]
    commit_task_id: ClassVar[str | None]
    # The kinds of sink (config.SinkSpec's `type`) it can publish into.
    sinks: ClassVar[frozenset[str]] = frozenset({"postgres"})

    @abstractmethod
    def run_batch(self, pipeline: PipelineConfig, batch_id: int, dsn: str, servers: str) -> CommitResult:
        """Read, publish and commit one planned batch here and now (the CLI, the benchmark, the fault campaign)."""

    @abstractmethod
    def airflow_tasks(self, tasks: AirflowTasks) -> tuple[Any, Any]:
        """This runtime's tasks in a pipeline's DAG, wired in order: (the Spark task, the committing task)."""

    def describe(self) -> str:
        """What the runtime's tasks do, for the DAG's documentation."""
        return ""
