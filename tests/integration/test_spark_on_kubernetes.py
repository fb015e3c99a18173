"""A batch's driver in cluster deploy mode on Kubernetes: the real spark-submit, through the DAG's own operator,
deploys the driver pod to a mock Kubernetes API server (fabric8's, `scripts/stack.sh kubernetes-mock`); the pod it
asks for is read back: its image, its arguments, its environment (the secrets by reference to a Kubernetes Secret,
never their values), the package and pipelines file shipped with the job; the driver's exit code (as a kubelet
reports it) decides the task."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from integration_support import pipeline_name, stack
from jproperties import Properties

from kafka_ledger.ledger.db import EXIT_FENCED

pytestmark = pytest.mark.integration

SECRET = "kafka-ledger-secrets"
NAMESPACE = "batches"


def api(path: str, body: dict | None = None, method: str = "GET") -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{os.environ['KL_KUBERNETES_MOCK_PORT']}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def pod_names() -> set[str]:
    return {pod["metadata"]["name"] for pod in api(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]}


def finish_driver_pods(exit_code: int, pods: list[dict], stop: threading.Event) -> None:
    """What the kubelet would do: run each new driver pod, and end it with `exit_code`."""
    done = pod_names()
    while not stop.is_set():
        for pod in api(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
            name = pod["metadata"]["name"]
            if name in done:
                continue
            done.add(name)
            pods.append(pod)
            container = pod["spec"]["containers"][0]["name"]
            pod["status"] = {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [{
                "name": container, "ready": False, "restartCount": 0, "image": pod["spec"]["containers"][0]["image"],
                "imageID": "", "state": {"terminated": {"exitCode": exit_code, "reason": "Completed"}}}]}
            api(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status", pod, method="PUT")
        time.sleep(0.2)


@pytest.fixture
def kubernetes(monkeypatch, tmp_path):
    """The mock API server as the `spark_default` connection's master, in cluster deploy mode, with a Spark
    settings folder of its own (the local stack's spark-defaults.conf holds its cluster's secret and loopback
    addresses, which a driver in Kubernetes must not get)."""
    stack("kubernetes-mock")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    port = int(os.environ["KL_KUBERNETES_MOCK_PORT"])
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({
        "conn_type": "spark", "host": "k8s://http://127.0.0.1", "port": port,
        "extra": {"deploy-mode": "cluster", "namespace": NAMESPACE}}))
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_MASTER", f"k8s://http://127.0.0.1:{port}")
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_DRIVER_SECRET", SECRET)
    yield port
    # What spark-submit uploaded (the pipeline's spark.kubernetes.file.upload.path): a package zip per submission.
    shutil.rmtree(Path(os.environ.get("KL_STATE", "/tmp")) / "kubernetes-uploads", ignore_errors=True)


def submit(batch_id: int, exit_code: int) -> tuple[list[dict], Exception | None, str]:
    """The DAG's Spark task for `batch_id` run as Airflow runs it; the driver pods it made, its error and the
    spark-submit command it ran."""
    from kafka_ledger.config.pipeline import get_pipeline
    from kafka_ledger.config.settings import SPARK_SUBMIT_CONN_ID
    from kafka_ledger.runtimes.submit.airflow import SubmitBatchOperator
    from kafka_ledger.runtimes.submit.spark_submit import SPARK_APPLICATION, spark_conf

    name = pipeline_name("on_kubernetes")
    operator = SubmitBatchOperator(
        pipeline_name=name, task_id="read_and_stage", application=str(SPARK_APPLICATION),
        conn_id=SPARK_SUBMIT_CONN_ID, name=f"kafka-ledger-{name}",
        application_args=["--pipeline", name, "--batch-id", str(batch_id)], conf=spark_conf(get_pipeline(name)))
    pods: list[dict] = []
    stop = threading.Event()
    kubelet = threading.Thread(target=finish_driver_pods, args=(exit_code, pods, stop), daemon=True)
    kubelet.start()
    error = None
    try:
        operator.execute({})
    except Exception as exc:  # noqa: BLE001 - the task's failure is what the caller checks
        error = exc
    finally:
        stop.set()
        kubelet.join()
    return pods, error, " ".join(operator._hook._build_spark_submit_command(str(SPARK_APPLICATION)))


def test_a_driver_in_kubernetes_gets_the_package_and_its_secrets_by_reference(kubernetes, dsn, servers):
    pods, error, command = submit(41, exit_code=0)
    assert error is None, error
    (pod,) = pods
    container = pod["spec"]["containers"][0]
    assert container["image"] == "registry.example/kafka-ledger:1.0"
    args = container["args"]
    assert args[:2] == ["driver", "--properties-file"] and "org.apache.spark.deploy.PythonRunner" in args
    assert args[-4:] == ["--pipeline", pipeline_name("on_kubernetes"), "--batch-id", "41"]
    assert args[-5].endswith("/ingest_batch.py")
    env = {e["name"]: e for e in container["env"]}
    for name in ("KAFKA_LEDGER_DB_URL", "KAFKA_LEDGER_KAFKA_CONFIG"):
        assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": name}}}
    assert env["KAFKA_LEDGER_BOOTSTRAP_SERVERS"]["value"] == servers
    assert env["KAFKA_LEDGER_PIPELINES"]["value"] == "pipelines.yaml"

    # The Spark settings the driver gets (a ConfigMap): the package and the pipelines file, uploaded with the job.
    config_maps = api(f"/api/v1/namespaces/{NAMESPACE}/configmaps")["items"]
    (properties,) = [c["data"]["spark.properties"] for c in config_maps
                     if c["metadata"]["ownerReferences"][0]["name"] == pod["metadata"]["name"]]
    parsed = Properties()
    parsed.load(properties, "utf-8")
    settings = {key: parsed[key].data for key in parsed}
    (package,) = settings["spark.submit.pyFiles"].split(",")
    assert Path(package.removeprefix("file:")).name.startswith("kafka_ledger-")
    with zipfile.ZipFile(package.removeprefix("file:")) as archive:
        assert "kafka_ledger/runtimes/submit/job.py" in archive.namelist()
    assert any(f.endswith("/pipelines.yaml") for f in settings["spark.files"].split(","))

    # No secret anywhere the cluster's users can read (the pod, its settings), nor on spark-submit's command line.
    from psycopg2.extensions import parse_dsn

    password = parse_dsn(dsn).get("password")
    everything = json.dumps(pods) + json.dumps(config_maps) + command
    assert not password or password not in everything


def test_the_drivers_exit_code_decides_the_task(kubernetes):
    _, error, _ = submit(42, exit_code=EXIT_FENCED)
    assert error is not None and "fenced" in str(error), error
