"""The generated pipeline DAGs: wiring, run limits, and the exact spark-submit command they launch."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from kafka_ledger.airflow.dags import SPARK_POOL, build_pipeline_dag
from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.runtimes.submit.spark_submit import BASE_SPARK_CONF, SPARK_APPLICATION

REPO = Path(__file__).resolve().parents[2]

PIPELINES = parse_pipelines(
    """
pipelines:
  clicks:
    topics: [clicks, clicks-eu]
    output_table: clicks
    max_records_per_partition: 1000
    retries: 3
    retry_delay_seconds: 10
    spark_timeout_minutes: 20
    spark_conf: {spark.executor.memory: 2g}
    columns:
      - {name: click_id, type: string, required: true}
"""
)


@pytest.fixture
def dag():
    return build_pipeline_dag(PIPELINES["clicks"])


def test_tasks_run_plan_then_spark_then_commit_then_drain(dag):
    assert dag.dag_id == "kafka_ledger__clicks"
    order = ["plan_batch", "read_and_stage", "commit_batch", "backlog_remains", "drain_backlog"]
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    # plan_batch also feeds its result to the later tasks; nothing else runs before Spark has succeeded.
    assert dag.get_task("commit_batch").upstream_task_ids == {"plan_batch", "read_and_stage"}
    # The retention check runs beside the batch's Spark work, never before or after it, and is not retried.
    check = dag.get_task("check_retention_headroom")
    assert check.upstream_task_ids == {"plan_batch"} and check.downstream_task_ids == set() and check.retries == 0
    assert set(dag.task_ids) == {*order, "check_retention_headroom"}


def test_one_run_at_a_time_hourly_with_retries_and_timeouts(dag):
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"  # each run covers the hour before it
    assert dag.timetable.summary == "0 * * * *"
    spark = dag.get_task("read_and_stage")
    assert spark.pool == SPARK_POOL
    assert spark.max_active_tis_per_dag == 1  # one Spark batch of the pipeline at a time, over all its runs
    assert spark.retries == 3 and spark.retry_delay == timedelta(seconds=10) and spark.retry_exponential_backoff
    assert spark.execution_timeout == timedelta(minutes=20)
    assert dag.get_task("plan_batch").execution_timeout == timedelta(minutes=10)
    assert dag.get_task("commit_batch").execution_timeout == timedelta(minutes=30)


def test_drain_triggers_the_same_dag(dag):
    drain = dag.get_task("drain_backlog")
    assert drain.trigger_dag_id == "kafka_ledger__clicks"


def test_spark_submit_command_is_exact(dag, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    spark = dag.get_task("read_and_stage")
    # What the templates render to at run time.
    spark.jars = "/jars/a.jar,/jars/b.jar"
    spark.application_args = ["--pipeline", "clicks", "--batch-id", "42"]

    command = spark._get_hook()._build_spark_submit_command(spark.application)

    conf = {**BASE_SPARK_CONF, "spark.executor.memory": "2g"}  # the pipeline's spark_conf comes last
    assert command == [
        "spark-submit", "--master", "local[*]",
        *[part for key, value in conf.items() for part in ("--conf", f"{key}={value}")],
        "--jars", "/jars/a.jar,/jars/b.jar",
        "--name", "kafka-ledger-clicks",
        str(SPARK_APPLICATION), "--pipeline", "clicks", "--batch-id", "42",
    ]


# Kubernetes takes the provider's YARN branch for env_vars, but its hook needs the cncf.kubernetes provider.
@pytest.mark.parametrize("master", ["yarn", "spark://master:7077"])
def test_no_secret_reaches_the_spark_submit_command_line_on_any_master(dag, monkeypatch, master):
    """The Spark provider turns env_vars into --conf arguments on YARN and Kubernetes: the job's settings
    (the ledger URL, Kafka passwords) reach spark-submit as its inherited environment instead."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": master}))
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://ledger:s3cret@db:5432/ledger")
    monkeypatch.setenv("KAFKA_LEDGER_KAFKA_CONFIG", json.dumps({"sasl.password": "k4fka"}))
    spark = dag.get_task("read_and_stage")
    hook = spark._get_hook()

    command = " ".join(hook._build_spark_submit_command(spark.application))

    assert f"--master {master}" in command
    assert "KAFKA_LEDGER" not in command and "s3cret" not in command and "k4fka" not in command
    assert not hook._env  # nothing for the provider to place anywhere but the inherited environment


