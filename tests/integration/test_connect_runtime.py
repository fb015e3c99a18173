"""The Spark Connect runtime under faults: its task killed, the server killed, racing attempts, no server.

The connect runtime's Spark task runs here in a process of its own, as Airflow runs it (the fault campaign's
`task read_and_commit`, tools/fault_campaign), so that it can be SIGKILLed like a real task.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg2
import pytest
from integration_support import assert_exactly_once, batches, copying, finish, good_value, query, start_task, stored

from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.settings import kafka_for, services_for
from kafka_ledger.ledger import db as ledger
from kafka_ledger.runtimes.connect.batch import (
    ConnectBatch,
    SparkServerError,
    client_session,
    close_session,
    default_session_id,
)
from tools.fault_campaign import launcher
from tools.fault_campaign.runner import task_result

pytestmark = pytest.mark.integration

STACK = Path(__file__).resolve().parents[2] / "scripts" / "stack.sh"


def attempts(dsn: str, batch_id: int) -> int:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        return ledger.get_batch(cur, batch_id).attempts


def wait_for_attempt(dsn: str, batch_id: int, attempt: int, task: launcher.ForkedTask, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while attempts(dsn, batch_id) < attempt:
        assert task.poll() is None, f"the task ended before its attempt began: {task.communicate()}"
        assert time.monotonic() < deadline, "the attempt never began"
        time.sleep(0.05)


def wait_for_rows_streaming(dsn: str, pipeline, task: launcher.ForkedTask | threading.Thread,
                            timeout: float = 120) -> None:
    """Until the task's transaction is copying rows into the output table: the query runs on the server."""
    alive = task.is_alive if isinstance(task, threading.Thread) else (lambda: task.poll() is None)
    deadline = time.monotonic() + timeout
    while True:
        if copying(dsn, pipeline.output_table):
            return
        assert alive(), "the task ended before it streamed rows"
        assert time.monotonic() < deadline, "the task never streamed rows"
        time.sleep(0.02)


def nothing_published(dsn: str, pipeline) -> None:
    output, dead = stored(dsn, pipeline)
    assert output == Counter() and dead == {}
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        assert set(ledger.positions(cur, pipeline.name).values()) == {0}


def produce_and_plan(dsn: str, servers: str, pipeline, producer, records: int, bad: bool = True) -> tuple[int, dict]:
    sent = producer.send(pipeline.topics[0], [good_value(i) for i in range(records)] + ([b"not json"] if bad else []))
    planned = plan_next_batch(services_for(dsn, servers), pipeline)
    expected_dead = {sent[-1]: "malformed JSON (not a JSON object)"} if bad else {}
    return planned.batch_id, expected_dead


def test_task_killed_while_its_query_runs_publishes_nothing_and_the_retry_publishes_once(
    dsn, servers, pipeline_factory, producer
):
    pipeline = pipeline_factory("connect_kill", partitions=3)
    batch_id, expected_dead = produce_and_plan(dsn, servers, pipeline, producer, 60_000)

    task = start_task(pipeline, batch_id)
    wait_for_rows_streaming(dsn, pipeline, task)  # the query runs on the server, rows stream into COPY
    task.send_signal(signal.SIGKILL)
    task.wait()
    nothing_published(dsn, pipeline)
    assert [(b.status, b.attempts) for b in batches(dsn, pipeline)] == [("planned", 1)]

    code, out, err = finish(start_task(pipeline, batch_id))  # the task's retry
    assert code == 0, err
    # Its result, and its log has no warning of releases cut short.
    assert task_result(out)["batch_id"] == batch_id
    assert "ReleaseExecute" not in out + err
    (batch,) = batches(dsn, pipeline)
    assert (batch.status, batch.attempts, batch.staged_attempt) == ("committed", 2, 2)
    assert_exactly_once(dsn, servers, pipeline, expected_dead)


