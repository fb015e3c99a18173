"""The `submit` runtime: one spark-submit per batch stages its rows; a commit task then publishes them.

spark_jobs/ingest_batch.py is the application (`run_job`): it reads the batch's ranges and appends every
record, decoded or with its dead-letter reason, to the pipeline's staging table, then marks the batch written.
The commit (batch/commit.Written) copies the staged rows into the output in one transaction with the offsets.
An artifact sink's batch is published by the job itself, as the connect runtime's task publishes it
(batch/publish.publish_artifact): its artifact is the only copy of its rows, and the commit task finds the batch
committed. The job is job.py; the Airflow tasks airflow.py.
"""

from __future__ import annotations

from typing import Any

from kafka_ledger.batch import commit
from kafka_ledger.batch.commit import CommitResult, Written
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import deployment_settings
from kafka_ledger.runtimes.base import Runtime
from kafka_ledger.runtimes.submit.spark_submit import BASE_SPARK_CONF, spark_jars, submit_batch
from kafka_ledger.spark.sessions import LocalSessions, SparkSessions


class SubmitRuntime(Runtime):
    """One spark-submit per batch (no server to keep running); the commit is a task of its own."""

    name = "submit"
    spark_task_id = "read_and_stage"
    commit_task_id = "commit_batch"

    def run_batch(self, pipeline: PipelineConfig, batch_id: int, services: Services) -> CommitResult:
        submit_batch(pipeline, batch_id, services)
        return commit.commit(services, pipeline, batch_id, Written())

    def build_tasks(self, pipeline: PipelineConfig, plan: Any) -> tuple[Any, Any]:
        from kafka_ledger.runtimes.submit import airflow  # Airflow's operators: where a DAG is built only

        return airflow.build_tasks(self.spark_task_id, self.commit_task_id or "", pipeline, plan)

    def spark_sessions(self) -> SparkSessions:
        return LocalSessions(deployment_settings().spark_master or "local[*]", spark_jars(), BASE_SPARK_CONF)

    def describe(self) -> str:
        return (f"`{self.spark_task_id}` reads exactly those ranges with spark-submit and stages the rows, "
                f"`{self.commit_task_id}` publishes them and advances the offsets in one Postgres transaction "
                "(an Iceberg sink's batch: the Spark job writes its snapshot and commits it with the offsets)")


