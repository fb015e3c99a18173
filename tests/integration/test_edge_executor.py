"""Airflow's Edge executor with two workers (scripts/airflow.sh, KL_AIRFLOW_EDGE_WORKERS): a pipeline's runs on
both; a worker lost in the middle of a batch, whose retry the other worker takes; and a worker frozen in the middle
of a batch whose task, thawed, races the other worker's retry of the same batch (a zombie): published exactly once."""

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


def catching_up(airflow: AirflowClient, dsn: str, pipeline: PipelineConfig, producer) -> tuple[dict, int, str, str]:
    """Records for several batches (and a bad one), a catch-up run triggered; returns the bad record's expected dead
    letter, the batch being read first, its run and the worker whose task reads it."""
    topic = pipeline.topics[0]
    for partition in range(4):
        producer.send(topic, [good_value(partition * 10_000 + i) for i in range(6_000)], partition=partition)
    value, reason = BAD_VALUES[0]
    (bad,) = producer.send(topic, [value], partition=1)
    airflow.wait_for_dag(pipeline.dag_id)
    airflow.set_paused(pipeline.dag_id, False)
    airflow.trigger(pipeline.dag_id, {"mode": "catch_up"})
    batch_id = reading_batch(dsn, pipeline)
    (run_id,) = [r[0] for r in query(dsn, "SELECT run_id FROM kafka_ledger.batches WHERE batch_id = %s", batch_id)]
    (task,) = [ti for ti in airflow.task_instances(pipeline.dag_id, run_id) if ti["task_id"] == SPARK_TASK]
    assert task["hostname"] in WORKERS, task
    return {bad: reason}, batch_id, run_id, task["hostname"]


def assert_retried_elsewhere(airflow: AirflowClient, dsn: str, pipeline: PipelineConfig, batch_id: int, run_id: str,
                             first: str) -> list[dict]:
    """Every run succeeded; the batch's first try ran on `first`, its last on the other worker, which committed it
    in a later attempt; both workers ran the pipeline's tasks. Returns the Spark task's tries."""
    runs = airflow.wait_until_idle(pipeline.dag_id, timeout=900)
    failed = [r for r in runs if r["state"] != "success"]
    assert not failed, "runs did not succeed:\n" + airflow.describe_runs(pipeline.dag_id, failed)
    tries = sorted(airflow.request(
        "GET", f"/api/v2/dags/{pipeline.dag_id}/dagRuns/{run_id}/taskInstances/{SPARK_TASK}/tries",
    ).json()["task_instances"], key=lambda t: t["try_number"])
    hosts = [t["hostname"] for t in tries]
    assert hosts[0] == first and hosts[-1] in WORKERS and hosts[-1] != first, tries
    (status, attempts) = query(dsn, "SELECT status, attempts FROM kafka_ledger.batches WHERE batch_id = %s",
                               batch_id)[0]
    assert status == "committed" and attempts >= 2, (status, attempts)
    # Both workers ran the pipeline's tasks (a task skipped ran nowhere).
    ran_on = {ti["hostname"] for r in runs for ti in airflow.task_instances(pipeline.dag_id, r["dag_run_id"])
              if ti["state"] != "skipped"}
    assert ran_on == set(WORKERS), ran_on
    return tries


def test_a_worker_lost_mid_batch_leaves_it_to_the_other_worker_exactly_once(
        airflow: AirflowClient, dsn: str, servers: str, pipeline_factory, producer):
    pipeline = pipeline_factory("edge", partitions=4)
    dead_letters, batch_id, run_id, lost = catching_up(airflow, dsn, pipeline, producer)

    # The batch's task's worker is lost (the worker and every process it started, at once): its try fails once its
    # heartbeats stop, and the other worker's retry resumes the batch.
    for process in worker_processes(lost):
        os.kill(process.pid, signal.SIGKILL)

    assert_retried_elsewhere(airflow, dsn, pipeline, batch_id, run_id, lost)
    assert_exactly_once(dsn, servers, pipeline, dead_letters)
    airflow.set_paused(pipeline.dag_id, True)


def test_a_frozen_workers_task_racing_the_other_workers_retry_publishes_nothing(
        airflow: AirflowClient, dsn: str, servers: str, pipeline_factory, producer):
    """Two workers take the same batch's task at once: the first's worker frozen (a long GC pause, a VM suspended)
    is failed for its silence, the other worker's retry begins a newer attempt, and then the first's task is thawed
    and carries on with its read and commit beside the retry. The ledger fences it: exactly once."""
    pipeline = pipeline_factory("edge_race", partitions=4)
    dead_letters, batch_id, run_id, frozen = catching_up(airflow, dsn, pipeline, producer)
    (frozen_attempt,) = [r[0] for r in query(dsn, "SELECT attempts FROM kafka_ledger.batches WHERE batch_id = %s",
                                             batch_id)]
    processes = worker_processes(frozen)
    # The edge worker forks a supervisor for each task, which forks the task's process.
    (task,) = [child for supervisor in processes[0].children() for child in supervisor.children()]
    for process in processes:
        os.kill(process.pid, signal.SIGSTOP)
    try:
        # The retry on the other worker has begun a newer attempt: the frozen task's own read is still open.
        deadline = time.monotonic() + 300
        while query(dsn, "SELECT attempts FROM kafka_ledger.batches WHERE batch_id = %s", batch_id)[0][0] \
                == frozen_attempt:
            assert time.monotonic() < deadline, "no retry began a newer attempt within 300 s"
            time.sleep(0.1)
        os.kill(task.pid, signal.SIGCONT)  # only the task: its supervisor, still frozen, cannot stop it
        # It reads on and reaches its commit, fenced, then waits for its frozen supervisor to take its last words.
        idle_since, cpu = time.monotonic(), sum(task.cpu_times()[:2])
        while time.monotonic() - idle_since < 5:
            assert time.monotonic() < deadline, "the thawed task kept working for minutes"
            time.sleep(0.5)
            if (now := sum(task.cpu_times()[:2])) != cpu:
                idle_since, cpu = time.monotonic(), now
    finally:
        for process in processes:
            if process.is_running():
                os.kill(process.pid, signal.SIGCONT)

    tries = assert_retried_elsewhere(airflow, dsn, pipeline, batch_id, run_id, frozen)
    first_try = airflow.task_log(pipeline.dag_id, run_id, SPARK_TASK, tries[0]["try_number"])
    assert any(f"batch {batch_id} attempt {frozen_attempt} is fenced" in line for line in first_try), \
        "\n".join(first_try[-30:])
    assert_exactly_once(dsn, servers, pipeline, dead_letters)
    airflow.set_paused(pipeline.dag_id, True)