def test_a_master_exported_after_the_connection_was_made_is_refused_not_ignored(dag, monkeypatch):
    from kafka_ledger.config.services import SettingsError
    from kafka_ledger.runtimes.submit.spark_submit import check_master

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_MASTER", "spark://127.0.0.1:17077")
    with pytest.raises(SettingsError, match=r"KAFKA_LEDGER_SPARK_MASTER is 'spark://127.0.0.1:17077' but the "
                                            r"connection 'spark_default' says 'local\[\*\]'"):
        check_master(dag.get_task("read_and_stage")._get_hook())
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_MASTER", "local[*]")
    check_master(dag.get_task("read_and_stage")._get_hook())


def test_dags_folder_builds_a_dag_per_declared_pipeline(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", str(REPO / "config" / "pipelines.yaml"))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"kafka_ledger__impressions", "kafka_ledger__impressions_lake",
                                "kafka_ledger__impressions_lake__maintenance", "kafka_ledger__impressions_avro",
                                "kafka_ledger__impressions_protobuf",
                                "kafka_ledger__customers", "kafka_ledger__everyday_types"}


@pytest.mark.parametrize("wanted", ["kafka_ledger__impressions_lake", "kafka_ledger__impressions_lake__maintenance"])
def test_a_tasks_process_builds_its_own_dag_only(monkeypatch, wanted):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", str(REPO / "config" / "pipelines.yaml"))
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", wanted)  # as Airflow sets it in a task's process
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {wanted}