@pytest.mark.parametrize("point", ["after_staging", "commit_after_publish", "commit_before_end"])
def test_task_killed_inside_its_transaction_publishes_nothing(dsn, servers, pipeline_factory, producer, tmp_path,
                                                             point):
    pipeline = pipeline_factory(f"connect_tx_{point}", partitions=2)
    batch_id, expected_dead = produce_and_plan(dsn, servers, pipeline, producer, 500)

    code, _, _ = finish(start_task(pipeline, batch_id, f"{point}=kill", tmp_path))
    assert code == -signal.SIGKILL and (tmp_path / point).exists()
    nothing_published(dsn, pipeline)

    code, _, err = finish(start_task(pipeline, batch_id))
    assert code == 0, err
    assert_exactly_once(dsn, servers, pipeline, expected_dead)


@pytest.mark.own_stack  # it kills the server every test shares
@pytest.mark.parametrize("when", ["connecting", "streaming rows"])
def test_server_killed_mid_batch_fails_the_task_clearly_and_the_retry_recovers(
    dsn, servers, pipeline_factory, producer, when
):
    pipeline = pipeline_factory(f"connect_server_{when.split()[0]}", partitions=3)
    batch_id, expected_dead = produce_and_plan(dsn, servers, pipeline, producer, 60_000)
    # The server's process group, found beforehand: killed the moment rows stream (by scripts/stack.sh, its start-up
    # gave a fast batch time to finish first).
    server = int(subprocess.run(["bash", str(STACK), "ctl", "pid", "spark-connect"], check=True,
                                capture_output=True, text=True).stdout.strip())
    task = start_task(pipeline, batch_id)
    if when == "connecting":
        wait_for_attempt(dsn, batch_id, 1, task)
    else:
        wait_for_rows_streaming(dsn, pipeline, task)
    try:
        try:
            os.killpg(server, signal.SIGKILL)  # as scripts/stack.sh kill-spark-connect does
        except ProcessLookupError:
            os.kill(server, signal.SIGKILL)
        code, _, err = finish(task)
        assert code != 0
        assert "Spark Connect server" in err and re.search("nothing was (read or )?published", err), err[-2000:]
        nothing_published(dsn, pipeline)
    finally:
        subprocess.run(["bash", str(STACK), "start"], check=True, capture_output=True)

    code, _, err = finish(start_task(pipeline, batch_id))  # the retry, on the restarted server
    assert code == 0, err
    assert_exactly_once(dsn, servers, pipeline, expected_dead)


def test_racing_attempts_on_the_same_batch_publish_it_once(dsn, servers, pipeline_factory, producer):
    pipeline = pipeline_factory("connect_race", partitions=3)
    batch_id, expected_dead = produce_and_plan(dsn, servers, pipeline, producer, 20_000)

    first = start_task(pipeline, batch_id)
    wait_for_attempt(dsn, batch_id, 1, first)
    second = start_task(pipeline, batch_id)  # a zombie and its replacement: both alive at once
    results = [finish(first), finish(second)]

    # The replacement always ends well: it publishes, or finds the batch the zombie committed before it began. A
    # zombie that gets to the server after its replacement started must not stop the replacement's query (it
    # used to interrupt every query of the batch's session, and then neither attempt published).
    assert results[1][0] == 0, results[1][2][-3000:]
    (batch,) = batches(dsn, pipeline)
    assert batch.status == "committed" and batch.staged_attempt == batch.attempts
    assert_exactly_once(dsn, servers, pipeline, expected_dead)
    for code, out, err in results:
        if code != 0:  # the loser was interrupted or fenced off, and said why
            assert "interrupted" in err.lower() or "may not publish" in err or "superseded" in err, err[-2000:]
        else:
            assert task_result(out)["batch_id"] == batch_id


