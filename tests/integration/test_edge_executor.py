"""Airflow's Edge executor with two workers (scripts/airflow.sh, KL_AIRFLOW_EDGE_WORKERS): a pipeline's runs on
both; a worker lost in the middle of a batch, whose retry the other worker takes; and a worker frozen in the middle
of a batch whose task, thawed, races the other worker's retry of the same batch (a zombie): published exactly once."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from integration_support import BAD_VALUES, assert_exactly_once, copying, good_value, query, spark_task

from kafka_ledger.config.pipeline import PipelineConfig
from tools.airflow_server import AirflowClient, airflow_test_settings, running_airflow, task_process

pytestmark = [pytest.mark.integration, pytest.mark.own_stack]

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


def reading_batch(dsn: str, pipeline: PipelineConfig, timeout: float = 300.0, besides: tuple[int, ...] = ()) -> int:
    """A batch of the pipeline an attempt is reading (planned, attempt begun), once there is one; not one of
    `besides`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = query(dsn, "SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %s AND status = 'planned' "
                          "AND attempts >= 1 AND NOT batch_id = ANY(%s)", pipeline.name, list(besides))
        if rows:
            return rows[0][0]
        time.sleep(0.05)
    raise AssertionError(f"no batch of {pipeline.name} was read within {timeout} s")


def streaming_into_copy(dsn: str, pipeline: PipelineConfig, batch_id: int) -> bool:
    """Wait until the batch's rows flow into COPY (True), or the batch is no longer planned (False: missed)."""
    while query(dsn, "SELECT status FROM kafka_ledger.batches WHERE batch_id = %s", batch_id)[0][0] == "planned":
        if copying(dsn, pipeline.output_table, running=False):
            return True
        time.sleep(0.005)
    return False


def attempts_of(dsn: str, batch_id: int) -> int:
    return query(dsn, "SELECT attempts FROM kafka_ledger.batches WHERE batch_id = %s", batch_id)[0][0]


def catching_up(airflow: AirflowClient, dsn: str, pipeline: PipelineConfig, producer, records: int = 6_000) -> dict:
    """Records for several batches in each of 4 partitions (and a bad one), a catch-up run triggered; returns the bad
    record's expected dead letter."""
    topic = pipeline.topics[0]
    for partition in range(4):
        producer.send(topic, [good_value(partition * 100_000 + i) for i in range(records)], partition=partition)
    value, reason = BAD_VALUES[0]
    (bad,) = producer.send(topic, [value], partition=1)
    airflow.wait_for_dag(pipeline.dag_id)
    airflow.set_paused(pipeline.dag_id, False)
    airflow.trigger(pipeline.dag_id, {"mode": "catch_up"})
    return {bad: reason}


def spark_task_of(airflow: AirflowClient, dsn: str, pipeline: PipelineConfig,
                  batch_id: int) -> tuple[str, str, int, str]:
    """The run carrying the batch, the worker its Spark task runs on, the task's try and that try's id."""
    (run_id,) = [r[0] for r in query(dsn, "SELECT run_id FROM kafka_ledger.batches WHERE batch_id = %s", batch_id)]
    (task,) = [ti for ti in airflow.task_instances(pipeline.dag_id, run_id) if ti["task_id"] == spark_task(pipeline)]
    assert task["hostname"] in WORKERS, task
    return run_id, task["hostname"], task["try_number"], task["id"]


def spark_task_tries(airflow: AirflowClient, pipeline: PipelineConfig, run_id: str) -> list[dict]:
    return sorted(airflow.request(
        "GET", f"/api/v2/dags/{pipeline.dag_id}/dagRuns/{run_id}/taskInstances/{spark_task(pipeline)}/tries",
    ).json()["task_instances"], key=lambda t: t["try_number"])


