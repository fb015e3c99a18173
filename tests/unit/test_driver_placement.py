"""Where a batch's driver runs: on the submitting machine (its environment), or in a Kubernetes cluster (its pod's
environment, secrets by reference, the pipelines file and the package shipped with the job)."""

import json
import zipfile

import pytest

from kafka_ledger.config import pipeline as config
from kafka_ledger.config.services import KafkaClient, LedgerDatabase, Services, SettingsError
from kafka_ledger.runtimes.submit.spark_submit import PACKAGE_ROOT, driver_submission, package_zip

SERVICES = Services(LedgerDatabase("postgresql://u:s3cret@h/d", 30, 20),
                    KafkaClient("k:1", {"sasl.password": "hush", "security.protocol": "SASL_SSL"}))
PIPELINE = config.parse_pipelines(json.dumps({"pipelines": {"p": {
    "topics": ["t"], "output_table": "t", "columns": [{"name": "id", "type": "string"}],
    "spark_conf": {"spark.kubernetes.container.image": "registry.example/kafka-ledger:1"}}}}))["p"]
K8S = "k8s://https://10.0.0.1:6443"


@pytest.fixture(autouse=True)
def pipelines_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", "/etc/kafka-ledger/pipelines.yaml")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "no-spark-conf"))


def test_a_driver_on_this_machine_reads_its_settings_from_the_environment_spark_submit_inherits():
    submission = driver_submission("spark://m:7077", None, SERVICES, PIPELINE)
    assert submission.environment["KAFKA_LEDGER_DB_URL"] == "postgresql://u:s3cret@h/d"
    assert (submission.files, submission.py_files) == (None, None)
    assert not any("s3cret" in value or "hush" in value for value in submission.conf.values())


def test_a_driver_in_kubernetes_gets_secrets_by_reference_only_and_the_rest_in_its_pod_environment(monkeypatch,
                                                                                                   tmp_path):
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_DRIVER_SECRET", "kafka-ledger")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    submission = driver_submission(K8S, "cluster", SERVICES, PIPELINE)
    conf = submission.conf
    assert submission.environment == {}  # nothing reaches the driver through spark-submit's own environment
    assert conf["spark.kubernetes.driver.secretKeyRef.KAFKA_LEDGER_DB_URL"] == "kafka-ledger:KAFKA_LEDGER_DB_URL"
    assert conf["spark.kubernetes.driver.secretKeyRef.KAFKA_LEDGER_KAFKA_CONFIG"] == \
        "kafka-ledger:KAFKA_LEDGER_KAFKA_CONFIG"
    assert conf["spark.kubernetes.driverEnv.KAFKA_LEDGER_BOOTSTRAP_SERVERS"] == "k:1"
    assert conf["spark.kubernetes.driverEnv.KAFKA_LEDGER_PIPELINES"] == "pipelines.yaml"  # shipped with --files
    assert conf["spark.kubernetes.container.image"] == "registry.example/kafka-ledger:1"  # the pipeline's own
    assert {"KAFKA_LEDGER_DB_URL", "KAFKA_LEDGER_KAFKA_CONFIG"}.isdisjoint(
        key.removeprefix("spark.kubernetes.driverEnv.") for key in conf)
    assert not any("s3cret" in value or "hush" in value for value in conf.values())
    assert "log4j2" not in conf["spark.driver.extraJavaOptions"]  # this machine's path means nothing there
    assert submission.files == "/etc/kafka-ledger/pipelines.yaml"
    assert submission.py_files.endswith(".zip")


def test_a_driver_in_kubernetes_needs_the_secret_named_and_one_in_yarn_is_refused():
    with pytest.raises(SettingsError, match="set KAFKA_LEDGER_SPARK_DRIVER_SECRET to its name"):
        driver_submission(K8S, "cluster", SERVICES, PIPELINE)
    with pytest.raises(SettingsError, match="on YARN use client deploy mode"):
        driver_submission("yarn", "cluster", SERVICES, PIPELINE)


