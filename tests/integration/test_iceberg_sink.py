"""The Iceberg sink in the connect runtime: one snapshot per batch, exactly once, the table read back without Spark
(pyiceberg); the critical window between the snapshot and the ledger's commit; racing attempts; refusals."""

from __future__ import annotations

import json
import signal
from collections import Counter

import pyarrow as pa
import pytest
from integration_support import (
    assert_exactly_once,
    batches,
    declared,
    finish,
    good_value,
    pipeline_name,
    positions,
    start_task,
    stored,
)

from kafka_ledger.batch.plan import plan_batch, plan_next_batch
from kafka_ledger.batch.requests import BatchRequest, RequestError
from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.runtimes.connect.batch import ConnectBatch, SparkReadError
from kafka_ledger.runtimes.submit.runtime import SubmitRuntime
from kafka_ledger.runtimes.submit.spark_submit import submit_batch
from kafka_ledger.sinks import IcebergSink
from kafka_ledger.sinks.iceberg.maintenance import maintain
from kafka_ledger.sinks.iceberg.snapshots import ATTEMPT_KEY, BATCH_KEY, PIPELINE_KEY, RANGES_KEY, IcebergSinkError
from kafka_ledger.spark.sessions import ConnectSessions

pytestmark = pytest.mark.integration


def produce(producer, pipeline, values: list[bytes]) -> list[tuple[str, int, int]]:
    return producer.send(pipeline.topics[0], values)


def snapshots(sink: IcebergSink) -> list[tuple[int, dict[str, str]]]:
    """The table's snapshots in its current history, oldest first, with their summaries."""
    table = sink.table()
    current = {s.snapshot_id for s in table.history()} if table.current_snapshot() else set()
    return [(s.snapshot_id, dict(s.summary.additional_properties)) for s in table.snapshots()
            if s.snapshot_id in current]


def rows_by_offset(sink: IcebergSink) -> dict[tuple[str, int, int], dict]:
    rows = sink.table().scan().to_arrow().to_pylist()
    return {(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]): r for r in rows}


def test_each_batch_commits_one_stamped_snapshot_and_the_table_holds_each_record_once(
        dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("iceberg", partitions=3)
    sink = IcebergSink(pipeline)
    first = produce(producer, pipeline, [good_value(i) for i in range(300)] + [b"not json", b'{"amount": 1}'])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    produce(producer, pipeline, [good_value(i) for i in range(300, 400)])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)

    expected_dead = {first[300]: "malformed JSON (not a JSON object)",
                     first[301]: "required field 'event_id' is missing or null"}
    assert_exactly_once(dsn, servers, pipeline, expected_dead)  # the table read back by pyiceberg, not Spark
    assert max(Counter(sink.output_record_ids(None)).values()) == 1
    committed = batches(dsn, pipeline)
    history = snapshots(sink)
    # One snapshot per batch, each stamped with its batch, attempt, pipeline and ranges; the ledger names it.
    assert [(b.status, b.snapshot_id) for b in committed] == [("committed", s) for s, _ in history]
    for batch, (_, summary) in zip(committed, history, strict=True):
        assert (summary[BATCH_KEY], summary[ATTEMPT_KEY], summary[PIPELINE_KEY]) == (
            str(batch.batch_id), "1", pipeline.name)
        assert json.loads(summary[RANGES_KEY]) == [[r.topic, r.partition, r.from_offset, r.until_offset]
                                                   for r in batch.ranges]
    # The values as produced, in Iceberg's types.
    rows = rows_by_offset(sink)
    row = rows[first[7]]
    assert (row["event_id"], row["amount"], row["price"], row["ok"], row["batch_id"]) == (
        "e7", 7, 7 / 4, False, committed[0].batch_id)
    assert row["event_time"].isoformat() == "2026-11-21T10:00:00+00:00"
    assert {r["batch_id"] for r in rows.values()} == {b.batch_id for b in committed}


