"""Hostile topics on the real stack: aborted transactions, compaction, an empty or deleted topic, lost data."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from integration_support import (
    COMPACT_NOW,
    assert_exactly_once,
    batches,
    cli,
    good_value,
    output_count,
    positions,
    produce_versions,
    query,
    recreate_topic,
    spark_task,
    stage_rows,
    verify_ok,
    wait_until_compacted,
)

from kafka_ledger.airflow.dags import PLAN_TASK, run_pipeline_dag
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import kafka_for
from kafka_ledger.ops import readback as audit

pytestmark = pytest.mark.integration


def transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value, partition=0)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def test_aborted_transactions_and_markers_leave_gaps_that_batches_tile_exactly(
    dsn, servers, pipeline_factory
):
    pipeline = pipeline_factory("txn", partitions=1)
    topic = pipeline.topics[0]
    producer = Producer({"bootstrap.servers": servers, "transactional.id": f"kafka-ledger-it-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    # Offsets: 0-2 committed, 3 commit marker | 4-6 aborted, 7 abort marker | 8-9 committed, 10 commit marker.
    transaction(producer, topic, [good_value(i) for i in range(3)], commit=True)
    transaction(producer, topic, [good_value(i) for i in range(3, 6)], commit=False)
    transaction(producer, topic, [good_value(i) for i in range(6, 8)], commit=True)

    # Cap 4: the first batch ends right after a commit marker, the second holds no data record at all.
    for _ in range(3):
        assert run_pipeline_dag(pipeline).state == "success"
    done = batches(dsn, pipeline)
    assert [(r.from_offset, r.until_offset) for b in done for r in b.ranges] == [(0, 4), (4, 8), (8, 11)]
    assert [(b.status, b.records_read, b.records_written) for b in done] == [
        ("committed", 3, 3), ("committed", 0, 0), ("committed", 2, 2)]
    output = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).output
    assert sorted(output) == [(topic, 0, o) for o in (0, 1, 2, 8, 9)]
    assert positions(dsn, pipeline) == {(topic, 0): 11}
    assert_exactly_once(dsn, servers, pipeline, {})
    assert verify_ok(pipeline)["kafka_records"] == 5
    # Nothing new: the next run plans nothing and starts no Spark job.
    outcome = run_pipeline_dag(pipeline)
    assert outcome.tasks["plan_batch"] == "skipped" and len(batches(dsn, pipeline)) == 3


def test_an_empty_topic_plans_nothing_and_verifies(dsn, servers, pipeline_factory):
    pipeline = pipeline_factory("empty", partitions=2)
    outcome = run_pipeline_dag(pipeline)
    assert outcome.state == "success" and outcome.tasks["plan_batch"] == "skipped", outcome
    assert batches(dsn, pipeline) == []
    assert positions(dsn, pipeline) == {(pipeline.topics[0], 0): 0, (pipeline.topics[0], 1): 0}
    assert verify_ok(pipeline)["kafka_records"] == 0


def test_retention_loss_with_skip_policy_is_recorded_and_shown(dsn, servers, pipeline_factory, producer):
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient
    from integration_support import cli, coverage

    pipeline = pipeline_factory("skip_lost", partitions=1)
    topic = pipeline.topics[0]
    first = producer.send(topic, [good_value(i) for i in range(20)], partition=0)
    assert run_pipeline_dag(pipeline).state == "success"
    later = producer.send(topic, [good_value(i) for i in range(20, 50)], partition=0)
    admin = AdminClient({"bootstrap.servers": servers})  # keep a reference until the future resolves

    def delete_before(offset: int) -> None:
        deleted = KafkaTopicPartition(topic, 0, offset)
        admin.delete_records([deleted])[deleted].result(timeout=30)

    delete_before(35)  # offsets 20..34 were never read
    assert run_pipeline_dag(pipeline).state == "success"
    assert sorted(audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).output) == sorted(first + later[15:])
    assert coverage(dsn, pipeline) == [(topic, 0, 0, 20, "read"), (topic, 0, 20, 35, "skipped"),
                                       (topic, 0, 35, 50, "read")]

    # Everything unread is gone: a batch with nothing to read still records the loss and moves on.
    producer.send(topic, [good_value(i) for i in range(10)], partition=0)
    delete_before(60)
    assert run_pipeline_dag(pipeline).state == "success"
    last = batches(dsn, pipeline)[-1]
    assert [(r.skipped_from, r.from_offset, r.until_offset) for r in last.ranges] == [(50, 60, 60)]
    assert (last.status, last.records_read) == ("committed", 0)
    assert positions(dsn, pipeline) == {(topic, 0): 60}
    code, data, _ = cli("status", pipeline.name)
    assert code == 0 and data["partitions"][0]["skipped_offsets"] == 25 and data["lag"] == 0
    report = verify_ok(pipeline)
    assert report["skipped_offsets"] == 25 and report["unverifiable_offsets"] == 35


def test_a_deleted_topic_fails_the_plan_by_name_and_moves_nothing(dsn, servers, pipeline_factory, producer, services):
    from confluent_kafka.admin import AdminClient

    from kafka_ledger.batch.plan import plan_next_batch
    from kafka_ledger.model.ranges import PlanError

    pipeline = pipeline_factory("deleted", partitions=1)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(10)])
    planned = plan_next_batch(services, pipeline)
    admin = AdminClient({"bootstrap.servers": servers})  # keep a reference until the future resolves
    admin.delete_topics([topic])[topic].result(timeout=30)
    for _ in range(60):  # metadata catches up with the deletion
        if topic not in admin.list_topics(timeout=10).topics:
            break
        time.sleep(0.5)
    with pytest.raises(PlanError, match=f"topic\\(s\\) not found in Kafka at {servers}: {topic}"):
        plan_next_batch(services, pipeline)
    assert positions(dsn, pipeline) == {(topic, 0): 0}
    assert [(b.batch_id, b.status) for b in batches(dsn, pipeline)] == [(planned.batch_id, "planned")]


def test_a_recreated_and_refilled_topic_is_refused_until_reset_re_anchors_it(
    dsn, servers, pipeline_factory, producer, services
):
    """The case of issue 21: 100 records read, the topic recreated and refilled with 300; positions (100) lie
    inside the new topic, so only its id tells that offsets 0-99 now name other records."""
    from kafka_ledger.batch.plan import plan_next_batch
    from kafka_ledger.kafka import offsets as kafka_offsets
    from kafka_ledger.model.ranges import TopicIdentityError

    pipeline = pipeline_factory("recreated", partitions=1)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(100)])
    assert run_pipeline_dag(pipeline).state == "success"
    (old_id,) = kafka_offsets.topic_ids(kafka_for(servers), [topic]).values()

    landed = recreate_topic(servers, topic).send(topic, [good_value(1000 + i) for i in range(300)])
    (new_id,) = kafka_offsets.topic_ids(kafka_for(servers), [topic]).values()
    assert new_id != old_id and landed == [(topic, 0, offset) for offset in range(300)]

    with pytest.raises(TopicIdentityError) as refused:
        plan_next_batch(services, pipeline)
    assert f"topic {topic}: the ledger's positions refer to topic id {old_id}" in str(refused.value)
    assert f"has id {new_id}" in str(refused.value) and "Nothing was planned" in str(refused.value)
    outcome = run_pipeline_dag(pipeline)  # the DAG's plan task refuses the same way, at once: no retry can help
    assert outcome.state == "failed" and outcome.tasks["plan_batch"] == "failed"
    assert outcome.tries["plan_batch"] == 1
    assert positions(dsn, pipeline) == {(topic, 0): 100}
    assert len(batches(dsn, pipeline)) == 1

    code, dry_run, _ = cli("reset", pipeline.name, "--to-earliest")
    assert code == 0 and dry_run["dry_run"] and dry_run["reanchored"] == {topic: {"before": old_id, "after": new_id}}
    with pytest.raises(TopicIdentityError):  # a dry run changes nothing
        plan_next_batch(services, pipeline)
    code, applied, stderr = cli("reset", pipeline.name, "--to-earliest", "--execute", "--reason", "topic recreated")
    assert code == 0, stderr
    assert applied["reanchored"] == {topic: {"before": old_id, "after": new_id}}
    assert query(dsn, "SELECT topic_ids FROM kafka_ledger.position_resets WHERE reset_id = %s",
                 applied["reset_id"]) == [({topic: {"before": old_id, "after": new_id}},)]

    assert run_pipeline_dag(pipeline).state == "success"
    assert positions(dsn, pipeline) == {(topic, 0): 300}
    stored = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline)
    assert sorted(stored.output) == landed and not stored.dead_letters
    # The old topic's rows under offsets 0-99 were replaced by the new topic's records.
    assert query(dsn, f"SELECT min(amount), max(amount) FROM it_output.{pipeline.output_table}") == [(1000, 1299)]
    assert verify_ok(pipeline)["earlier_topic_offsets"] == 0


def test_a_topic_recreated_while_its_batch_is_read_is_refused_at_commit_and_its_old_rows_fail_verify(
    dsn, servers, pipeline_factory, producer, services
):
    """Planning saw the topic it anchored; the topic was recreated before the batch committed. The commit refuses
    (nothing published, no position moved). Re-anchored by latest, the earlier topic's rows stay under offsets that
    name other records: verify fails naming them, until a replay of those offsets replaces them."""
    from kafka_ledger.batch.commit import Written, commit
    from kafka_ledger.batch.plan import plan_next_batch
    from kafka_ledger.kafka import offsets as kafka_offsets
    from kafka_ledger.ledger import db as ledger
    from kafka_ledger.model.ranges import OffsetRange, TopicIdentityError

    pipeline = pipeline_factory("recreated_mid_batch", partitions=1)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(100)])
    assert run_pipeline_dag(pipeline).state == "success"
    (old_id,) = kafka_offsets.topic_ids(kafka_for(servers), [topic]).values()
    producer.send(topic, [good_value(100 + i) for i in range(20)])
    planned = plan_next_batch(services, pipeline)
    assert planned.ranges == [OffsetRange(topic, 0, 100, 120)]
    assert query(dsn, "SELECT topic_id FROM kafka_ledger.batch_ranges WHERE batch_id = %s",
                 planned.batch_id) == [(old_id,)]
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:  # read by the old topic's attempt
        stage_rows(cur, pipeline, planned.batch_id, ledger.begin_attempt(cur, planned.batch_id), planned.ranges)

    landed = recreate_topic(servers, topic).send(topic, [good_value(1000 + i) for i in range(300)])
    (new_id,) = kafka_offsets.topic_ids(kafka_for(servers), [topic]).values()
    with pytest.raises(TopicIdentityError) as refused:
        commit(services, pipeline, planned.batch_id, Written())
    assert f"refer to topic id {old_id}, Kafka's {topic} has id {new_id}" in str(refused.value)
    assert f"Batch {planned.batch_id} read from it: nothing was published" in str(refused.value)
    with ledger.connect(LedgerDatabase(dsn)) as conn, conn.cursor() as cur:
        assert output_count(cur, pipeline) == 100
        assert ledger.get_batch(cur, planned.batch_id).status == "written"
    assert positions(dsn, pipeline) == {(topic, 0): 100}

    code, dry_run, _ = cli("reset", pipeline.name, "--to-latest")
    assert code == 0 and dry_run["blocking_batches"] == [planned.batch_id]
    assert dry_run["kept_from_earlier_topic"] == [{"topic": topic, "partition": 0, "from": 0, "until": 100}]
    code, _, stderr = cli("reset", pipeline.name, "--to-latest", "--execute", "--abandon-open-batches",
                          "--reason", "topic recreated; history of the old topic is gone")
    assert code == 0, stderr
    assert positions(dsn, pipeline) == {(topic, 0): 300}

    code, report, _ = cli("verify", pipeline.name, "--full")
    (failed,) = report["pipelines"]
    assert code == 1 and not failed["ok"] and failed["earlier_topic_offsets"] == 100, failed
    assert any(f"earlier topic of that name (id {old_id})" in p and f"--range {topic}:0:0:100" in p
               for p in failed["problems"]), failed["problems"]

    code, _, stderr = cli("replay", pipeline.name, "--range", f"{topic}:0:0:100", "--reason", "rows of the old topic")
    assert code == 0, stderr
    report = verify_ok(pipeline)
    assert report["earlier_topic_offsets"] == 0 and report["unrecorded_topic_id_offsets"] == 0
    stored = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline)
    assert sorted(stored.output) == landed[:100] and not stored.dead_letters
    assert query(dsn, f"SELECT min(amount), max(amount) FROM it_output.{pipeline.output_table}") == [(1000, 1099)]


def partition_status(pipeline) -> tuple[dict, str | None]:
    code, status, stderr = cli("status", pipeline.name)
    assert code == 0, stderr
    (partition,) = status["partitions"]
    return partition, status["retention_warning"]


def test_retention_headroom_warns_before_retention_deletes_unread_offsets_and_the_loss_then_fails_the_plan(
    dsn, servers, pipeline_factory, producer
):
    """A topic keeping records 480 s; records produced with timestamps 400 s old have 80 s left (17 % of the
    window, under the default 25 %; 80 s so that a loaded machine's DAG run still plans before the deletion: CI's
    took 31 s to parse the DAGs), then 440 s old, 40 s left (a status call comes well within them).
    The warning (status, the plan's check task) comes while nothing is lost; once retention has deleted unread
    offsets, on_data_loss (fail) fails the plan naming them."""
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    pipeline = pipeline_factory("short_retention", partitions=1,
                                topic_config={"retention.ms": "480000", "segment.ms": "100"})
    topic = pipeline.topics[0]
    aged = int(time.time() * 1000) - 400_000
    first = producer.send(topic, [good_value(i) for i in range(30)], timestamp_ms=aged)
    # The active segment is never deleted: this run reads everything in time, and its check task fails.
    outcome = run_pipeline_dag(pipeline)
    assert outcome.tasks["check_retention_headroom"] == "failed", outcome
    assert outcome.tasks[PLAN_TASK] == "success" and outcome.tasks[spark_task(pipeline)] == "success", outcome
    assert sorted(audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).output) == first
    partition, warning = partition_status(pipeline)
    assert partition["headroom"]["basis"] == "nothing unread" and warning is None

    # 20 more aged records, then a fresh one: a new segment holds the 20, and the next append closes it.
    aged = int(time.time() * 1000) - 440_000
    producer.send(topic, [good_value(30 + i) for i in range(20)], timestamp_ms=aged)
    producer.send(topic, [good_value(50)])
    partition, warning = partition_status(pipeline)
    margin = partition["headroom"]
    assert partition["log_start"] <= 30 and margin["lost"] == 0, partition  # nothing unread is lost yet
    assert margin["low"] and margin["basis"] == "retention.ms" and 0 < margin["seconds"] <= 40, margin
    assert margin["window_seconds"] == 480 and margin["unread"] == 21, margin
    assert warning.startswith(f"RETENTION HEADROOM LOW for {pipeline.name}: 1 partition(s) under 25%"), warning

    admin = AdminClient({"bootstrap.servers": servers})
    where = KafkaTopicPartition(topic, 0)
    deadline = time.monotonic() + 110
    while admin.list_offsets({where: OffsetSpec.earliest()})[where].result().offset < 50:
        assert time.monotonic() < deadline, "retention did not delete the aged segment"
        time.sleep(1)
    partition, warning = partition_status(pipeline)
    assert partition["headroom"]["lost"] == 20 and "LOST 20 offsets" in partition["note"], partition
    outcome = run_pipeline_dag(pipeline)  # on_data_loss: fail
    assert outcome.state == "failed" and outcome.tasks[PLAN_TASK] == "failed", outcome
    assert positions(dsn, pipeline) == {(topic, 0): 30}


def test_a_compacted_topic_is_read_with_its_gaps_and_verifies_after_more_compaction(
    dsn, servers, pipeline_factory, producer
):
    pipeline = pipeline_factory("compacted", partitions=1, topic_config=COMPACT_NOW)
    topic = pipeline.topics[0]
    first_keys, second_keys = [f"a{i}" for i in range(5)], [f"b{i}" for i in range(5)]
    early = produce_versions(producer, topic, first_keys, 0)           # offsets 0-4
    replaced = produce_versions(producer, topic, second_keys, 5)       # offsets 5-9: newer versions follow
    newer = produce_versions(producer, topic, second_keys, 10)         # offsets 10-14
    filler = produce_versions(producer, topic, ["filler"], 15)         # offset 15, rolls the segment before it
    held = wait_until_compacted(servers, topic, replaced)
    assert held == set(early + newer + filler)

    # Cap 5: [0,5) whole, [5,10) compacted away (a batch without a single record), [10,15), [15,16).
    for _ in range(4):
        assert run_pipeline_dag(pipeline).state == "success"
    done = batches(dsn, pipeline)
    assert [(r.from_offset, r.until_offset) for b in done for r in b.ranges] == [(0, 5), (5, 10), (10, 15), (15, 16)]
    assert [b.records_read for b in done] == [5, 0, 5, 1]
    assert sorted(audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).output) == sorted(early + newer + filler)
    assert positions(dsn, pipeline) == {(topic, 0): 16}
    assert verify_ok(pipeline)["kafka_records"] == 11

    # Compaction now removes records that were already ingested: their rows stay, verify notes them.
    latest = produce_versions(producer, topic, first_keys, 16)         # offsets 16-20
    last = produce_versions(producer, topic, ["filler2"], 21)          # offset 21, rolls the segment before it
    wait_until_compacted(servers, topic, early)
    for _ in range(2):  # [16,21) and [21,22)
        assert run_pipeline_dag(pipeline).state == "success"
    stored = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).output
    assert sorted(stored) == sorted(early + newer + filler + latest + last)
    report = verify_ok(pipeline)
    assert (report["compacted_away"], report["kafka_records"]) == (5, 12)
    assert any("compaction has removed" in w for w in report["warnings"])
