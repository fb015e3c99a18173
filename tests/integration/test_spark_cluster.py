"""Pipelines on the local Spark standalone cluster (master and worker on loopback), in both Spark runtimes."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from integration_support import (
    BAD_VALUES,
    CLUSTER_MASTER,
    good_value,
    listening_sockets,
    not_loopback,
    spark_connect_on_cluster,
    stack,
)

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.config.services import LedgerDatabase, libpq_settings
from kafka_ledger.config.settings import kafka_for
from kafka_ledger.ops import readback as audit
from tools.stack import service_pids

# They start the stack's cluster and move its Spark Connect server onto it: on a stack of their own.
pytestmark = [pytest.mark.integration, pytest.mark.own_stack]

MASTER_UI = f"http://127.0.0.1:{os.environ.get('KL_SPARK_MASTER_UI_PORT', '18081')}/json/"
WORKER_UI = f"http://127.0.0.1:{os.environ.get('KL_SPARK_WORKER_UI_PORT', '18082')}/json/"


def ui(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def app_names(state: str) -> list[str]:
    """Names of the cluster's applications in `state` (activeapps or completedapps), from the master's UI."""
    return [app["name"] for app in ui(MASTER_UI)[state]]


@pytest.fixture(scope="module")
def cluster():
    """The stack's cluster, started for these tests and stopped after them (it holds memory and both cores)."""
    if os.environ.get("KL_LOCAL_SPARK_CONNECT", "1") != "1":
        pytest.skip("the local stack's Spark is not in use")
    stack("cluster")
    yield CLUSTER_MASTER
    stack("stop-cluster")


@pytest.fixture
def submit_on_cluster(monkeypatch, cluster):
    """spark-submit (the `spark_default` connection) pointed at the cluster, as an operator would set it."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": cluster}))
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_MASTER", cluster)


def assert_exact(dsn: str, servers: str, pipeline, landed: list[tuple[str, int, int]]) -> None:
    """Kafka's records == output ∪ dead letters as sets of (topic, partition, offset), nothing twice."""
    stored = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline)
    assert max(Counter(stored.output + stored.dead_letters).values()) == 1, "a record is stored twice"
    assert set(stored.output) | set(stored.dead_letters) == audit.kafka_record_ids(kafka_for(servers), pipeline.topics)
    assert set(stored.output) | set(stored.dead_letters) == set(landed)
    assert set(stored.dead_letters) == {landed[-1]}


class CommandLines:
    """Every spark-submit command line (and its JVM's) seen while it runs, polled from /proc."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "spark-submit" in argv or "org.apache.spark.deploy.SparkSubmit" in argv:
                    self.seen.add(argv)
            time.sleep(0.2)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_the_cluster_listens_on_loopback_only(cluster):
    pids = service_pids()
    for daemon in ("spark-master", "spark-worker"):
        sockets = listening_sockets([pids[daemon]])
        assert sockets and not_loopback(sockets) == set(), (daemon, sorted(sockets))


def test_the_cluster_refuses_an_application_without_the_stack_s_secret(cluster, tmp_path):
    """Anyone who can submit to a master runs code on its workers: the stack's master wants the RPC secret."""
    job = tmp_path / "job.py"
    # The marker is built at run time: a traceback quoting the source line must not look like success.
    job.write_text("from pyspark.sql import SparkSession\n"
                   "print('-'.join(['counted', str(SparkSession.builder.getOrCreate().range(10).count())]))\n")
    command = ["spark-submit", "--master", cluster, str(job)]
    # A Spark Connect client earlier in this process marked its environment for Spark Connect: not this job's.
    plain = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    env = {**plain, "SPARK_CONF_DIR": str(tmp_path)}  # no spark-defaults.conf: no secret
    # The driver keeps retrying the master after the refusal: read its output until the reason shows.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as job_run:
        timer = threading.Timer(120, job_run.kill)
        timer.start()
        output = []
        for line in job_run.stdout:
            output.append(line)
            if "Expected SaslMessage" in line or "counted-" in line:
                break
        job_run.kill()
        timer.cancel()
    assert "counted-" not in "".join(output)
    assert "Expected SaslMessage" in "".join(output), "".join(output)[-3000:]
    # The same job with the stack's settings runs.
    done = subprocess.run(command, capture_output=True, text=True, env=plain, timeout=180)
    assert "counted-10" in done.stdout, done.stderr[-3000:]


