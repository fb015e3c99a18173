"""spark-submit of a batch's job: the application, its jars, its Spark settings and environment, and the Spark
provider's hook that runs it (outside Airflow too: the CLI's replay)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kafka_ledger.config.pipeline import PipelineConfig, config_path
from kafka_ledger.config.services import Services, SettingsError
from kafka_ledger.config.settings import SPARK_SUBMIT_CONN_ID, deployment_settings, env_name
from kafka_ledger.formats.known import value_format
from kafka_ledger.spark.defaults import SPARK_DEFAULTS, spark_conf_dir, spark_defaults

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

PROJECT_ROOT = Path(__file__).resolve().parents[4]
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # include/kafka_ledger
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


# The job's settings that hold secrets (a password in the ledger's URL, SASL's in Kafka's settings, the registry's
# basic auth): a driver in the cluster reads them from a Kubernetes Secret, never from its submission's settings.
SECRET_SETTINGS = ("db_url", "kafka_config", "schema_registry_config")


class SparkJobFailed(RuntimeError):
    """The batch's Spark job ended without doing its part."""


def spark_job_environment(services: Services, pipeline: PipelineConfig) -> dict[str, str]:
    """What the batch's Spark job reads from its environment: where the ledger, Kafka, the pipelines and (for a format
    that needs it) the schema registry are, and the ledger's timeouts.

    It holds secrets, so it reaches spark-submit as the environment it inherits, never as the hook's
    env_vars: on YARN and Kubernetes the Spark provider turns those into `--conf` arguments on its command line.
    """
    environment = {
        env_name("db_url"): services.ledger.libpq(), env_name("bootstrap_servers"): services.kafka.servers,
        env_name("kafka_config"): json.dumps(dict(services.kafka.settings)),
        env_name("db_statement_timeout"): str(services.ledger.statement_timeout),
        env_name("db_lock_timeout"): str(services.ledger.lock_timeout), env_name("pipelines"): str(config_path())}
    if value_format(pipeline).uses_registry:
        registry = services.registry()
        environment[env_name("schema_registry_url")] = registry.url
        environment[env_name("schema_registry_config")] = json.dumps(dict(registry.settings))
    return environment


@dataclass(frozen=True)
class DriverSubmission:
    """What spark-submit needs, beside the batch's arguments, to run the batch's driver where its master and deploy
    mode put it: the environment spark-submit inherits (a driver on this machine reads it), or the settings, files
    and package that reach a driver in the cluster."""

    conf: dict[str, str]
    environment: dict[str, str] = field(default_factory=dict)
    files: str | None = None
    py_files: str | None = None
    # What spark-submit runs: the job itself, or a JVM class and jar that runs it (then the job's path and package
    # lead the arguments).
    application: str = str(SPARK_APPLICATION)
    java_class: str | None = None
    leading_args: tuple[str, ...] = ()
    # Whether spark-submit's end says nothing of the job's (a driver on a standalone cluster): the ledger says then.
    outcome_in_ledger: bool = False

    def application_args(self, pipeline: PipelineConfig, batch_id: int | str) -> list[str]:
        return [*self.leading_args, "--pipeline", pipeline.name, "--batch-id", str(batch_id)]


# Spark 4.0's spark-submit refuses a Python application in cluster deploy mode on a standalone master, not a JVM
# one: Spark's own PythonRunner (what runs a .py driver in client mode) is one. The worker runs it with the job and
# kafka-ledger's package as its first arguments: paths every worker must see.
PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"