def test_a_crash_between_the_snapshot_and_the_ledgers_commit_is_adopted_not_written_again(
        dsn, servers, pipeline_factory, producer, tmp_path, services):
    pipeline = pipeline_factory("iceberg_adopt", partitions=2)
    sink = IcebergSink(pipeline)
    sent = produce(producer, pipeline, [good_value(i) for i in range(500)] + [b"not json"])
    batch_id = plan_next_batch(services, pipeline).batch_id

    code, _, _ = finish(start_task(pipeline, batch_id, "after_snapshot=kill", tmp_path))
    assert code == -signal.SIGKILL and (tmp_path / "after_snapshot").exists()
    [(snapshot_id, summary)] = snapshots(sink)  # the rows landed in the table...
    assert summary[BATCH_KEY] == str(batch_id) and summary[ATTEMPT_KEY] == "1"
    assert set(positions(dsn, pipeline).values()) == {0} and stored(dsn, pipeline)[1] == {}  # ...the ledger moved not
    assert [(b.status, b.snapshot_id) for b in batches(dsn, pipeline)] == [("planned", None)]

    code, out, err = finish(start_task(pipeline, batch_id))  # the retry
    assert code == 0, err[-3000:]
    assert "adopting it, not writing the rows again" in out + err  # the task's log (Airflow's logging: stdout)
    assert [s for s, _ in snapshots(sink)] == [snapshot_id]  # no second snapshot, no second copy
    assert [(b.status, b.attempts, b.snapshot_id) for b in batches(dsn, pipeline)] == [("committed", 2, snapshot_id)]
    assert_exactly_once(dsn, servers, pipeline, {sent[-1]: "malformed JSON (not a JSON object)"})