def test_spark_submit_on_the_cluster_keeps_the_database_url_off_the_command_line(
    dsn, servers, pipeline_factory, producer, submit_on_cluster, capfd
):
    pipeline = pipeline_factory("cluster_submit", partitions=3)
    landed = producer.send(pipeline.topics[0], [good_value(i) for i in range(600)] + [BAD_VALUES[0][0]])

    with CommandLines() as argv:
        outcome = run_pipeline_dag(pipeline)

    assert outcome.state == "success", outcome
    assert_exact(dsn, servers, pipeline, landed)
    assert any(name.startswith(f"kafka-ledger {pipeline.name} batch ") for name in app_names("completedapps")), \
        "the job did not run on the cluster"
    # The database URL and its password reach spark-submit in its environment: never argv, never the log.
    password = libpq_settings(dsn)["password"]
    ours = [line for line in argv.seen if f"kafka-ledger-{pipeline.name}" in line]
    assert ours, f"no spark-submit of this pipeline was seen running: {argv.seen}"
    assert any(f"--master {CLUSTER_MASTER}" in line for line in ours), ours
    for line in ours:
        assert password not in line and "postgresql://" not in line, line
    task_log = "".join(capfd.readouterr())  # dag.test() writes the task logs to this process's output
    assert f"Spark-Submit cmd: spark-submit --master {CLUSTER_MASTER}" in task_log
    assert password not in task_log and "postgresql://" not in task_log


def test_a_driver_in_cluster_deploy_mode_runs_on_the_worker_and_publishes_exactly_once(
    dsn, servers, pipeline_factory, producer, cluster, monkeypatch, capfd
):
    """The `submit` runtime with `deploy-mode: cluster`: the batch's driver runs on the cluster's worker (Spark's
    PythonRunner, kafka-ledger's package shipped as a zip), its settings in the environment the submission hands it,
    its outcome read from the ledger."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": cluster, "extra": {"deploy-mode": "cluster"}}))
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_MASTER", cluster)
    pipeline = pipeline_factory("cluster_driver", partitions=3)
    landed = producer.send(pipeline.topics[0], [good_value(i) for i in range(600)] + [BAD_VALUES[0][0]])
    drivers_before = {d["id"] for d in ui(MASTER_UI)["completeddrivers"]}

    with CommandLines() as argv:
        outcome = run_pipeline_dag(pipeline)

    assert outcome.state == "success", outcome
    assert_exact(dsn, servers, pipeline, landed)
    drivers = [d for d in ui(MASTER_UI)["completeddrivers"] if d["id"] not in drivers_before]
    assert drivers and all(d["state"] == "FINISHED" for d in drivers), drivers
    password = libpq_settings(dsn)["password"]
    ours = [line for line in argv.seen if f"kafka-ledger-{pipeline.name}" in line or "PythonRunner" in line]
    assert any("--deploy-mode cluster" in line and "PythonRunner" in line for line in ours), ours
    for line in ours:
        assert password not in line and "postgresql://" not in line, line
    task_log = "".join(capfd.readouterr())
    assert password not in task_log and "postgresql://" not in task_log


def test_a_worker_lost_mid_batch_is_recovered_exactly_once(dsn, servers, pipeline_factory, producer, submit_on_cluster):
    pipeline = pipeline_factory("cluster_worker_loss", partitions=3)
    landed = producer.send(pipeline.topics[0], [good_value(i) for i in range(3000)] + [BAD_VALUES[0][0]])
    killed = threading.Event()

    def kill_the_worker_once_its_executor_runs() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if ui(WORKER_UI)["executors"]:
                    stack("kill-spark-worker")
                    killed.set()
                    stack("cluster")  # a replacement worker: the job's lost tasks run again there
                    return
            except OSError:
                pass
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_worker_once_its_executor_runs, daemon=True)
    killer.start()
    outcome = run_pipeline_dag(pipeline)
    killer.join(timeout=240)

    assert killed.is_set(), "the worker was never seen running an executor"
    assert outcome.state == "success", outcome
    assert_exact(dsn, servers, pipeline, landed)


def test_the_connect_server_runs_its_executors_on_the_cluster(dsn, servers, pipeline_factory, producer, cluster):
    pipeline = pipeline_factory("cluster_connect", partitions=3)
    landed = producer.send(pipeline.topics[0], [good_value(i) for i in range(600)] + [BAD_VALUES[0][0]])
    with spark_connect_on_cluster():  # the stack's server moves onto the cluster, and back after
        assert "kafka-ledger-spark-connect" in app_names("activeapps")
        outcome = run_pipeline_dag(pipeline)
        assert outcome.state == "success", outcome
        assert_exact(dsn, servers, pipeline, landed)
        assert ui(WORKER_UI)["executors"], "the server's executors are not on the cluster's worker"
