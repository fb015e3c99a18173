"""spark-submit of a batch's job: the application, its jars, its Spark settings and environment, and the Spark
provider's hook that runs it (outside Airflow too: the CLI's replay)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kafka_ledger.config.pipeline import PipelineConfig, config_path
from kafka_ledger.config.services import Services, SettingsError
from kafka_ledger.config.settings import SPARK_SUBMIT_CONN_ID, deployment_settings, env_name, schema_registry

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

PROJECT_ROOT = Path(__file__).resolve().parents[4]
SPARK_APPLICATION = PROJECT_ROOT / "spark_jobs" / "ingest_batch.py"
SPARK_LOG_CONFIG = PROJECT_ROOT / "spark_jobs" / "log4j2.properties"

# Fixed settings every Spark job gets; a pipeline's spark_conf may override them.
BASE_SPARK_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": f"-Duser.timezone=UTC -Dlog4j2.configurationFile=file:{SPARK_LOG_CONFIG}",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "8",
}


def spark_jars() -> str:
    """Comma-separated local jars for spark-submit: the Kafka connector and the JDBC driver."""
    jars_dir = deployment_settings().spark_jars_dir
    if jars_dir is None:
        raise SettingsError("no Spark connector jars configured: set KAFKA_LEDGER_SPARK_JARS_DIR to their folder "
                            "(scripts/env.sh sets it for the local stack, and scripts/stack.sh install fills it)")
    jars = sorted(str(p) for p in jars_dir.glob("*.jar"))
    if not jars:
        raise FileNotFoundError(
            f"no Spark connector jars in {jars_dir}: run scripts/stack.sh install (or set KAFKA_LEDGER_SPARK_JARS_DIR)"
        )
    return ",".join(jars)


def spark_conf(pipeline: PipelineConfig) -> dict[str, str]:
    return {**BASE_SPARK_CONF, **pipeline.spark_conf}


def spark_job_environment(services: Services, pipeline: PipelineConfig) -> dict[str, str]:
    """What the batch's Spark job reads from its environment: where the ledger, Kafka, the pipelines and (for Avro
    values) the schema registry are, and the ledger's timeouts.

    It holds secrets, so it reaches spark-submit as the environment it inherits, never as the hook's
    env_vars: on YARN and Kubernetes the Spark provider turns those into `--conf` arguments on its command line.
    """
    environment = {
        env_name("db_url"): services.ledger.libpq(), env_name("bootstrap_servers"): services.kafka.servers,
        env_name("kafka_config"): json.dumps(dict(services.kafka.settings)),
        env_name("db_statement_timeout"): str(services.ledger.statement_timeout),
        env_name("db_lock_timeout"): str(services.ledger.lock_timeout), env_name("pipelines"): str(config_path())}
    if pipeline.value.format == "avro":
        registry = schema_registry()
        environment[env_name("schema_registry_url")] = registry.url
        environment[env_name("schema_registry_config")] = json.dumps(dict(registry.settings))
    return environment


def spark_submit_hook(pipeline: PipelineConfig, batch_id: int) -> SparkSubmitHook:
    """The Spark provider's hook for the batch's Spark job, set up as the DAG's operator sets it up.

    Uses the `spark_default` connection (AIRFLOW_CONN_SPARK_DEFAULT), or local[*] when none is defined.
    The job's settings must be in this process's environment (spark_job_environment).
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    return SparkSubmitHook(
        conf=spark_conf(pipeline),
        jars=spark_jars(),
        name=f"kafka-ledger-{pipeline.name}",
        application_args=["--pipeline", pipeline.name, "--batch-id", str(batch_id)],
    )


def check_master(hook: SparkSubmitHook) -> None:
    """Refuse to submit elsewhere than $KAFKA_LEDGER_SPARK_MASTER says, when it says something.

    The `spark_default` connection is derived from that variable when scripts/env.sh is sourced: one
    exported afterwards would otherwise be ignored, and the job would silently run on the old master.
    """
    wanted = deployment_settings().spark_master
    master = hook._connection["master"]  # the provider's own reading of the connection (host and port)
    if wanted and wanted != master:
        raise SettingsError(
            f"KAFKA_LEDGER_SPARK_MASTER is {wanted!r} but the connection {SPARK_SUBMIT_CONN_ID!r} says {master!r}: "
            f"spark-submit would run there. Source scripts/env.sh after exporting KAFKA_LEDGER_SPARK_MASTER, or "
            f"set AIRFLOW_CONN_SPARK_DEFAULT to the same master"
        )


def submit_batch(pipeline: PipelineConfig, batch_id: int, services: Services) -> None:
    """Run the batch's Spark job with spark-submit outside Airflow (the CLI's replay); raises on failure."""
    os.environ.update(spark_job_environment(services, pipeline))
    hook = spark_submit_hook(pipeline, batch_id)
    check_master(hook)
    hook.submit(str(SPARK_APPLICATION))