def test_no_server_fails_with_a_clear_message_and_writes_nothing(dsn, servers, pipeline_factory, producer):
    pipeline = pipeline_factory("connect_unreachable", partitions=1)
    batch_id, _ = produce_and_plan(dsn, servers, pipeline, producer, 20, bad=False)
    # In a task process of its own: Airflow caches connections for the life of a process.
    task = start_task(pipeline, batch_id, AIRFLOW_CONN_SPARK_CONNECT_DEFAULT=(
        '{"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": 9}'))
    code, _, err = finish(task)
    assert code != 0
    assert f"{SparkServerError.__name__}: the Spark Connect server at sc://127.0.0.1:9/" in err, err[-2000:]
    assert "not reachable" in err and "nothing was read or published" in err
    nothing_published(dsn, pipeline)


def test_interrupting_the_attempt_stops_its_query_and_publishes_nothing(
        dsn, servers, pipeline_factory, producer, services):
    # What Airflow's on_kill does for the read_and_commit task (a timeout, a run marked failed).
    pipeline = pipeline_factory("connect_interrupt", partitions=3)
    batch_id, expected_dead = produce_and_plan(dsn, servers, pipeline, producer, 200_000)
    batch = ConnectBatch(pipeline, batch_id)
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            batch.run(services)
        except BaseException as exc:  # noqa: BLE001 - the interruption is what this test wants to see
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_for_rows_streaming(dsn, pipeline, thread)
    batch.interrupt()
    thread.join(120)
    assert "error" in outcome, "the attempt finished although it was interrupted"
    assert "OPERATION_CANCELED" in str(outcome["error"]) or "interrupted" in str(outcome["error"]), outcome
    nothing_published(dsn, pipeline)

    code, _, err = finish(start_task(pipeline, batch_id))  # the retry
    assert code == 0, err
    assert_exactly_once(dsn, servers, pipeline, expected_dead)


def test_the_attempt_says_where_its_time_went(dsn, servers, pipeline_factory, producer, caplog, services):
    pipeline = pipeline_factory("connect_stages", partitions=2)
    batch_id, expected_dead = produce_and_plan(dsn, servers, pipeline, producer, 5_000)
    with caplog.at_level(logging.INFO, logger="kafka_ledger.events"):
        result = ConnectBatch(pipeline, batch_id).run(services)
    assert_exactly_once(dsn, servers, pipeline, expected_dead)
    stages = result.stages
    assert list(stages) == ["begin", "session", "to_first_rows", "waiting_for_spark", "copying", "stream", "commit"]
    assert all(seconds >= 0 for seconds in stages.values()), stages
    assert stages["waiting_for_spark"] + stages["copying"] == pytest.approx(stages["stream"], abs=0.005)
    assert result.as_dict()["stages"] == stages  # what the task returns (its XCom)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"batch {batch_id} attempt 1 took")]
    assert "first rows after" in line and "waiting for Spark" in line and "commit" in line, line


@pytest.mark.own_stack  # "nothing written" counts every batch and dead letter of the stack
def test_the_warm_up_runs_a_made_up_batch_then_reads_the_pipelines_newest_records_and_writes_nothing(
        dsn, servers, pipeline_factory, producer):
    from integration_support import cli, committed_group_offsets, consumer_groups, pipeline_name, query

    def counts() -> list[tuple]:
        return query(dsn, "SELECT (SELECT count(*) FROM kafka_ledger.batches), "
                          "(SELECT count(*) FROM kafka_ledger.dead_letters)")

    pipeline = pipeline_factory("connect_warm_up", partitions=2)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(30)], partition=0)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(30, 40)] + [b"not json"], partition=1)
    absent = pipeline_name("connect_warm_up_no_topic")  # declared, its topic never made
    pinned = pipeline_name("kill")  # of the submit runtime: not the server's to warm
    before = counts()
    code, data, stderr = cli("warm-up", "--records", "20000", pipeline.name, absent, pinned)
    assert code == 0, stderr
    assert data["records"] == 20000 and data["seconds"] > 0 and "token" not in data["spark_connect"]
    assert data["pipelines"] == {pipeline.name: 41}  # every record, the bad one too (as a dead letter, not kept)
    assert list(data["skipped"]) == [absent] and "not found" in data["skipped"][absent]
    assert "ReleaseExecute" not in stderr  # the finished queries are released before their session goes
    assert counts() == before  # it writes nothing: no batch, no dead letter
    groups = consumer_groups(servers)
    assert [g for g in groups if pipeline.name in g] == []  # nor any group or offset in Kafka
    assert committed_group_offsets(servers, pipeline.topics[0]) == {}

    code, data, stderr = cli("warm-up", "--records", "20000", "--no-pipelines")
    assert code == 0 and data["pipelines"] == {} and data["skipped"] == {}, stderr

    unreachable = json.dumps({"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": 1})
    code, _, stderr = cli("warm-up", env={"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": unreachable})
    assert code == 4 and "could not warm up the Spark Connect server at sc://127.0.0.1:1/" in stderr, stderr


