"""`kafka-ledger verify` on the real stack: incremental by default, replays re-checked, planted problems found
by both modes (exit 1), an unreachable Kafka reported as could-not-verify (exit 5) without advancing the point."""

from __future__ import annotations

import socket

import pytest
from integration_support import batches, catch_up, cli, good_value, query

from kafka_ledger.batch.plan import plan_batch
from kafka_ledger.batch.requests import parse_request
from kafka_ledger.ops import verify as verify_module
from kafka_ledger.ops.cli import EXIT_PROBLEMS, EXIT_UNVERIFIED
from kafka_ledger.runtimes import run_batch

pytestmark = pytest.mark.integration


def verify(pipeline, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    code, data, err = cli("verify", pipeline.name, *args, env=env)
    assert data is not None, err
    (report,) = data["pipelines"]
    return code, report


def ranges_of(batch) -> list[dict]:
    return [{"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
            for r in batch.ranges]


def point(dsn, pipeline) -> int | None:
    rows = query(dsn, "SELECT batch_id FROM kafka_ledger.verified_points WHERE pipeline = %s", pipeline.name)
    return rows[0][0] if rows else None


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_incremental_verify_checks_what_changed_since_the_verified_point(
        dsn, servers, pipeline_factory, producer, services, monkeypatch):
    pipeline = pipeline_factory("verify", partitions=2)
    topic = pipeline.topics[0]
    table = f"{pipeline.output_schema}.{pipeline.output_table}"
    producer.send(topic, [good_value(i) for i in range(40)])
    first = catch_up(dsn, servers, pipeline)

    # The first verify has no point yet: it checks every committed batch and advances to the first.
    code, report = verify(pipeline)
    assert code == 0 and report["ok"], report
    assert (report["mode"], report["checked_after_batch"], report["checked_batches"]) == ("incremental", 0, 1)
    assert report["checked_ranges"] == ranges_of(first) and report["kafka_records"] == 40
    assert report["verified_point"] == {"before": None, "after": first.batch_id, "advanced": True}

    # A second batch: only its ranges are compared.
    producer.send(topic, [good_value(i) for i in range(40, 52)])
    second = catch_up(dsn, servers, pipeline)
    code, report = verify(pipeline)
    assert code == 0 and report["ok"], report
    assert (report["checked_after_batch"], report["checked_batches"]) == (first.batch_id, 1)
    assert report["checked_ranges"] == ranges_of(second)
    assert (report["kafka_records"], report["output_rows"] + report["dead_letters"]) == (12, 12)
    assert report["verified_point"] == {"before": first.batch_id, "after": second.batch_id, "advanced": True}
    # Nothing new: nothing compared, the point stays.
    code, report = verify(pipeline)
    assert code == 0 and (report["checked_batches"], report["kafka_records"], report["checked_ranges"]) == (0, 0, [])
    assert report["verified_point"]["advanced"] is False

    # A replay rewrites the first batch's rows after they were verified: they are checked again.
    code, data, err = cli("replay", pipeline.name, "--batch", str(first.batch_id), "--reason", "verify test")
    assert code == 0, err
    replay = batches(dsn, pipeline)[-1]
    code, report = verify(pipeline)
    assert code == 0 and report["checked_batches"] == 1 and report["checked_ranges"] == ranges_of(replay)
    assert report["kafka_records"] == 40 and report["verified_point"]["after"] == replay.batch_id

    # A replay still running when a newer batch commits holds the point below it: its commit is checked next.
    pending = plan_batch(services, pipeline, parse_request({"mode": "replay_batch", "batch_id": second.batch_id}))
    producer.send(topic, [good_value(i) for i in range(52, 60)])
    third = catch_up(dsn, servers, pipeline)
    code, report = verify(pipeline)
    assert code == 0 and report["checked_ranges"] == ranges_of(third)
    assert report["verified_point"]["after"] == pending.batch_id - 1
    run_batch(pipeline, pending.batch_id, services)
    code, report = verify(pipeline)
    assert code == 0 and report["checked_batches"] == 2 and report["kafka_records"] == 12 + 8
    assert report["verified_point"]["after"] == third.batch_id

    # Planted problems in a new batch: a row deleted, a record stored twice, a row in a partition never read.
    producer.send(topic, [good_value(i) for i in range(60, 70)], partition=0)
    fourth = catch_up(dsn, servers, pipeline)
    (deleted,) = query(dsn, f"DELETE FROM {table} WHERE batch_id = %s AND kafka_offset = "
                            f"(SELECT min(kafka_offset) FROM {table} WHERE batch_id = %s) "
                            "RETURNING kafka_topic, kafka_partition, kafka_offset", fourth.batch_id, fourth.batch_id)
    query(dsn, "INSERT INTO kafka_ledger.dead_letters (pipeline, kafka_topic, kafka_partition, kafka_offset, error, "
               f"batch_id) SELECT %s, kafka_topic, kafka_partition, kafka_offset, 'planted', batch_id FROM {table} "
               "WHERE batch_id = %s ORDER BY kafka_offset DESC LIMIT 1", pipeline.name, fourth.batch_id)
    query(dsn, f"INSERT INTO {table} (event_id, amount, kafka_topic, kafka_partition, kafka_offset, batch_id) "
               "VALUES ('planted', 1, %s, 7, 0, %s)", topic, fourth.batch_id)
    before = point(dsn, pipeline)
    for mode in ((), ("--full",)):
        code, report = verify(pipeline, *mode)
        assert code == EXIT_PROBLEMS and not report["ok"], report
        assert (report["missing"], report["duplicates"], report["outside_committed"]) == (1, 1, 1), report
        assert f"{deleted[0]}-{deleted[1]}@{deleted[2]}" in report["problems"][0]
        assert report["verified_point"] == {"before": before, "after": before, "advanced": False}
    # The same found with every partition read on its own, streamed (as a partition with much to read is).
    with monkeypatch.context() as patched:
        patched.setattr(verify_module, "SMALL_PARTITION_OFFSETS", 0)
        for full in (False, True):
            streamed = verify_module.verify_pipeline(services, pipeline, full=full)
            assert (streamed.missing, streamed.duplicates, streamed.outside_committed) == (1, 1, 1), streamed
            assert f"{deleted[0]}-{deleted[1]}@{deleted[2]}" in streamed.problems[0]
    assert verify(pipeline)[1]["checked_ranges"] == ranges_of(fourth)

    # Repaired (the replay restores the row and replaces the dead letter); the stray row removed: all clean.
    query(dsn, f"DELETE FROM {table} WHERE kafka_partition = 7")
    assert cli("replay", pipeline.name, "--batch", str(fourth.batch_id), "--reason", "repair")[0] == 0
    code, report = verify(pipeline, "--full")
    assert code == 0 and report["ok"] and report["mode"] == "full" and report["kafka_records"] == 70, report
    assert report["checked_after_batch"] is None and report["verified_point"]["advanced"] is True

    # Kafka unreachable: could not verify (5), not a problem (1), and the point stays where it was.
    producer.send(topic, [good_value(i) for i in range(70, 75)])
    fifth = catch_up(dsn, servers, pipeline)
    before = point(dsn, pipeline)
    code, report = verify(pipeline, "--timeout", "10",
                          env={"KAFKA_LEDGER_BOOTSTRAP_SERVERS": f"127.0.0.1:{closed_port()}"})
    assert code == EXIT_UNVERIFIED and not report["ok"] and report["problems"] == [], report
    assert report["unverified"].startswith("cannot read the committed topics back from Kafka: cannot reach Kafka at "
                                           "127.0.0.1:"), report
    assert point(dsn, pipeline) == before and report["verified_point"]["advanced"] is False
    code, report = verify(pipeline)
    assert code == 0 and report["checked_ranges"] == ranges_of(fifth) and point(dsn, pipeline) == fifth.batch_id