def all_runs_succeeded(airflow: AirflowClient, pipeline: PipelineConfig) -> list[dict]:
    """The pipeline's runs once it is idle, every one succeeded; and both workers ran its tasks (a task skipped ran
    nowhere)."""
    runs = airflow.wait_until_idle(pipeline.dag_id, timeout=900)
    failed = [r for r in runs if r["state"] != "success"]
    assert not failed, "runs did not succeed:\n" + airflow.describe_runs(pipeline.dag_id, failed)
    ran_on = {ti["hostname"] for r in runs for ti in airflow.task_instances(pipeline.dag_id, r["dag_run_id"])
              if ti["state"] != "skipped"}
    assert ran_on == set(WORKERS), ran_on
    return runs


def assert_retried_elsewhere(airflow: AirflowClient, dsn: str, pipeline: PipelineConfig, batch_id: int, run_id: str,
                             lost: str, lost_try: int) -> tuple[dict, dict]:
    """The batch's Spark task's try `lost_try` ran on the worker `lost`, the next on the other worker; the batch is
    committed. Returns those two tries."""
    tries = {t["try_number"]: t for t in spark_task_tries(airflow, pipeline, run_id)}
    assert tries[lost_try]["hostname"] == lost, tries
    assert tries[lost_try + 1]["hostname"] in set(WORKERS) - {lost}, tries
    assert query(dsn, "SELECT status FROM kafka_ledger.batches WHERE batch_id = %s", batch_id)[0][0] == "committed"
    return tries[lost_try], tries[lost_try + 1]


def test_a_worker_lost_mid_batch_leaves_it_to_the_other_worker_exactly_once(
        airflow: AirflowClient, dsn: str, servers: str, pipeline_factory, producer):
    pipeline = pipeline_factory("edge", partitions=4)
    dead_letters = catching_up(airflow, dsn, pipeline, producer)
    batch_id = reading_batch(dsn, pipeline)
    run_id, lost, lost_try, _ = spark_task_of(airflow, dsn, pipeline, batch_id)

    # The batch's task's worker is lost (the worker and every process it started, at once): its try fails once its
    # heartbeats stop, and the other worker's retry resumes the batch in a newer attempt.
    for process in worker_processes(lost):
        os.kill(process.pid, signal.SIGKILL)

    all_runs_succeeded(airflow, pipeline)
    assert_retried_elsewhere(airflow, dsn, pipeline, batch_id, run_id, lost, lost_try)
    assert attempts_of(dsn, batch_id) >= 2
    assert_exactly_once(dsn, servers, pipeline, dead_letters)
    airflow.set_paused(pipeline.dag_id, True)


def test_frozen_workers_tasks_racing_the_other_workers_retries_publish_each_batch_once(
        airflow: AirflowClient, dsn: str, servers: str, pipeline_factory, producer):
    """Two workers take the same batch's task at once, twice (the racing runs' short campaign across workers): the
    first's worker is frozen (a long GC pause, a suspended VM) and failed for its silence, the other worker's retry
    takes the batch, and then the frozen task alone is thawed and carries on beside the retry, its supervisor still
    frozen and unable to stop it (a zombie). Frozen as it reads, it never publishes: the retry's newer attempt fences
    it at its commit (or a connection it was opening timed out while frozen). Frozen as its rows stream into COPY,
    it holds the batch locked in its commit's transaction, publishes it once thawed, and the retry finds the batch
    committed. Either way: each batch published once."""
    pipeline = pipeline_factory("edge_race", partitions=4)
    dead_letters = catching_up(airflow, dsn, pipeline, producer, records=20_000)
    races = []
    for moment in ("reading", "streaming"):
        # Another batch than the last race's, whose retry may still be reading it.
        races.append((moment, *race_a_frozen_task(airflow, dsn, pipeline, moment, besides=tuple(r[1] for r in races))))

    all_runs_succeeded(airflow, pipeline)
    for moment, batch_id, run_id, frozen, frozen_try_number, frozen_attempt in races:
        tries = assert_retried_elsewhere(airflow, dsn, pipeline, batch_id, run_id, frozen, frozen_try_number)
        (published_by,) = [r[0] for r in query(dsn, "SELECT staged_attempt FROM kafka_ledger.batches "
                                                    "WHERE batch_id = %s", batch_id)]
        frozen_try, retry = (airflow.task_log(pipeline.dag_id, run_id, spark_task(pipeline), t["try_number"])
                             for t in tries)
        print(f"{moment}: batch {batch_id}, frozen attempt {frozen_attempt}, published by attempt {published_by}")
        if moment == "reading":
            # The retry's newer attempt began first: the thawed one never publishes. It is fenced at its commit,
            # or fails before it (a connection it was opening timed out while it was frozen).
            assert published_by > frozen_attempt, (published_by, "\n".join(frozen_try[-20:]))
        elif published_by == frozen_attempt:
            # It held the batch locked in its commit's transaction: the retry waited, then found the batch committed.
            assert any(f"batch {batch_id} " in line and "nothing to read" in line for line in retry), \
                "\n".join(retry[-20:])
    assert_exactly_once(dsn, servers, pipeline, dead_letters)
    airflow.set_paused(pipeline.dag_id, True)