def driver_submission(master: str, deploy_mode: str | None, services: Services, pipeline: PipelineConfig
                      ) -> DriverSubmission:
    """How the batch's job reaches its driver: on this machine (client deploy mode, the default) through the
    environment spark-submit inherits; on a standalone cluster's worker (cluster deploy mode) through that same
    environment, which the master's submission client hands over, with Spark's PythonRunner as the application; on
    Kubernetes (cluster deploy mode) through the pod's environment, its secrets from the Secret `spark_driver_secret`
    names, the pipelines file and kafka-ledger's package shipped with the job."""
    environment = spark_job_environment(services, pipeline)
    if deploy_mode != "cluster":
        return DriverSubmission(spark_conf(pipeline), environment)
    if master.startswith("spark://"):
        # The standalone master's submission client hands the driver spark-submit's whole environment (over its
        # authenticated RPC, never a command line); it waits for the driver's end, but not for its exit code.
        return DriverSubmission({**spark_conf(pipeline), "spark.standalone.submit.waitAppCompletion": "true"},
                                environment, application=str(launcher_jar()), java_class=PYTHON_RUNNER,
                                leading_args=(str(SPARK_APPLICATION), str(package_zip())), outcome_in_ledger=True)
    if not master.startswith("k8s://"):
        raise SettingsError(
            f"the spark_default connection puts the driver in the cluster (deploy-mode cluster) on {master!r}: "
            "kafka-ledger runs a driver in the cluster on Kubernetes (k8s://) and standalone (spark://) masters; on "
            "YARN use client deploy mode (the default), see docs/deployment.md#spark-on-kubernetes")
    secret = deployment_settings().spark_driver_secret
    if not secret:
        raise SettingsError(
            f"a driver in cluster deploy mode on {master} reads the ledger's and Kafka's secrets from a Kubernetes "
            f"Secret: set {env_name('spark_driver_secret')} to its name (keys: "
            f"{', '.join(env_name(name) for name in SECRET_SETTINGS)}; `kafka-ledger spark-secret` writes it)")
    _refuse_secrets_in_settings(spark_conf(pipeline), master)
    secrets = {env_name(name) for name in SECRET_SETTINGS}
    pipelines = Path(environment[env_name("pipelines")])
    # Spark downloads --files into the driver's working directory before the job starts (SPARK-33782).
    environment[env_name("pipelines")] = pipelines.name
    conf = {**spark_conf(pipeline), "spark.driver.extraJavaOptions": "-Duser.timezone=UTC"}  # no local log config
    for name, value in sorted(environment.items()):
        if name in secrets:
            conf[f"spark.kubernetes.driver.secretKeyRef.{name}"] = f"{secret}:{name}"
        else:
            conf[f"spark.kubernetes.driverEnv.{name}"] = value
    return DriverSubmission(conf, files=str(pipelines), py_files=str(package_zip()))


# Setting names the Spark provider masks as secrets too; a Secret's own references are names, not values.
_SECRET_SETTING = re.compile(r"secret|password", re.IGNORECASE)
_SECRET_REFERENCES = ("spark.kubernetes.driver.secretKeyRef.", "spark.kubernetes.executor.secretKeyRef.",
                      "spark.kubernetes.driver.secrets.", "spark.kubernetes.executor.secrets.")


def _refuse_secrets_in_settings(conf: dict[str, str], master: str) -> None:
    """spark-submit writes every Spark setting of a driver on Kubernetes (spark-defaults.conf's, the pipeline's) into a
    ConfigMap of its namespace, readable in clear: refuse those that look like secrets."""
    conf_dir = spark_conf_dir()
    defaults = conf_dir / SPARK_DEFAULTS if conf_dir else None
    found = {**(spark_defaults(defaults) if defaults and defaults.exists() else {}), **conf}
    secret = sorted(key for key in found if _SECRET_SETTING.search(key) and not key.startswith(_SECRET_REFERENCES))
    if secret:
        raise SettingsError(
            f"a driver in cluster deploy mode on {master} gets every Spark setting in a ConfigMap of its namespace, "
            f"in clear: {', '.join(secret)} (from {defaults or 'the pipeline'} or the pipeline's spark_conf) would be "
            "written there. Leave them out of the settings a submission carries (Spark on Kubernetes makes its own "
            "authentication secret); see docs/deployment.md#spark-on-kubernetes")


def driver_secret(services: Services, pipelines: Iterable[PipelineConfig], name: str, namespace: str | None
                  ) -> dict[str, object]:
    """The Kubernetes Secret a driver in cluster deploy mode reads the secret settings of `pipelines`' jobs from
    (SECRET_SETTINGS, under their variables' names), as a manifest for `kubectl apply`."""
    secrets = {env_name(setting) for setting in SECRET_SETTINGS}
    data: dict[str, str] = {}
    for pipeline in pipelines:
        data.update((key, value) for key, value in spark_job_environment(services, pipeline).items() if key in secrets)
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata,
            "stringData": dict(sorted(data.items()))}


def launcher_jar(folder: Path | None = None) -> Path:
    """An empty jar: the application spark-submit is given for a Python driver on a standalone cluster (its class,
    PythonRunner, is Spark's own)."""
    return _zip_once((folder or _packages_folder()) / "kafka-ledger-driver.jar",
                     {"META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\n"})