def test_racing_attempts_on_the_same_batch_leave_its_rows_in_the_table_once(
        dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("iceberg_race", partitions=3)
    sink = IcebergSink(pipeline)
    produce(producer, pipeline, [good_value(i) for i in range(20_000)])
    batch_id = plan_next_batch(services, pipeline).batch_id

    first = start_task(pipeline, batch_id)
    second = start_task(pipeline, batch_id)  # a zombie and its replacement, both alive at once
    results = [finish(first), finish(second)]
    assert any(code == 0 for code, _, _ in results), [err[-2000:] for _, _, err in results]
    for code, _, err in results:
        if code != 0:  # fenced off by the ledger, or by the table's validation of the batch's rows
            assert ("may not publish" in err or "superseded" in err or "ValidationException" in err
                    or "interrupted" in err.lower()), err[-2000:]
    [batch] = batches(dsn, pipeline)
    assert batch.status == "committed" and batch.snapshot_id in [s for s, _ in snapshots(sink)]
    assert_exactly_once(dsn, servers, pipeline, {})
    assert max(Counter(sink.output_record_ids(None)).values()) == 1


def test_a_partition_spec_and_file_size_are_the_tables(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("iceberg_days", partitions=2)
    produce(producer, pipeline, [good_value(i) for i in range(1000)])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    assert_exactly_once(dsn, servers, pipeline, {})
    table = IcebergSink(pipeline).table()
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("kafka_timestamp_day", "day"), ("kafka_partition", "identity")]
    assert table.properties["write.target-file-size-bytes"] == str(8 << 20)


def test_what_the_sink_cannot_take_is_refused_before_anything_is_recorded(
        dsn, servers, pipeline_factory, producer, services):
    def nothing_recorded(pipeline) -> None:
        assert batches(dsn, pipeline) == []

    # A table whose columns conflict with the declaration.
    conflict = pipeline_factory("iceberg_conflict", partitions=1)
    produce(producer, conflict, [good_value(1)])
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField, StringType

    sink = IcebergSink(conflict)
    sink.catalog().create_namespace_if_not_exists(sink.spec.namespace)
    sink.catalog().create_table(sink.identifier, schema=Schema(NestedField(1, "amount", StringType())))
    with pytest.raises(IcebergSinkError, match=r"does not fit the declared columns: column amount is string, not "
                                               r"long \(long\): declare it as the table has it"):
        plan_next_batch(services, conflict)
    nothing_recorded(conflict)

    # A catalog Spark's settings do not declare.
    no_catalog = pipeline_factory("iceberg_no_catalog", partitions=1)
    with pytest.raises(IcebergSinkError, match="catalog 'elsewhere' is not declared in .*spark-defaults.conf"):
        plan_next_batch(services, no_catalog)
    nothing_recorded(no_catalog)


def test_columns_added_or_widened_are_in_the_schema_before_the_snapshot_that_fills_them(
        dsn, servers, pipeline_factory, producer, services):
    pipeline_factory("iceberg_evolve", partitions=1)
    base = get_pipeline(pipeline_name("iceberg_evolve"))
    first = declared(base, [{"name": "event_id", "type": "string", "required": True},
                            {"name": "amount", "type": "int"}])
    produce(producer, first, [good_value(i) for i in range(5)])
    ConnectBatch(first, plan_next_batch(services, first).batch_id).run(services)
    sink = IcebergSink(first)

    def schema() -> dict[str, str]:
        return {f.name: str(f.field_type) for f in sink.table().schema().fields if not f.name.startswith("kafka")
                and f.name != "batch_id"}

    assert schema() == {"event_id": "string", "amount": "int"}
    second = declared(base, [{"name": "event_id", "type": "string", "required": True},
                             {"name": "amount", "type": "long"}, {"name": "price", "type": "double"}])
    produce(producer, second, [good_value(i) for i in range(5, 8)])
    planned = plan_next_batch(services, second)
    assert schema() == {"event_id": "string", "amount": "int"}  # the plan changes nothing
    ConnectBatch(second, planned.batch_id).run(services)
    assert schema() == {"event_id": "string", "amount": "long", "price": "double"}
    rows = sink.table().scan(selected_fields=("kafka_offset", "event_id", "amount", "price")).to_arrow()
    assert sorted(zip(*(rows.column(c).to_pylist() for c in ("kafka_offset", "event_id", "amount", "price")),
                      strict=True)) == [*((i, f"e{i}", i, None) for i in range(5)),
                                        *((i, f"e{i}", i, i / 4) for i in range(5, 8))]
    # Narrowing it again would lose values: refused at the plan, naming the deliberate way.
    with pytest.raises(IcebergSinkError, match=r"column amount is long, not int \(int\).*ALTER TABLE"):
        plan_next_batch(services, declared(base, [{"name": "event_id", "type": "string"},
                                                  {"name": "amount", "type": "int"},
                                                  {"name": "price", "type": "double"}]))


def test_a_replay_replaces_exactly_its_ranges_rows_in_one_snapshot(dsn, servers, pipeline_factory, producer, services):
    pipeline = pipeline_factory("iceberg_replay", partitions=2)
    sink = IcebergSink(pipeline)
    sent = produce(producer, pipeline, [good_value(i) for i in range(400)] + [b"not json"])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    produce(producer, pipeline, [good_value(i) for i in range(400, 500)])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    first, second = batches(dsn, pipeline)
    before = rows_by_offset(sink)

    replay = plan_batch(services, pipeline, BatchRequest(mode="replay_batch", batch_id=first.batch_id,
                                                             reason="test"), requested_by="test")
    ConnectBatch(pipeline, replay.batch_id).run(services)
    replayed = batches(dsn, pipeline)[-1]
    assert (replayed.kind, replayed.status, replayed.replay_of) == ("replay", "committed", first.batch_id)
    # One more snapshot, stamped with the replay; the first batch's rows now the replay's, the second's untouched.
    history = snapshots(sink)
    assert len(history) == 3 and history[-1][0] == replayed.snapshot_id
    assert history[-1][1][BATCH_KEY] == str(replayed.batch_id)
    after = rows_by_offset(sink)
    assert set(after) == set(before)
    assert {k for k, r in after.items() if r["batch_id"] == replayed.batch_id} == {
        k for k, r in before.items() if r["batch_id"] == first.batch_id}
    assert {k for k, r in after.items() if r["batch_id"] == second.batch_id} == {
        k for k, r in before.items() if r["batch_id"] == second.batch_id}
    assert_exactly_once(dsn, servers, pipeline, {sent[-1]: "malformed JSON (not a JSON object)"})


def test_verify_reads_the_table_back_and_finds_a_row_removed_behind_the_ledgers_back(
        dsn, servers, pipeline_factory, producer, services):
    from pyiceberg.expressions import And, EqualTo

    from kafka_ledger.ops.verify import verify_pipeline

    pipeline = pipeline_factory("iceberg_verify", partitions=2)
    sent = produce(producer, pipeline, [good_value(i) for i in range(300)])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    report = verify_pipeline(services, pipeline)
    assert report.ok and (report.output_rows, report.missing) == (300, 0)

    topic, partition, offset = sent[17]
    IcebergSink(pipeline).table().delete(And(EqualTo("kafka_topic", topic), EqualTo("kafka_partition", partition),
                                             EqualTo("kafka_offset", offset)))
    report = verify_pipeline(services, pipeline, full=True)
    assert not report.ok and (report.output_rows, report.missing) == (299, 1)

    # A row written behind the ledger's back for a partition it never read, in a file of its own: verify learns
    # the partition from the file's metrics alone (the batch's file holds both partitions: its rows are read).
    table = IcebergSink(pipeline).table()
    row = table.scan(limit=1).to_arrow()
    index = row.schema.get_field_index("kafka_partition")
    table.append(row.set_column(index, row.schema.field(index), pa.array([7], row.schema.field(index).type)))
    report = verify_pipeline(services, pipeline)
    assert not report.ok and report.outside_committed == 1, report.problems


def test_a_rewrite_waits_until_the_unfinished_catch_up_batch_has_committed(
        dsn, servers, pipeline_factory, producer, services):
    # A rewrite's MERGE would leave files whose batch ids straddle the unfinished batch's, which its overwrite of
    # whole files could then never replace (IcebergSink.rewrites_wait_for_catch_up).
    pipeline = pipeline_factory("iceberg_rewrite_waits", partitions=2)
    produce(producer, pipeline, [good_value(i) for i in range(200)])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    produce(producer, pipeline, [good_value(i) for i in range(200, 300)])
    first, unfinished = batches(dsn, pipeline)[0], plan_next_batch(services, pipeline)
    replay = BatchRequest(mode="replay_batch", batch_id=first.batch_id, reason="test")
    with pytest.raises(RequestError, match=f"catch-up batch {unfinished.batch_id} of .* is planned: its iceberg "
                                           "sink takes a rewrite only once that batch has committed"):
        plan_batch(services, pipeline, replay, requested_by="test")
    assert len(batches(dsn, pipeline)) == 2  # nothing recorded

    ConnectBatch(pipeline, unfinished.batch_id).run(services)
    ConnectBatch(pipeline, plan_batch(services, pipeline, replay, requested_by="test").batch_id).run(services)
    assert [b.status for b in batches(dsn, pipeline)] == ["committed"] * 3
    assert_exactly_once(dsn, servers, pipeline, {})


def test_maintenance_compacts_and_expires_but_keeps_the_snapshot_an_unfinished_batch_adopts(
        dsn, servers, pipeline_factory, producer, tmp_path, services):
    pipeline = pipeline_factory("iceberg_upkeep", partitions=3)  # expire_after_hours 0, retain_last 1
    sink = IcebergSink(pipeline)
    for n in range(3):
        produce(producer, pipeline, [good_value(i) for i in range(n * 300, (n + 1) * 300)])
        ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    sent = produce(producer, pipeline, [good_value(i) for i in range(900, 1200)] + [b"not json"])
    batch_id = plan_next_batch(services, pipeline).batch_id
    code, _, _ = finish(start_task(pipeline, batch_id, "after_snapshot=kill", tmp_path))
    assert code == -signal.SIGKILL  # its snapshot landed; the ledger has not recorded it
    [landed] = [s for s, summary in snapshots(sink) if summary[BATCH_KEY] == str(batch_id)]
    rows_before = rows_by_offset(sink)

    result = maintain(services.ledger, sink, ConnectSessions())
    assert result.kept_for_batches == [batch_id]
    assert result.compaction["rewritten_data_files_count"] == result.data_files_before > 3  # a file per range
    # One file now; the old ones stay on disk while the kept snapshot references them.
    assert result.data_files_after == 1 and result.expiry["deleted_data_files_count"] == 0
    history = snapshots(sink)
    # Everything before the unfinished batch's snapshot expired; it and the compaction's after it stay.
    assert [s for s, _ in history][0] == landed and len(history) == 2
    assert rows_by_offset(sink) == rows_before  # no row changed, none lost, none doubled

    code, out, err = finish(start_task(pipeline, batch_id))  # the retry adopts the kept snapshot
    assert code == 0, err[-3000:]
    assert "adopting it, not writing the rows again" in out + err
    assert [(b.status, b.snapshot_id) for b in batches(dsn, pipeline)][-1] == ("committed", landed)
    assert_exactly_once(dsn, servers, pipeline, {sent[-1]: "malformed JSON (not a JSON object)"})

    again = maintain(services.ledger, sink, ConnectSessions())  # nothing unfinished now: down to the newest snapshot
    assert again.kept_for_batches == [] and again.snapshots_after == 1
    assert again.expiry["deleted_data_files_count"] == result.data_files_before  # the small files are gone now
    assert rows_by_offset(sink) == rows_before


# In the long lane: its crash between the snapshot and the ledger's commit is the long lane's Iceberg campaign in
# spark-submit too, and the default run has the connect runtime's adoption and replay above.
@pytest.mark.long
def test_the_submit_runtime_publishes_one_snapshot_per_batch_adopts_after_a_crash_and_replays(
        dsn, servers, pipeline_factory, producer, tmp_path, monkeypatch, services):
    pipeline = pipeline_factory("iceberg_submit", partitions=2)
    sink = IcebergSink(pipeline)
    sent = produce(producer, pipeline, [good_value(i) for i in range(300)] + [b"not json"])
    dead = {sent[-1]: "malformed JSON (not a JSON object)"}
    first = SubmitRuntime().run_batch(pipeline, plan_next_batch(services, pipeline).batch_id, services)
    assert first.already_committed  # the Spark job committed it; the commit task found it so
    assert_exactly_once(dsn, servers, pipeline, dead)

    # The Spark job killed between its snapshot and the ledger's commit: the next attempt adopts the snapshot.
    produce(producer, pipeline, [good_value(i) for i in range(300, 500)])
    batch_id = plan_next_batch(services, pipeline).batch_id
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "after_snapshot=kill")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR", str(tmp_path))
    with pytest.raises(Exception, match="spark-submit"):
        submit_batch(pipeline, batch_id, services)
    assert (tmp_path / "after_snapshot").exists()
    [landed] = [s for s, summary in snapshots(sink) if summary[BATCH_KEY] == str(batch_id)]
    assert batches(dsn, pipeline)[-1].status == "planned"
    SubmitRuntime().run_batch(pipeline, batch_id, services)  # the fail point fired once: the retry runs clean
    assert [(b.status, b.snapshot_id) for b in batches(dsn, pipeline)][-1] == ("committed", landed)
    assert len(snapshots(sink)) == 2
    assert_exactly_once(dsn, servers, pipeline, dead)

    # A replay: the job's MERGE, stamped through its own session.
    replay = plan_batch(services, pipeline, BatchRequest(mode="replay_batch", batch_id=batch_id, reason="test"),
                        requested_by="test")
    SubmitRuntime().run_batch(pipeline, replay.batch_id, services)
    history = snapshots(sink)
    assert len(history) == 3 and history[-1][1][BATCH_KEY] == str(replay.batch_id)
    assert batches(dsn, pipeline)[-1].snapshot_id == history[-1][0]
    assert_exactly_once(dsn, servers, pipeline, dead)


