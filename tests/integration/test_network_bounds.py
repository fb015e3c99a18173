"""Every wait on a service is bounded: a blackholed Spark Connect server, ledger database or Kafka broker fails
the task within its bound instead of holding it for ever, publishes nothing, and the retry publishes once.

The task (the connect runtime's read_and_commit, in a process of its own as Airflow runs it) reaches every
service through Toxiproxy (scripts/stack.sh proxies); the blackhole is Toxiproxy's `timeout` toxic with no
timeout on both directions: the proxy keeps the task's connections open and passes nothing, which no TCP
keepalive on the task's side can notice. The retry runs direct, after the blackhole is lifted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from integration_support import HARNESS, assert_exactly_once, batches, finish, good_value, stack, start_task, stored
from test_connect_runtime import nothing_published, produce_and_plan, wait_for_rows_streaming

from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.batch.read import KAFKA_LOOKUP_TIMEOUT_MS, KAFKA_POLL_TIMEOUT_MS
from kafka_ledger.ledger import replies as db_replies
from kafka_ledger.spark.connect import HEARTBEAT_DEADLINE, HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
from tools.fault_campaign.network import POSTGRES, SPARK_CONNECT, Toxiproxy, kafka_proxy, proxied_environment

pytestmark = pytest.mark.integration

# The ledger's statement bound in the task of the database's blackhole (KAFKA_LEDGER_DB_STATEMENT_TIMEOUT).
DB_STATEMENT_SECONDS = 5

BOUNDS = {
    SPARK_CONNECT: HEARTBEAT_MISSES * (HEARTBEAT_INTERVAL + HEARTBEAT_DEADLINE) + HEARTBEAT_INTERVAL,
    POSTGRES: DB_STATEMENT_SECONDS + db_replies.REPLY_GRACE,
    # A poll that gets nothing, then the offset look-up that follows it.
    "kafka": (KAFKA_POLL_TIMEOUT_MS + KAFKA_LOOKUP_TIMEOUT_MS) / 1000,
}
# What each blackhole's error says.
REASONS = {SPARK_CONNECT: "stopped answering", POSTGRES: "did not answer within", "kafka": "Timeout"}


@pytest.fixture
def proxies():
    stack("proxies")
    network = Toxiproxy()
    network.reset()
    yield network
    network.reset()


@pytest.mark.parametrize("service", [SPARK_CONNECT, POSTGRES, "kafka"])
def test_a_blackholed_service_fails_the_task_within_its_bound_and_the_retry_publishes_once(
    dsn, servers, pipeline_factory, producer, proxies, service
):
    pipeline = pipeline_factory(f"blackholed_{service.replace('-', '_')}", partitions=3)
    batch_id, expected_dead = produce_and_plan(dsn, servers, pipeline, producer, 60_000)
    proxy = kafka_proxy(servers) if service == "kafka" else service
    task_env = proxied_environment(dict(os.environ))
    task_env["KAFKA_LEDGER_DB_STATEMENT_TIMEOUT"] = str(DB_STATEMENT_SECONDS)
    task = start_task(pipeline, batch_id, **task_env)
    wait_for_rows_streaming(dsn, pipeline, task)

    for stream in ("downstream", "upstream"):
        proxies.add(proxy, f"blackhole-{stream}", "timeout", {"timeout": 0}, stream=stream)
    struck = time.monotonic()
    try:
        code, _, err = finish(task, timeout=BOUNDS[service] + 60)
        took = time.monotonic() - struck
    finally:
        proxies.reset()
    assert code != 0
    assert REASONS[service] in err and re.search("nothing (of it )?was published", err), err[-3000:]
    assert took <= BOUNDS[service] + 30, f"the task failed {took:.0f} s into the blackhole"
    nothing_published(dsn, pipeline)

    code, _, err = finish(start_task(pipeline, batch_id))  # the task's retry, direct
    assert code == 0, err[-3000:]
    (batch,) = batches(dsn, pipeline)
    assert (batch.status, batch.attempts) == ("committed", 2)
    assert_exactly_once(dsn, servers, pipeline, expected_dead)


# Planning: Kafka's metadata look-up gives up at 30 s (kafka_offsets), a new ledger connection at 10 s.
PLAN_BOUNDS = {"kafka": 30.0, POSTGRES: 10.0}
PLAN_REASONS = {"kafka": "cannot reach Kafka", POSTGRES: "timeout expired"}


@pytest.mark.parametrize("service", ["kafka", POSTGRES])
def test_a_blackholed_service_fails_planning_within_its_bound_and_records_nothing(
    dsn, servers, pipeline_factory, producer, proxies, service, services
):
    pipeline = pipeline_factory(f"blackholed_plan_{service}", partitions=2)
    sent = producer.send(pipeline.topics[0], [good_value(i) for i in range(500)])
    proxy = kafka_proxy(servers) if service == "kafka" else service
    for stream in ("downstream", "upstream"):
        proxies.add(proxy, f"blackhole-{stream}", "timeout", {"timeout": 0}, stream=stream)
    struck = time.monotonic()
    try:
        plan = subprocess.run([sys.executable, str(HARNESS), "task", "plan", "--pipeline", pipeline.name,
                               "--dag-id", "blackholed", "--run-id", "plan-1"],
                              env=proxied_environment(dict(os.environ)), capture_output=True, text=True,
                              timeout=PLAN_BOUNDS[service] + 120)
        took = time.monotonic() - struck
    finally:
        proxies.reset()
    assert plan.returncode != 0
    assert PLAN_REASONS[service] in plan.stderr, plan.stderr[-3000:]
    assert took <= PLAN_BOUNDS[service] + 30, f"planning failed {took:.0f} s into the blackhole"
    assert batches(dsn, pipeline) == []

    planned = plan_next_batch(services, pipeline)  # the task's retry, direct
    code, _, err = finish(start_task(pipeline, planned.batch_id))
    assert code == 0, err[-3000:]
    assert_exactly_once(dsn, servers, pipeline, {})
    assert set(stored(dsn, pipeline)[0]) == set(sent)