def package_zip(folder: Path | None = None) -> Path:
    """kafka-ledger's package as a zip for --py-files (a driver in the cluster imports it from there), made once
    per content in `folder` (the system's temporary folder by default): its name carries the content's hash."""
    entries = {f"{PACKAGE_ROOT.name}/{path.relative_to(PACKAGE_ROOT)}": path.read_bytes()
               for path in sorted(PACKAGE_ROOT.rglob("*"))
               if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}
    digest = hashlib.sha256()
    for name, content in entries.items():
        digest.update(name.encode() + b"\0" + content + b"\0")
    return _zip_once((folder or _packages_folder()) / f"kafka_ledger-{digest.hexdigest()[:16]}.zip", entries)


def _packages_folder() -> Path:
    return Path(tempfile.gettempdir()) / "kafka-ledger-packages"


def _zip_once(target: Path, entries: dict[str, bytes]) -> Path:
    """`target`, a zip of `entries` (name -> content), written unless it exists: whole or not at all when two tasks
    make it at once, and the same bytes for the same entries (a fixed time on each)."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    with zipfile.ZipFile(partial, "w") as archive:
        for name, content in entries.items():
            info = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            archive.writestr(info, content)
    partial.replace(target)
    return target


def spark_submit_hook(pipeline: PipelineConfig, batch_id: int, submission: DriverSubmission | None = None
                      ) -> SparkSubmitHook:
    """The Spark provider's hook for the batch's Spark job, set up as the DAG's operator sets it up.

    Uses the `spark_default` connection (AIRFLOW_CONN_SPARK_DEFAULT), or local[*] when none is defined.
    The job's settings must be in this process's environment (`submission.environment`) when its driver runs here.
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"}))
    submission = submission or DriverSubmission(spark_conf(pipeline))
    hook = SparkSubmitHook(
        conf=submission.conf,
        jars=spark_jars(),
        files=submission.files,
        py_files=submission.py_files,
        java_class=submission.java_class,
        name=f"kafka-ledger-{pipeline.name}",
        application_args=submission.application_args(pipeline, batch_id),
    )
    untrack_driver(hook, submission)
    return hook


def untrack_driver(hook: SparkSubmitHook, submission: DriverSubmission) -> None:
    """A driver whose outcome the ledger tells is not tracked by the provider: on a standalone master that would be
    through its REST submission server, which a master with an authentication secret refuses to run."""
    if submission.outcome_in_ledger:
        hook._should_track_driver_status = False


def check_driver_outcome(services: Services, pipeline: PipelineConfig, batch_id: int, master: str) -> None:
    """After a driver on a standalone cluster ended (spark-submit cannot say how): its batch must be staged or
    committed now, else the job failed (or was fenced before staging anything)."""
    from kafka_ledger.ledger import db as ledger

    with ledger.transaction(services.ledger) as cur:
        batch = ledger.pipeline_batch(cur, pipeline.name, batch_id)
    if batch.status not in ("written", "committed"):
        raise SparkJobFailed(
            f"batch {batch_id}'s driver on {master} ended without staging it (the batch is {batch.status} after "
            f"{batch.attempts} attempts{'; last error: ' + batch.last_error if batch.last_error else ''}); the "
            "driver's own output is in the worker's work folder (driver-*/stderr)")


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


def batch_submission(hook: SparkSubmitHook, services: Services, pipeline: PipelineConfig) -> DriverSubmission:
    """The batch's DriverSubmission for where `hook` (the provider's reading of `spark_default`) puts its driver,
    after checking its master."""
    check_master(hook)
    return driver_submission(hook._connection["master"], hook._connection["deploy_mode"], services, pipeline)


def job_exit_code(hook: SparkSubmitHook | None) -> int | None:
    """The exit code of the batch's job once spark-submit ended: spark-submit's own, or on Kubernetes in cluster
    deploy mode the driver container's, which spark-submit reports as it watches the pod."""
    if hook is None:
        return None
    if hook._is_kubernetes and hook._connection["deploy_mode"] == "cluster":
        return hook._spark_exit_code
    process = getattr(hook, "_submit_sp", None)
    return None if process is None else process.returncode


def submit_batch(pipeline: PipelineConfig, batch_id: int, services: Services) -> None:
    """Run the batch's Spark job with spark-submit outside Airflow (the CLI's replay); raises on failure."""
    hook = spark_submit_hook(pipeline, batch_id)
    submission = batch_submission(hook, services, pipeline)
    os.environ.update(submission.environment)
    spark_submit_hook(pipeline, batch_id, submission).submit(submission.application)
    if submission.outcome_in_ledger:
        check_driver_outcome(services, pipeline, batch_id, hook._connection["master"])