def race_a_frozen_task(airflow: AirflowClient, dsn: str, pipeline: PipelineConfig, moment: str,
                       besides: tuple[int, ...]) -> tuple[int, str, str, int, int]:
    """Freeze the worker of a batch's Spark task, with everything it started, as the task reads the batch or as its
    rows stream into COPY; once the other worker's retry runs (and has begun its attempt, unless the frozen commit's
    lock holds it back), thaw the task alone and let it work until it waits on its frozen supervisor; then thaw
    the rest. The batch is not one of `besides`. Returns the batch, its run, the frozen worker, the frozen try of
    its Spark task and the frozen attempt."""
    deadline = time.monotonic() + 600
    while True:
        batch_id = reading_batch(dsn, pipeline, besides=besides)
        run_id, frozen, frozen_try, frozen_ti = spark_task_of(airflow, dsn, pipeline, batch_id)
        if moment == "reading" or streaming_into_copy(dsn, pipeline, batch_id):
            break
        assert time.monotonic() < deadline, f"no batch of {pipeline.name} was seen streaming into COPY"
    # Listed at the moment: a process the worker started a while ago (another task's supervisor) may have ended.
    processes = worker_processes(frozen)
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGSTOP)
    frozen_attempt = attempts_of(dsn, batch_id)
    # The edge worker forks a supervisor for each task, which forks the task's process. The worker may run another
    # task meanwhile (another run's): the Spark task's process is the one titled with its try's id.
    pid = task_process(frozen_ti)
    assert pid in {p.pid for p in processes}, f"the Spark task's try {frozen_ti} runs in no process of {frozen}"
    task = psutil.Process(pid)
    try:
        # Failed for its silence: the retry runs on the other worker.
        while not any(t["try_number"] > frozen_try and t["state"] == "running"
                      for t in spark_task_tries(airflow, pipeline, run_id)):
            assert time.monotonic() < deadline, f"no retry of {run_id}'s Spark task ran"
            time.sleep(0.5)
        begun = time.monotonic() + (120 if moment == "reading" else 10)
        while attempts_of(dsn, batch_id) == frozen_attempt and time.monotonic() < begun:
            time.sleep(0.1)
        if moment == "reading":
            assert attempts_of(dsn, batch_id) > frozen_attempt, "the retry began no attempt"
        os.kill(task.pid, signal.SIGCONT)  # only the task: its supervisor, still frozen, cannot stop it
        # It carries on to its commit, then waits on its frozen supervisor to take its last words.
        idle_since, cpu = time.monotonic(), sum(task.cpu_times()[:2])
        while time.monotonic() - idle_since < 5:
            assert time.monotonic() < deadline, "the thawed task kept working for minutes"
            time.sleep(0.5)
            if (now := sum(task.cpu_times()[:2])) != cpu:
                idle_since, cpu = time.monotonic(), now
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
    return batch_id, run_id, frozen, frozen_try, frozen_attempt