def test_the_package_is_zipped_whole_once_per_content(tmp_path):
    first = package_zip(tmp_path)
    assert package_zip(tmp_path) == first and len(list(tmp_path.iterdir())) == 1
    with zipfile.ZipFile(first) as archive:
        names = set(archive.namelist())
    expected = {f"kafka_ledger/{p.relative_to(PACKAGE_ROOT)}" for p in PACKAGE_ROOT.rglob("*.py")
                if "__pycache__" not in p.parts}
    assert expected <= names and "kafka_ledger/runtimes/submit/spark_submit.py" in names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)


def test_the_drivers_secret_holds_the_secret_settings_under_their_variables_and_nothing_else():
    from kafka_ledger.runtimes.submit.spark_submit import driver_secret

    manifest = driver_secret(SERVICES, [PIPELINE], "kafka-ledger", "batches")
    assert manifest["kind"] == "Secret" and manifest["metadata"] == {"name": "kafka-ledger", "namespace": "batches"}
    assert manifest["stringData"] == {
        "KAFKA_LEDGER_DB_URL": "postgresql://u:s3cret@h/d",
        "KAFKA_LEDGER_KAFKA_CONFIG": json.dumps({"sasl.password": "hush", "security.protocol": "SASL_SSL"})}


def test_the_cli_writes_the_secret_for_its_owner_alone_and_prints_no_value(tmp_path, monkeypatch, capsys):
    import os

    from kafka_ledger.ops import cli

    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://u:s3cret@h/d")
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k:1")
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "columns": [{"name": "id", "type": "string"}]}}}))
    target = tmp_path / "secret.json"
    assert cli.main(["--config", str(pipelines), "spark-secret", "--output", str(target)]) == 0
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert json.loads(target.read_text())["stringData"]["KAFKA_LEDGER_DB_URL"] == "postgresql://u:s3cret@h/d"
    out = capsys.readouterr()
    assert "KAFKA_LEDGER_DB_URL" in out.out and "s3cret" not in out.out + out.err
    assert cli.main(["--config", str(pipelines), "spark-secret", "--output", str(target)]) == 4  # never overwritten


def test_a_driver_on_a_standalone_cluster_is_spark_s_python_runner_given_the_job_and_the_package(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    submission = driver_submission("spark://m:7077", "cluster", SERVICES, PIPELINE)
    assert submission.java_class == "org.apache.spark.deploy.PythonRunner"
    assert submission.application.endswith(".jar") and zipfile.is_zipfile(submission.application)
    job, package = submission.leading_args
    assert job.endswith("spark_jobs/ingest_batch.py") and package.endswith(".zip")
    assert submission.application_args(PIPELINE, 7) == [job, package, "--pipeline", "p", "--batch-id", "7"]
    # The standalone master hands the driver the submission's environment; its end is read from the ledger.
    assert submission.environment["KAFKA_LEDGER_DB_URL"] == "postgresql://u:s3cret@h/d"
    assert submission.outcome_in_ledger and submission.conf["spark.standalone.submit.waitAppCompletion"] == "true"


def test_no_setting_that_looks_like_a_secret_goes_to_a_drivers_config_map_on_kubernetes(monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_DRIVER_SECRET", "kafka-ledger")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    (tmp_path / "spark-defaults.conf").write_text("spark.authenticate true\nspark.authenticate.secret s3cr3tv4lue\n"
                                                  "spark.sql.catalog.lake.jdbc.password pw-9f8e7d\n")
    with pytest.raises(SettingsError, match="spark.authenticate.secret, spark.sql.catalog.lake.jdbc.password .* would "
                                            "be written there") as refused:
        driver_submission(K8S, "cluster", SERVICES, PIPELINE)
    assert "s3cr3tv4lue" not in str(refused.value) and "pw-9f8e7d" not in str(refused.value)
    (tmp_path / "spark-defaults.conf").write_text("spark.authenticate true\n")
    driver_submission(K8S, "cluster", SERVICES, PIPELINE)  # a Secret's references are names: allowed
