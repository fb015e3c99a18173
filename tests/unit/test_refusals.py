"""Refusals fail a task at once, without retries; faults are retried as before."""

from __future__ import annotations

import pytest

from kafka_ledger.batch.commit import CommitError
from kafka_ledger.batch.requests import RequestError
from kafka_ledger.config.pipeline import ConfigError
from kafka_ledger.config.services import KafkaConfigError, SettingsError
from kafka_ledger.kafka.offsets import KafkaUnavailable
from kafka_ledger.model.ranges import LostDataError, OffsetRange, PlanError, TopicIdentityError
from kafka_ledger.model.refusals import EXIT_REFUSED, Refusal
from kafka_ledger.sinks.iceberg.snapshots import IcebergSchemaError, IcebergSinkError
from kafka_ledger.spark.connect import SparkServerError

REFUSALS = [TopicIdentityError("p", {"t": ("a", "b")}), LostDataError([OffsetRange("t", 0, 1, 5)]),
            ConfigError("bad"), RequestError("bad"), SettingsError("bad"), KafkaConfigError("bad"),
            IcebergSchemaError("bad")]
FAULTS = [KafkaUnavailable("away"), PlanError("topic(s) not found"), IcebergSinkError("catalog away"),
          CommitError("compare-and-set failed"), SparkServerError("gone"), OSError("reset")]


@pytest.mark.parametrize("error", REFUSALS, ids=lambda e: type(e).__name__)
def test_a_refusal_fails_the_task_at_once_with_its_message(error):
    from airflow.sdk.exceptions import AirflowFailException

    from kafka_ledger.runtimes.airflow_tasks import refusals_fail_at_once

    assert isinstance(error, Refusal)
    with pytest.raises(AirflowFailException, match="refused, not retried: ") as failed, refusals_fail_at_once():
        raise error
    assert str(error) in str(failed.value)


@pytest.mark.parametrize("error", FAULTS, ids=lambda e: type(e).__name__)
def test_a_fault_is_left_to_the_tasks_retries(error):
    from kafka_ledger.runtimes.airflow_tasks import refusals_fail_at_once

    assert not isinstance(error, Refusal)
    with pytest.raises(type(error)), refusals_fail_at_once():
        raise error


def test_the_plan_task_of_an_undeclared_pipeline_fails_at_once(monkeypatch, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from kafka_ledger.airflow.dags import plan_task

    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text("pipelines: {}\n")
    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", str(pipelines))
    with pytest.raises(AirflowFailException, match="pipeline 'gone' is not declared"):
        plan_task("gone", "kafka_ledger__gone", params={})


def test_the_spark_job_exits_with_its_own_code_on_a_refusal(monkeypatch, capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "ingest_batch", Path(__file__).resolve().parents[2] / "spark_jobs" / "ingest_batch.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)

    def refuse(*args: object) -> None:
        raise LostDataError([OffsetRange("t", 0, 1, 5)])

    monkeypatch.setattr(job, "run_job", refuse)
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://u:p@h/db")
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k:9092")
    assert job.main(["--pipeline", "p", "--batch-id", "1"]) == EXIT_REFUSED
    assert "refused, not retried: " in capsys.readouterr().err