def test_an_iceberg_sinks_table_is_maintained_by_a_dag_on_its_own_schedule(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", str(REPO / "config" / "pipelines.yaml"))
    dag = DagBag(dag_folder=str(REPO / "dags")).dags["kafka_ledger__impressions_lake__maintenance"]
    (maintain,) = dag.tasks
    assert maintain.task_id == "maintain_lake"
    assert maintain.pool == "kafka_ledger_spark"  # with the batches' Spark work, within the pool's slots
    assert dag.max_active_runs == 1 and not dag.catchup
    assert dag.timetable.expression == "0 0 * * *"  # @daily, the default


def test_an_invalid_pipeline_is_an_import_error_and_the_others_keep_their_dags(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    path = tmp_path / "pipelines.yaml"
    text = (REPO / "config" / "pipelines.yaml").read_text()
    path.write_text(text + "  orders:\n    topics: [orders]\n    output_table: orders\n"
                           "    columns: [{name: id, type: varchar}]\n")
    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", str(path))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert set(bag.dag_ids) == {"kafka_ledger__impressions", "kafka_ledger__impressions_lake",
                                "kafka_ledger__impressions_lake__maintenance", "kafka_ledger__impressions_avro",
                                "kafka_ledger__impressions_protobuf",
                                "kafka_ledger__customers", "kafka_ledger__everyday_types"}
    assert list(bag.import_errors) == [str(REPO / "dags" / "kafka_ledger_invalid_pipelines.py")]
    (error,) = bag.import_errors.values()
    assert "pipeline 'orders' is invalid" in error
    assert "pipelines.orders.columns.0.type" in error


def test_trigger_form_offers_every_mode_in_sections_with_catch_up_as_default(dag):
    params = dag.params
    assert set(params.keys()) == {"mode", "reason", "ranges", "window_from", "window_to", "batch_id",
                                   "reader_schema"}
    mode = params.get_param("mode")
    assert mode.value == "catch_up"
    assert mode.schema["enum"] == ["catch_up", "offset_ranges", "time_window", "replay_batch"]
    assert {params.get_param(name).schema.get("section") for name in params.keys()} == {
        "Run", "Offset ranges", "Time window", "Replay"}
    assert all(params.get_param(name).schema.get("title") for name in params.keys())
    # Airflow's form requires a field whose type does not admit null: only the mode is required.
    reason = params.get_param("reason")
    assert reason.value is None and "null" in reason.schema["type"]


def test_hourly_data_interval_covers_one_hour(dag):
    from pendulum import datetime as pdt

    interval = dag.timetable.infer_manual_data_interval(run_after=pdt(2026, 11, 20, 10, 30, tz="UTC"))
    assert (interval.start, interval.end) == (pdt(2026, 11, 20, 9, tz="UTC"), pdt(2026, 11, 20, 10, tz="UTC"))


def test_connect_runtime_reads_and_commits_in_one_task(monkeypatch):
    from kafka_ledger.runtimes.connect.airflow import ReadAndCommitOperator

    monkeypatch.setenv("KAFKA_LEDGER_SPARK_RUNTIME", "connect")
    dag = build_pipeline_dag(PIPELINES["clicks"])
    order = ["plan_batch", "read_and_commit", "backlog_remains", "drain_backlog"]
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    # No commit_batch: the Spark task's transaction commits.
    assert set(dag.task_ids) == {*order, "check_retention_headroom"}
    spark = dag.get_task("read_and_commit")
    assert isinstance(spark, ReadAndCommitOperator) and spark.pipeline_name == "clicks"
    assert spark.pool == SPARK_POOL and spark.execution_timeout == timedelta(minutes=20)
    assert spark.retries == 3 and spark.on_failure_callback
    assert "Spark runtime `connect`" in dag.doc_md


def test_a_doorbell_pipelines_run_ends_with_its_spark_work_no_drain(monkeypatch):
    """Its doorbell rings again after a commit while data waits: a drain would only add a task to every run."""
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_RUNTIME", "connect")
    dag = build_pipeline_dag(parse_pipelines(
        "pipelines:\n  rung:\n    topics: [rung]\n    output_table: rung\n    trigger: doorbell\n"
        "    columns: [{name: id, type: string}]\n")["rung"])
    assert set(dag.task_ids) == {"plan_batch", "read_and_commit", "check_retention_headroom"}
    assert dag.get_task("read_and_commit").downstream_task_ids == set()
    assert "doorbell rings again after each commit" in dag.doc_md and "drain_backlog" not in dag.doc_md
    assert dag.max_active_runs == 1


def test_a_pipeline_can_keep_spark_submit_in_a_connect_deployment(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_RUNTIME", "connect")
    pinned = PIPELINES["clicks"].model_copy(update={"spark_runtime": "submit"})
    assert {"read_and_stage", "commit_batch"} <= set(build_pipeline_dag(pinned).task_ids)


@pytest.mark.parametrize("dsn", ["postgresql://ledger:s3cr%2Ft@db:5432/ledger",
                                 "host=db dbname=ledger user=ledger password=s3cr/t"])
def test_the_ledger_password_is_registered_as_a_secret_whatever_the_dsn_form(monkeypatch, dsn):
    import airflow.sdk.log

    from kafka_ledger.config.settings import deployment_services
    from kafka_ledger.runtimes import airflow_tasks

    masked: list[str] = []
    monkeypatch.setattr(airflow.sdk.log, "mask_secret", masked.append)
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", dsn)
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k:9092")
    services = deployment_services()
    airflow_tasks.mask_secrets(services, PIPELINES["clicks"])
    assert services.ledger.libpq() == dsn and "s3cr" not in str(services.ledger)
    assert masked == [dsn, "s3cr/t"]


def test_the_schema_registrys_credentials_are_registered_as_secrets_for_avro_values(monkeypatch):
    import airflow.sdk.log

    from kafka_ledger.config.settings import deployment_services
    from kafka_ledger.runtimes import airflow_tasks

    masked: list[str] = []
    monkeypatch.setattr(airflow.sdk.log, "mask_secret", masked.append)
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://h/d")
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k:9092")
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_URL", "https://registry:8081")
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG", '{"basic.auth.user.info": "ingest:r3g"}')
    avro = PIPELINES["clicks"].model_copy(update={"value": PIPELINES["clicks"].value.model_copy(
        update={"format": "avro"})})
    airflow_tasks.mask_secrets(deployment_services(), avro)
    assert masked == ["postgresql://h/d", "ingest:r3g", "r3g"]


@pytest.mark.parametrize(("runtime", "committing_task"), [("connect", "read_and_commit"), ("submit", "commit_batch")])
def test_the_committing_task_updates_the_output_tables_asset(monkeypatch, runtime, committing_task):
    from kafka_ledger.airflow.dags import output_asset

    monkeypatch.setenv("KAFKA_LEDGER_SPARK_RUNTIME", runtime)
    pipeline = PIPELINES["clicks"]
    dag = build_pipeline_dag(pipeline)
    asset = output_asset(pipeline)
    assert asset.name == f"kafka_ledger.{pipeline.qualified_output_table}"
    assert [t.task_id for t in dag.tasks if asset in t.outlets] == [committing_task]


def test_the_spark_job_and_its_log_configuration_are_where_spark_submit_is_told_to_find_them():
    """A module move once sent spark-submit to include/spark_jobs/ingest_batch.py, which does not exist."""
    from kafka_ledger.runtimes.submit.spark_submit import SPARK_LOG_CONFIG

    assert SPARK_APPLICATION == REPO / "spark_jobs" / "ingest_batch.py" and SPARK_APPLICATION.is_file()
    assert SPARK_LOG_CONFIG.is_file()
