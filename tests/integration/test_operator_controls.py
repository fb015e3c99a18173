"""Operator controls on the real stack: replays, offset ranges, time windows, resets, delivery modes, subscriptions."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from integration_support import (
    assert_exactly_once,
    batches,
    cli,
    coverage,
    good_value,
    pipeline_name,
    positions,
    query,
    spark_task,
    stored,
    topic_name,
    verify_ok,
)

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.batch.plan import plan_batch
from kafka_ledger.batch.requests import parse_request
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.ops import readback as audit

pytestmark = pytest.mark.integration


def output_batch_ids(dsn: str, pipeline) -> dict[tuple[str, int, int], int]:
    rows = query(dsn, f"SELECT kafka_topic, kafka_partition, kafka_offset, batch_id FROM "
                      f"{pipeline.output_schema}.{pipeline.output_table}")
    return {(t, p, o): b for t, p, o, b in rows}


def test_replay_of_a_committed_batch_replaces_its_rows_and_keeps_positions(
        dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("replay", partitions=2)
    first = producer.send(pipeline.topics[0], [good_value(i) for i in range(100)] + [b"not json"])
    assert run_pipeline_dag(pipeline).state == "success"
    (original,) = batches(dsn, pipeline)
    before = positions(dsn, pipeline)
    # A transform bug wrote wrong values: a replay after the fix must overwrite them, not add rows.
    query(dsn, f"UPDATE {pipeline.output_schema}.{pipeline.output_table} SET amount = -1")

    outcome = run_pipeline_dag(pipeline, conf={"mode": "replay_batch", "batch_id": original.batch_id,
                                               "reason": "transform fixed"})
    assert outcome.state == "success", outcome
    assert outcome.tasks["drain_backlog"] == "skipped"
    replay = batches(dsn, pipeline)[-1]
    assert (replay.kind, replay.status, replay.replay_of, replay.reason) == (
        "replay", "committed", original.batch_id, "transform fixed")
    assert replay.ranges == original.ranges
    assert query(dsn, f"SELECT count(*) FROM {pipeline.output_schema}.{pipeline.output_table} WHERE amount = -1") \
        == [(0,)]
    assert set(output_batch_ids(dsn, pipeline).values()) == {replay.batch_id}
    assert positions(dsn, pipeline) == before
    assert_exactly_once(dsn, servers, pipeline, {first[-1]: "malformed JSON (not a JSON object)"})
    assert verify_ok(pipeline)["duplicates"] == 0

    # Replaying the pipeline's own unfinished catch-up batch completes it: only then do positions move.
    producer.send(pipeline.topics[0], [good_value(i) for i in range(100, 120)])
    unfinished = plan_batch(services, pipeline)
    assert positions(dsn, pipeline) == before
    code, data, err = cli("replay", pipeline.name, "--batch", str(unfinished.batch_id))
    assert code == 0 and data["plan"]["resumed"] and data["plan"]["kind"] == "catch_up", err
    assert_exactly_once(dsn, servers, pipeline, {first[-1]: "malformed JSON (not a JSON object)"})


def test_offset_ranges_are_validated_then_replaced_through_the_cli(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("ranges", partitions=2)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(60)], partition=0)
    producer.send(topic, [good_value(i) for i in range(40)], partition=1)
    assert run_pipeline_dag(pipeline).state == "success"
    producer.send(topic, [good_value(i) for i in range(10)], partition=0)  # p0: end 70, position 60
    (first,) = batches(dsn, pipeline)

    refusals = {
        f"{topic}:0:50:10": "from 50 must be below until 10",
        f"{topic}:0:0:71": "ends beyond the high watermark 70",
        f"{topic}:9:0:1": f"{topic}-9 is not a partition of the pipeline's subscription",
        "elsewhere:0:0:1": "elsewhere-0 is not a partition",
        f"{topic}:0:55:65": "reaches past the committed position 60",
    }
    for spec, reason in refusals.items():
        code, _, err = cli("replay", pipeline.name, "--range", spec)
        assert code == 3 and reason in err, (spec, code, err)
    code, _, err = cli("replay", pipeline.name, "--batch", "999999999")
    assert code == 3 and "batch 999999999 does not exist" in err, err
    # A run with the same bad request fails at once, before writing anything.
    bad = run_pipeline_dag(pipeline, conf={"mode": "offset_ranges",
                                           "ranges": [{"topic": topic, "partition": 0, "from": 0, "until": 999}]})
    assert bad.state == "failed" and bad.tasks["plan_batch"] == "failed"
    assert bad.tasks[spark_task(pipeline)] != "success"
    assert [b.batch_id for b in batches(dsn, pipeline)] == [first.batch_id]

    # An in-flight rewrite blocks overlapping requests until it is finished (by replaying it).
    in_flight = plan_batch(services, pipeline, parse_request(
        {"mode": "offset_ranges", "ranges": [{"topic": topic, "partition": 1, "from": 0, "until": 20}]}))
    code, _, err = cli("replay", pipeline.name, "--range", f"{topic}:1:10:30")
    assert code == 3 and f"overlaps {topic}-1 [0, 20) of batch {in_flight.batch_id}" in err, err
    code, data, err = cli("replay", pipeline.name, "--batch", str(in_flight.batch_id))
    assert code == 0, err
    assert data["plan"]["resumed"] and data["commit"]["records_written"] == 20

    code, data, err = cli("replay", pipeline.name, "--range", f"{topic}:0:10:30", "--reason", "one bad hour")
    assert code == 0, err
    replay_id = data["plan"]["batch_id"]
    owners = output_batch_ids(dsn, pipeline)
    assert {o for (t, p, o), b in owners.items() if b == replay_id and p == 0} == set(range(10, 30))
    assert {o for (t, p, o), b in owners.items() if b == in_flight.batch_id} == set(range(20))
    assert positions(dsn, pipeline) == {(topic, 0): 60, (topic, 1): 40}
    code, data, _ = cli("batches", pipeline.name, str(replay_id))
    assert (data["kind"], data["reason"], data["ranges"]) == (
        "offset_ranges", "one bad hour", [{"topic": topic, "partition": 0, "from": 10, "until": 30}])
    verify_ok(pipeline)


def test_time_window_resolves_kafka_timestamps_to_offsets(dsn, servers, pipeline_factory, producer):
    pipeline = pipeline_factory("window", partitions=1)
    topic = pipeline.topics[0]
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    two_ago, one_ago = hour - timedelta(hours=2), hour - timedelta(hours=1)
    producer.send(topic, [good_value(i) for i in range(30)], timestamp_ms=int((two_ago + timedelta(minutes=5))
                                                                            .timestamp() * 1000))
    producer.send(topic, [good_value(i) for i in range(20)], timestamp_ms=int((one_ago + timedelta(minutes=5))
                                                                            .timestamp() * 1000))
    producer.send(topic, [good_value(i) for i in range(10)])
    assert run_pipeline_dag(pipeline).state == "success"

    outcome = run_pipeline_dag(pipeline, conf={"mode": "time_window", "window_from": one_ago.isoformat(),
                                               "window_to": hour.isoformat()})
    assert outcome.state == "success", outcome
    window = batches(dsn, pipeline)[-1]
    assert (window.kind, window.window_start, window.window_end) == ("time_window", one_ago, hour)
    assert [(r.from_offset, r.until_offset) for r in window.ranges] == [(30, 50)]
    assert {o for (_, _, o), b in output_batch_ids(dsn, pipeline).items() if b == window.batch_id} == set(range(30, 50))

    # A window reaching into offsets not ingested yet leaves them to the catch-up (dry run shows it).
    producer.send(topic, [good_value(i) for i in range(5)])
    code, data, err = cli("plan", pipeline.name, "--dry-run", "--from", one_ago.isoformat(),
                          "--to", (datetime.now(UTC) + timedelta(minutes=5)).isoformat())
    assert code == 0, err
    assert [(r["from"], r["until"]) for r in data["ranges"]] == [(30, 60)]
    assert [(r["from"], r["until"]) for r in data["pending"]] == [(60, 65)]
    assert data["batch_id"] is None and data["dry_run"]
    assert len(batches(dsn, pipeline)) == 2  # the dry run recorded nothing
    verify_ok(pipeline)


def test_resets_dry_run_audit_reread_skip_and_abandon(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("reset", partitions=2)
    topic = pipeline.topics[0]
    producer.send(topic, [good_value(i) for i in range(50)], partition=0)
    producer.send(topic, [good_value(i) for i in range(50)], partition=1)
    assert run_pipeline_dag(pipeline).state == "success"
    (first,) = batches(dsn, pipeline)

    code, data, err = cli("reset", pipeline.name, "--to-offset", f"{topic}:0=20", "--dry-run")
    assert code == 0, err
    assert data["dry_run"] and data["partitions"] == [
        {"topic": topic, "partition": 0, "before": 50, "after": 20, "skipped": None, "reread": [20, 50]}]
    assert positions(dsn, pipeline) == {(topic, 0): 50, (topic, 1): 50}
    code, _, err = cli("reset", pipeline.name, "--to-offset", f"{topic}:0=20", "--execute")
    assert code == 3 and "needs a reason" in err

    code, data, err = cli("reset", pipeline.name, "--to-offset", f"{topic}:0=20", "--execute", "--reason",
                          "bad deploy", "--requested-by", "alice")
    assert code == 0, err
    assert positions(dsn, pipeline) == {(topic, 0): 20, (topic, 1): 50}
    (audit_row,) = query(dsn, "SELECT requested_by, reason, target, partitions FROM kafka_ledger.position_resets "
                              "WHERE pipeline = %s", pipeline.name)
    assert audit_row[:3] == ("alice", "bad deploy", f"offsets {topic}-0=20")
    assert audit_row[3] == [{"topic": topic, "partition": 0, "before": 50, "after": 20, "skipped": None,
                             "reread": [20, 50]}]
    assert verify_ok(pipeline)["awaiting_reread"] == 30

    assert run_pipeline_dag(pipeline).state == "success"
    reread = batches(dsn, pipeline)[-1]
    assert [(r.partition, r.from_offset, r.until_offset) for r in reread.ranges] == [(0, 20, 50)]
    owners = output_batch_ids(dsn, pipeline)
    assert {o for (_, p, o), b in owners.items() if b == reread.batch_id} == set(range(20, 50))
    assert {o for (_, p, o), b in owners.items() if b == first.batch_id and p == 0} == set(range(20))
    assert_exactly_once(dsn, servers, pipeline, {})

    # Forward: the skipped offsets are recorded, shown by status, and never published.
    skipped = producer.send(topic, [good_value(i) for i in range(30)], partition=1)
    code, data, err = cli("reset", pipeline.name, "--to-latest", "--execute", "--reason", "skip the flood")
    assert code == 0 and data["skipped_offsets"] == 30, err
    assert (topic, 1, 50, 80, "skipped") in coverage(dsn, pipeline)
    code, data, _ = cli("status", pipeline.name)
    assert [p["skipped_offsets"] for p in data["partitions"]] == [0, 30]
    assert not set(skipped) & set(audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).output)
    verify_ok(pipeline)

    # An unfinished batch blocks a reset until it is abandoned explicitly.
    producer.send(topic, [good_value(i) for i in range(5)], partition=0)
    blocked = plan_batch(services, pipeline)
    code, _, err = cli("reset", pipeline.name, "--to-earliest", "--execute", "--reason", "full reload")
    assert code == 3 and f"batch(es) {blocked.batch_id}" in err, err
    code, data, err = cli("reset", pipeline.name, "--to-earliest", "--execute", "--reason", "full reload",
                          "--abandon-open-batches")
    assert code == 0 and data["abandoned_batches"] == [blocked.batch_id], err
    assert next(b for b in batches(dsn, pipeline) if b.batch_id == blocked.batch_id).status == "abandoned"
    assert run_pipeline_dag(pipeline).state == "success"
    assert_exactly_once(dsn, servers, pipeline, {})  # everything re-read, the skipped flood included
    verify_ok(pipeline)


def test_at_least_once_redelivers_after_a_crash_but_loses_nothing(
    dsn, servers, pipeline_factory, producer, monkeypatch, tmp_path
):
    pipeline = pipeline_factory("alo", partitions=2)
    sent = producer.send(pipeline.topics[0], [good_value(i) for i in range(100)] + [b"not json"])
    # Killed after the Spark job appended its rows and before it declared them written: the retry appends again.
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "after_staging=kill")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR", str(tmp_path))
    outcome = run_pipeline_dag(pipeline)
    assert (tmp_path / "after_staging").exists() and outcome.state == "success", outcome
    output, dead = stored(dsn, pipeline)
    assert output == Counter({rid: 2 for rid in sent[:100]})  # re-delivered once, none lost
    assert set(dead) == {sent[100]}
    assert query(dsn, "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
                 f"{pipeline.output_schema}.{pipeline.output_table}") == [(0,)]
    report = verify_ok(pipeline)
    assert report["duplicates"] == 100 and any("at_least_once" in w for w in report["warnings"])


def test_latest_only_reads_the_newest_records_and_records_what_it_skipped(dsn, servers, pipeline_factory, producer):
    pipeline = pipeline_factory("latest_only", partitions=2)
    topic = pipeline.topics[0]
    p0 = producer.send(topic, [good_value(i) for i in range(120)], partition=0)
    p1 = producer.send(topic, [good_value(i) for i in range(30)], partition=1)
    outcome = run_pipeline_dag(pipeline)
    assert outcome.state == "success" and outcome.tasks["drain_backlog"] == "skipped", outcome
    (batch,) = batches(dsn, pipeline)
    assert [(r.partition, r.skipped_from, r.from_offset, r.until_offset) for r in batch.ranges] == [
        (0, 0, 70, 120), (1, None, 0, 30)]
    assert coverage(dsn, pipeline) == [(topic, 0, 0, 70, "skipped"), (topic, 0, 70, 120, "read"),
                                       (topic, 1, 0, 30, "read")]
    assert positions(dsn, pipeline) == {(topic, 0): 120, (topic, 1): 30}
    output, _ = stored(dsn, pipeline)
    assert set(output) == set(p0[70:]) | set(p1)
    assert verify_ok(pipeline)["skipped_offsets"] == 70


def test_pattern_subscription_picks_up_new_matching_topics(dsn, servers, producer):
    from kafka_ledger.config.pipeline import get_pipeline

    pipeline = get_pipeline(pipeline_name("pattern"))
    admin = AdminClient({"bootstrap.servers": servers})
    base = topic_name("pattern")
    for name, partitions in ((f"{base}-a", 2), (f"{base}-b", 1), (f"{base}-a-x", 1), (f"{base}0", 1)):
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result()
    wanted = producer.send(f"{base}-a", [good_value(i) for i in range(20)])
    wanted += producer.send(f"{base}-b", [good_value(i) for i in range(10)])
    producer.send(f"{base}-a-x", [good_value(1)])  # no match: the pattern must match the whole name
    producer.send(f"{base}0", [good_value(1)])
    assert run_pipeline_dag(pipeline).state == "success"
    assert set(stored(dsn, pipeline)[0]) == set(wanted)

    admin.create_topics([NewTopic(f"{base}-c", num_partitions=1, replication_factor=1)])[f"{base}-c"].result()
    wanted += producer.send(f"{base}-c", [good_value(i) for i in range(5)])
    deadline = time.monotonic() + 30
    while f"{base}-c" not in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run_pipeline_dag(pipeline).state == "success"
    output = stored(dsn, pipeline)[0]
    assert set(output) == set(wanted) and max(output.values()) == 1
    assert {t for t, _ in positions(dsn, pipeline)} == {f"{base}-a", f"{base}-b", f"{base}-c"}
    verify_ok(pipeline)


def test_explicit_assignment_reads_only_its_partitions_from_their_start_offsets(
    dsn, servers, pipeline_factory, producer
):
    pipeline = pipeline_factory("assign", partitions=3)
    topic = topic_name("assign")
    sent = {p: producer.send(topic, [good_value(i) for i in range(10)], partition=p) for p in range(3)}
    assert run_pipeline_dag(pipeline).state == "success"
    assert set(stored(dsn, pipeline)[0]) == set(sent[1][5:]) | set(sent[2])
    assert positions(dsn, pipeline) == {(topic, 1): 10, (topic, 2): 10}
    verify_ok(pipeline)