def test_a_pipelines_batches_work_in_its_session_and_one_the_server_closed_is_replaced(
        dsn, servers, pipeline_factory, producer, caplog, services):
    pipeline = pipeline_factory("connect_session", partitions=2)
    expected_dead: dict = {}

    def next_batch(first: int) -> None:
        batch_id, dead = produce_and_plan(dsn, servers, pipeline, producer, 200, bad=first == 0)
        expected_dead.update(dead)
        ConnectBatch(pipeline, batch_id).run(services)

    def replacement() -> list[tuple]:
        return query(dsn, "SELECT session_id::text FROM kafka_ledger.spark_sessions WHERE pipeline = %s",
                     pipeline.name)

    next_batch(0)
    assert replacement() == []  # its default session, named after the pipeline
    # The server closes a session idle past its timeout, and refuses its id from then on.
    spark = client_session(default_session_id(pipeline.name))
    close_session(spark, release_session=True)
    with caplog.at_level(logging.WARNING, logger="kafka_ledger.runtimes.connect.batch"):
        next_batch(1)
    [(session_id,)] = replacement()
    assert session_id != default_session_id(pipeline.name)
    assert any("had closed session" in r.getMessage() and session_id in r.getMessage() for r in caplog.records)
    next_batch(2)
    assert replacement() == [(session_id,)]  # kept, batch after batch
    assert_exactly_once(dsn, servers, pipeline, expected_dead)
    assert [b.status for b in batches(dsn, pipeline)] == ["committed"] * 3


@pytest.mark.own_stack  # it counts the records held in the whole server's heap
def test_records_a_short_read_leaves_on_the_server_are_let_go_within_seconds(servers, pipeline_factory, producer):
    # A read that ends before its poll's last record (a replay, a capped batch) leaves the rest in Spark's pool of
    # fetched data, kept 5 minutes by default: small replays in a row filled the server's heap until it died.
    from kafka_ledger.batch import read
    from kafka_ledger.model.ranges import OffsetRange
    from tools.stack import service_pids

    def held() -> int:
        histogram = subprocess.run(["jcmd", str(service_pids()["spark-connect"]), "GC.class_histogram"],
                                   capture_output=True, text=True, check=True).stdout
        return sum(int(line.split()[1]) for line in histogram.splitlines()
                   if line.split()[-1:] == ["org.apache.kafka.clients.consumer.ConsumerRecord"])

    pipeline = pipeline_factory("connect_leftovers", partitions=2)
    for partition in (0, 1):
        producer.send(pipeline.topics[0], [good_value(i) for i in range(5_000)], partition=partition)
    spark = client_session(default_session_id(pipeline.name))
    try:
        ranges = [OffsetRange(pipeline.topics[0], partition, 0, 1) for partition in (0, 1)]
        assert read.read_ranges(spark, ranges, kafka_for(servers), pipeline.name).count() == 2
    finally:
        close_session(spark, release_session=False)
    assert held() >= 2 * 1_000  # the rest of each partition's poll, waiting for a read that starts at offset 1
    deadline = time.monotonic() + 30
    while held() >= 1_000:
        assert time.monotonic() < deadline, "the server still holds the records a short read left behind"
        time.sleep(2)