def test_a_warehouse_that_cannot_take_the_files_fails_the_batch_and_publishes_nothing(
        dsn, servers, pipeline_factory, producer, services):
    import shutil
    from pathlib import Path

    pipeline = pipeline_factory("iceberg_unwritable", partitions=2)
    sink = IcebergSink(pipeline)
    produce(producer, pipeline, [good_value(i) for i in range(100)])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    before, moved = snapshots(sink), positions(dsn, pipeline)

    # The table's data folder becomes a file: no data file can be written there (as on a full disk, a write fails).
    data = Path(sink.table().location().removeprefix("file://")) / "data"
    shutil.move(data, data.with_name("data.kept"))
    data.write_text("not a folder")
    produce(producer, pipeline, [good_value(i) for i in range(100, 200)])
    batch_id = plan_next_batch(services, pipeline).batch_id
    try:
        with pytest.raises(SparkReadError, match=f"Spark failed attempt 1 of batch {batch_id} .*nothing was published"):
            ConnectBatch(pipeline, batch_id).run(services)
        assert snapshots(sink) == before and positions(dsn, pipeline) == moved  # nothing landed, nothing moved
        assert batches(dsn, pipeline)[-1].status == "planned"
    finally:
        data.unlink()
        shutil.move(data.with_name("data.kept"), data)
    ConnectBatch(pipeline, batch_id).run(services)  # the retry, with the warehouse back
    assert [b.status for b in batches(dsn, pipeline)] == ["committed", "committed"]
    assert_exactly_once(dsn, servers, pipeline, {})


def test_the_ledger_page_and_its_api_name_each_batchs_snapshot(
        dsn, servers, pipeline_factory, producer, monkeypatch, services):
    from fastapi.testclient import TestClient

    from kafka_ledger.ops.web import app as web_app

    pipeline = pipeline_factory("iceberg_page", partitions=2)
    produce(producer, pipeline, [good_value(i) for i in range(50)])
    ConnectBatch(pipeline, plan_next_batch(services, pipeline).batch_id).run(services)
    (batch,) = batches(dsn, pipeline)
    monkeypatch.setattr(web_app, "_pipelines", lambda: ({pipeline.name: pipeline}, {}))
    client = TestClient(web_app.create_app())

    page = client.get(f"/pipelines/{pipeline.name}")
    assert page.status_code == 200 and ">Snapshot</th>" in page.text
    assert f'<td class="num">{batch.snapshot_id}</td>' in page.text
    shown = client.get(f"/pipelines/{pipeline.name}/batches/{batch.batch_id}")
    assert shown.status_code == 200 and str(batch.snapshot_id) in shown.text
    api = client.get(f"/api/pipelines/{pipeline.name}/batches/{batch.batch_id}").json()
    assert api["snapshot_id"] == batch.snapshot_id
