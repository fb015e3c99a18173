"""The `submit` runtime's Airflow tasks: spark-submit of the batch's job, then the task that commits what it staged."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow.exceptions import AirflowException
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import task
from airflow.sdk.exceptions import AirflowFailException

from kafka_ledger.batch import commit
from kafka_ledger.batch.commit import Written
from kafka_ledger.config.pipeline import PipelineConfig, get_pipeline
from kafka_ledger.config.settings import SPARK_SUBMIT_CONN_ID, task_services
from kafka_ledger.ledger.db import EXIT_FENCED
from kafka_ledger.model.refusals import EXIT_REFUSED
from kafka_ledger.runtimes.airflow_tasks import (
    PLAN_TASK,
    committed,
    mask_secrets,
    output_asset,
    refusals_fail_at_once,
    spark_task_args,
)
from kafka_ledger.runtimes.submit.spark_submit import (
    SPARK_APPLICATION,
    DriverSubmission,
    SparkJobFailed,
    batch_submission,
    check_driver_outcome,
    job_exit_code,
    spark_conf,
    spark_jars,
    untrack_driver,
)


class SubmitBatchOperator(SparkSubmitOperator):
    """spark-submit of a batch's job, its settings (secrets among them) in the environment spark-submit inherits.

    Resolved in the worker when the task runs (environment first, then Airflow connections) and registered
    with the secret masker; never env_vars, which the Spark provider puts on the command line on YARN and
    Kubernetes, and never a rendered template field, which the UI shows. The connector jars are found then too.
    """

    def __init__(self, *, pipeline_name: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline_name = pipeline_name
        self._submission: DriverSubmission | None = None

    def _get_hook(self) -> Any:
        hook = super()._get_hook()
        if self._submission is not None:
            untrack_driver(hook, self._submission)
        return hook

    def execute(self, context: Any) -> None:
        with refusals_fail_at_once():
            self.jars = spark_jars()
            services = task_services()
            pipeline = get_pipeline(self.pipeline_name)
            mask_secrets(services, pipeline)
            probe = self._get_hook()
            submission = batch_submission(probe, services, pipeline)
            self.conf, self.files, self.py_files = submission.conf, submission.files, submission.py_files
            self.application, self._java_class = submission.application, submission.java_class
            self.application_args = [*submission.leading_args, *self.application_args]
            self._submission = submission
            os.environ.update(submission.environment)
        try:
            super().execute(context)
            if submission.outcome_in_ledger:
                batch_id = int(self.application_args[self.application_args.index("--batch-id") + 1])
                check_driver_outcome(services, pipeline, batch_id, probe._connection["master"])
        except SparkJobFailed as exc:
            raise AirflowException(str(exc)) from exc
        except AirflowException as exc:
            code = job_exit_code(self._hook)
            if code == EXIT_REFUSED:
                raise AirflowFailException("refused, not retried: the batch's Spark job refused it (exit code "
                                           f"{EXIT_REFUSED}); its reason is in the job's output above") from exc
            if code == EXIT_FENCED:
                raise AirflowException(
                    f"fenced: this task's Spark driver found a newer attempt of the batch begun after its own (exit "
                    f"code {EXIT_FENCED}; another driver of the same batch, e.g. a resubmission, carries it) and "
                    "published nothing; the retry finds the batch as that driver leaves it") from exc
            raise


def commit_task(pipeline_name: str, plan: dict[str, Any], **context: Any) -> dict[str, Any]:
    """Publish the staged batch and advance its offsets in one Postgres transaction."""
    with refusals_fail_at_once():
        pipeline = get_pipeline(pipeline_name)
        services = task_services()
        result = commit.commit(services, pipeline, plan["batch_id"], Written())
        return committed(context, services, pipeline, [result])


def build_tasks(spark_task_id: str, commit_task_id: str, pipeline: PipelineConfig, plan: Any) -> tuple[Any, Any]:
    """spark-submit's task after `plan`, then the commit task."""
    spark = SubmitBatchOperator(
        pipeline_name=pipeline.name,
        task_id=spark_task_id,
        application=str(SPARK_APPLICATION),
        conn_id=SPARK_SUBMIT_CONN_ID,
        name=f"kafka-ledger-{pipeline.name}",
        application_args=[
            "--pipeline", pipeline.name,
            "--batch-id", f"{{{{ ti.xcom_pull(task_ids='{PLAN_TASK}')['batch_id'] }}}}",
        ],
        conf=spark_conf(pipeline),
        **spark_task_args(pipeline),
    )
    committing = task(commit_task, task_id=commit_task_id, execution_timeout=timedelta(minutes=30),
                      outlets=[output_asset(pipeline)])(pipeline.name, plan).operator
    plan >> spark >> committing
    return spark, committing
