"""A carrier (runtimes/connect/carrier.py) carries several pipelines' batches at once: one read, one Spark job per
decode shape, and each pipeline's rows and offsets committed in its own transaction, exactly once each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from integration_support import (
    BAD_VALUES,
    assert_exactly_once,
    batches,
    good_value,
    pipeline_name,
    positions,
    query,
    stack,
)

from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.runtimes.connect.carrier import Carrier, Cycle

GOOD = 60


@pytest.fixture
def carrier(services):
    carrier = Carrier("it_carrier", services)
    yield carrier
    carrier.close()


def produce(producer, topic: str) -> tuple[list[tuple[str, int, int]], dict[tuple[str, int, int], str]]:
    """GOOD good records and every bad one into `topic`: where each landed, and the bad ones' reasons."""
    landed = producer.send(topic, [good_value(i) for i in range(GOOD)] + [value for value, _ in BAD_VALUES])
    return landed, {landed[GOOD + i]: reason for i, (_, reason) in enumerate(BAD_VALUES)}


def test_a_carrier_publishes_each_member_once_by_its_own_decode_reading_a_shared_topic_in_two_waves(
        services, dsn, servers, pipeline_factory, producer, carrier):
    a = pipeline_factory("carried_a", partitions=3)
    b = get_pipeline(pipeline_name("carried_b"))
    c = pipeline_factory("carried_c", partitions=2)
    assert b.topics == a.topics
    _, dead_a = produce(producer, a.topics[0])
    landed_c, dead_c = produce(producer, c.topics[0])
    # c reads amounts as strings: the record whose amount is "many" is published there, a dead letter for a and b.
    many = next(landed_c[GOOD + i] for i, (value, _) in enumerate(BAD_VALUES) if value and b'"many"' in value)
    del dead_c[many]

    cycle = carrier.carry([a, b, c])
    assert cycle.failures == {}
    assert set(cycle.results) == {a.name, b.name, c.name}
    # a and c together, then b (it reads a's partitions); the first wave's two shapes decode in a job each.
    assert (cycle.waves, cycle.jobs) == (2, 3)
    for pipeline, dead in ((a, dead_a), (b, dead_a), (c, dead_c)):
        assert_exactly_once(dsn, servers, pipeline, dead)
    assert query(dsn, f"SELECT amount FROM it_output.{c.output_table} WHERE kafka_topic = %s AND kafka_partition = %s "
                      "AND kafka_offset = %s", *many) == [("many",)]
    assert {batch.requested_by for p in (a, b, c) for batch in batches(dsn, p)} == {"carrier it_carrier"}

    # Only a's topic has new records: c is caught up, a and b commit the new ones.
    producer.send(a.topics[0], [good_value(i) for i in range(GOOD, GOOD + 30)])
    cycle = carrier.carry([a, b, c])
    assert (cycle.failures, set(cycle.results), cycle.caught_up) == ({}, {a.name, b.name}, [c.name])
    for pipeline, dead in ((a, dead_a), (b, dead_a), (c, dead_c)):
        assert_exactly_once(dsn, servers, pipeline, dead)


def test_a_member_whose_offsets_were_deleted_fails_alone_and_its_batch_stays_open(
        services, dsn, servers, pipeline_factory, producer, carrier):
    d = pipeline_factory("carried_d", partitions=2)
    e = pipeline_factory("carried_e", partitions=2)
    landed_d, _ = produce(producer, d.topics[0])
    _, dead_e = produce(producer, e.topics[0])
    cycle = Cycle()
    members = carrier.begin([d, e], cycle)
    assert [m.name for m in members] == [d.name, e.name]
    # Retention deletes d's records after its batch was planned and begun, before the read.
    ends = {}
    for _, partition, offset in landed_d:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    admin = AdminClient({"bootstrap.servers": servers})  # kept while its futures run
    deleted = admin.delete_records(
        [KafkaTopicPartition(d.topics[0], p, end) for p, end in ends.items()])
    for future in deleted.values():
        future.result(30)

    carrier.publish(members, cycle)
    assert set(cycle.results) == {e.name}
    assert set(cycle.failures) == {d.name}
    assert_exactly_once(dsn, servers, e, dead_e)
    (batch,) = batches(dsn, d)
    assert batch.status == "failed" and "carrier it_carrier" in batch.last_error
    assert query(dsn, f"SELECT count(*) FROM it_output.{d.output_table}") == [(0,)]
    assert not any(positions(dsn, d).values())  # nothing moved


# A carrier's cycle in a process of its own, as the carrier's task runs it.
CARRY = """
import sys
from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.config.settings import task_services
from kafka_ledger.runtimes.connect.carrier import Carrier

Carrier("it_carrier", task_services()).carry([get_pipeline(name) for name in sys.argv[1:]])
"""


def test_a_carrier_killed_inside_a_members_commit_loses_and_doubles_nothing_and_its_batches_resume(
        services, dsn, servers, pipeline_factory, producer, carrier, tmp_path):
    members = [pipeline_factory(key, partitions=2) for key in ("carried_h", "carried_i", "carried_j")]
    dead = {}
    for member in members:
        dead[member.name] = produce(producer, member.topics[0])[1]
    # SIGKILL inside the first member's commit transaction to get there (the members commit at once): the cycle's
    # other commits die with the process, committed or not.
    env = {**os.environ, "KAFKA_LEDGER_FAILPOINTS": "commit_after_publish=kill",
           "KAFKA_LEDGER_FAILPOINTS_ONCE_DIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", CARRY, *[m.name for m in members]], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    opened = {m.name: [b.status for b in batches(dsn, m)] for m in members}
    assert any(statuses != ["committed"] for statuses in opened.values()), opened

    # The next cycle resumes each open batch with its recorded ranges: one catch-up batch a member, committed.
    cycle = carrier.carry(members)
    assert cycle.failures == {}
    for member in members:
        assert_exactly_once(dsn, servers, member, dead[member.name])
        (batch,) = batches(dsn, member)
        assert batch.status == "committed"


@pytest.mark.own_stack  # it restarts the Spark Connect server every test shares
def test_a_carrier_carries_on_once_its_spark_connect_server_restarted(
        services, dsn, servers, pipeline_factory, producer, carrier):
    member = pipeline_factory("carried_k", partitions=2)
    _, dead = produce(producer, member.topics[0])
    assert carrier.carry([member]).failures == {}
    stack("restart-spark-connect")
    producer.send(member.topics[0], [good_value(i) for i in range(GOOD, GOOD + 30)])

    # The restarted server knows neither the carrier's session nor its client: one cycle may fail (its batch stays
    # open, resumed with its ranges by the next), never more; before f3afc43 every cycle failed (NO_ACTIVE_SESSION).
    cycles = []
    while len(cycles) < 4 and (not cycles or member.name not in cycles[-1].caught_up):
        cycles.append(carrier.carry([member]))
    assert member.name in cycles[-1].caught_up, [c.failures for c in cycles]
    assert sum(bool(c.failures) for c in cycles) <= 1, [c.failures for c in cycles]
    assert_exactly_once(dsn, servers, member, dead)
    assert {b.status for b in batches(dsn, member)} == {"committed"}
