"""Airflow's Edge executor with two workers (scripts/airflow.sh, KL_AIRFLOW_EDGE_WORKERS): a pipeline's runs on
both, and a worker lost in the middle of a batch, whose retry the other worker takes: the same batch by two workers,
published exactly once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from integration_support import BAD_VALUES, assert_exactly_once, good_value, query

from kafka_ledger.config.pipeline import PipelineConfig
from tools.airflow_server import AirflowClient, airflow_test_settings, running_airflow

pytestmark = [pytest.mark.integration, pytest.mark.own_stack]

SPARK_TASK = "read_and_commit"
WORKERS = ("kafka-ledger-edge-1", "kafka-ledger-edge-2")


@pytest.fixture(scope="module")
def airflow(test_pipelines_file: Path, servers: str, dsn: str) -> Iterator[AirflowClient]:
    """A dedicated Airflow whose scheduler hands every task to one of two edge workers."""
    with running_airflow(edge_workers=len(WORKERS)) as client:
        print(f"test Airflow log: {client.log_path}")
        yield client


def worker_processes(name: str) -> list[psutil.Process]:
    """The edge worker of that name (by its pid file: scripts/airflow.sh gives worker N the home edge-worker-N) and
    everything it started (its task supervisors and their tasks)."""
    pid_file = airflow_test_settings().home / f"edge-worker-{WORKERS.index(name) + 1}" / "worker.pid"
    worker = psutil.Process(int(pid_file.read_text().strip()))
    return [worker, *worker.children(recursive=True)]


def reading_batch(dsn: str, pipeline: PipelineConfig, timeout: float = 300.0) -> int:
    """A batch of the pipeline an attempt is reading (planned, attempt begun), once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = query(dsn, "SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %s AND status = 'planned' "
                          "AND attempts >= 1", pipeline.name)
        if rows:
            return rows[0][0]
        time.sleep(0.1)
    raise AssertionError(f"no batch of {pipeline.name} was read within {timeout} s")


def test_a_worker_lost_mid_batch_leaves_it_to_the_other_worker_exactly_once(
        airflow: AirflowClient, dsn: str, servers: str, pipeline_factory, producer):
    pipeline = pipeline_factory("edge", partitions=4)
    topic = pipeline.topics[0]
    for partition in range(4):
        producer.send(topic, [good_value(partition * 10_000 + i) for i in range(6_000)], partition=partition)
    value, reason = BAD_VALUES[0]
    (bad,) = producer.send(topic, [value], partition=1)
    airflow.wait_for_dag(pipeline.dag_id)
    airflow.set_paused(pipeline.dag_id, False)
    airflow.trigger(pipeline.dag_id, {"mode": "catch_up"})

    # A batch being read: its task's worker is lost (the worker and every process it started, at once).
    batch_id = reading_batch(dsn, pipeline)
    (run_id,) = [r[0] for r in query(dsn, "SELECT run_id FROM kafka_ledger.batches WHERE batch_id = %s", batch_id)]
    (task,) = [ti for ti in airflow.task_instances(pipeline.dag_id, run_id) if ti["task_id"] == SPARK_TASK]
    lost = task["hostname"]
    assert lost in WORKERS, task
    for process in worker_processes(lost):
        os.kill(process.pid, signal.SIGKILL)

    runs = airflow.wait_until_idle(pipeline.dag_id, timeout=900)
    failed = [r for r in runs if r["state"] != "success"]
    assert not failed, "runs did not succeed:\n" + airflow.describe_runs(pipeline.dag_id, failed)
    # The lost worker's try failed once its heartbeats stopped; the other worker's retry resumed the batch.
    tries = airflow.request(
        "GET", f"/api/v2/dags/{pipeline.dag_id}/dagRuns/{run_id}/taskInstances/{SPARK_TASK}/tries",
    ).json()["task_instances"]
    hosts = [t["hostname"] for t in sorted(tries, key=lambda t: t["try_number"])]
    assert hosts[0] == lost and hosts[-1] in WORKERS and hosts[-1] != lost, tries
    (status, attempts) = query(dsn, "SELECT status, attempts FROM kafka_ledger.batches WHERE batch_id = %s",
                               batch_id)[0]
    assert status == "committed" and attempts >= 2, (status, attempts)
    # Both workers ran the pipeline's tasks (a task skipped ran nowhere).
    ran_on = {ti["hostname"] for r in runs for ti in airflow.task_instances(pipeline.dag_id, r["dag_run_id"])
              if ti["state"] != "skipped"}
    assert ran_on == set(WORKERS), ran_on

    assert_exactly_once(dsn, servers, pipeline, {bad: reason})
    airflow.set_paused(pipeline.dag_id, True)
