"""A pipeline driven end to end through a real Airflow (scripts/airflow.sh), its REST API v2 and its UI.

The Kafka Ledger page's tests come after the pipeline's runs and read what they left in the ledger (each
still runs alone: it catches the pipeline up first).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg2
import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from integration_support import (
    BAD_VALUES,
    RecordedProducer,
    assert_exactly_once,
    committed_group_offsets,
    good_value,
    html_table,
    listening_sockets,
    not_loopback,
)
from psycopg2 import sql

from kafka_ledger.config.pipeline import PipelineConfig, read_pipelines
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import kafka_for
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import join_consecutive
from kafka_ledger.ops import readback as audit
from tools.airflow_server import AirflowClient, admin_password, airflow_test_settings, running_airflow, session_members
from tools.fault_campaign.doorbell import AIRFLOW_STRIKES, DoorbellCampaign

pytestmark = pytest.mark.integration

# DAGs only the tests' Airflow loads (downstream DAGs scheduled on a pipeline's output asset).
TEST_DAGS = Path(__file__).resolve().parent / "dags"

RecordId = tuple[str, int, int]
HOURS = 3  # the records' Kafka timestamps cover the last HOURS full hours
BACKFILL_HOURS = 2  # the backfill replays the last BACKFILL_HOURS of them: the first hour must stay untouched
# Records per partition: partition 0 exceeds the pipeline's cap of 100, so catching up takes two batches.
GOOD_PER_PARTITION = {0: 160, 1: 60}
BAD_IN_PARTITION_1 = [BAD_VALUES[0], BAD_VALUES[-1]]  # malformed JSON and a tombstone


@dataclass(frozen=True)
class RestCase:
    """The module's pipeline: its DAG, the hourly windows its records fall in, and the expected dead letters."""

    pipeline: PipelineConfig
    dag_id: str
    windows: list[tuple[datetime, datetime]]
    expected_dead: dict[RecordId, str]


@pytest.fixture(scope="module")
def airflow(test_pipelines_file: Path, servers: str, dsn: str) -> Iterator[AirflowClient]:
    """A dedicated Airflow for this module; it inherits KAFKA_LEDGER_PIPELINES, set by `test_pipelines_file`."""
    with running_airflow(extra_dags=TEST_DAGS) as client:
        yield client


@pytest.fixture(autouse=True)
def airflow_log_path(airflow: AirflowClient) -> None:
    """Name the Airflow log in every test's captured output: pytest shows it when the test fails."""
    print(f"test Airflow log: {airflow.log_path}; task logs under {airflow.log_path.parent / 'logs'}")


def produce_timed(servers: str, topic: str, records: list[tuple[int, datetime, bytes | None]]) -> list[RecordId]:
    """Produce (partition, Kafka timestamp, value) in order; element i of the result is where record i landed."""
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})
    landed: dict[int, RecordId] = {}
    errors: list[str] = []

    def on_delivery(index: int) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                landed[index] = (msg.topic(), msg.partition(), msg.offset())
        return report

    for i, (partition, at, value) in enumerate(records):
        producer.produce(
            topic, key=f"k{i}".encode(), value=value, partition=partition,
            timestamp=int(at.timestamp() * 1000), on_delivery=on_delivery(i),
        )
        producer.poll(0)
    producer.flush(30)
    assert not errors, errors
    return [landed[i] for i in range(len(records))]


@pytest.fixture(scope="module")
def rest(airflow: AirflowClient, servers: str, test_pipelines_file: Path) -> Iterator[RestCase]:
    """The pipeline "rest" (hourly, cap 100 per partition) with records spread over the last full hours.

    Module-scoped (so not conftest's function-scoped pipeline_factory/producer): the three tests share
    one topic, and each can also run alone.
    """
    # conftest.pipeline_name("rest"), read from the session's pipelines file: `import conftest` could
    # give tests/unit's conftest, which pytest also loads under that module name.
    (pipeline,) = [p for name, p in read_pipelines(test_pipelines_file).valid.items() if name.endswith("_rest")]
    topic = pipeline.topics[0]
    admin = AdminClient({"bootstrap.servers": servers})  # keep a reference: a collected client fails the future
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()

    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    windows = [(hour - timedelta(hours=HOURS - k), hour - timedelta(hours=HOURS - k - 1)) for k in range(HOURS)]
    span = windows[-1][1] - windows[0][0]
    records: list[tuple[int, datetime, bytes | None]] = []
    bad_at: dict[int, str] = {}
    next_value = 0
    for partition, good in GOOD_PER_PARTITION.items():
        values: list[bytes | None] = [good_value(next_value + i) for i in range(good)]
        next_value += good
        if partition == 1:
            for n, (value, reason) in enumerate(BAD_IN_PARTITION_1):
                position = (n + 1) * len(values) // (len(BAD_IN_PARTITION_1) + 1)
                values.insert(position, value)
                bad_at[len(records) + position] = reason
        # Timestamps rise with the offset (a timestamp resolves to an offset only then), evenly over the hours.
        records += [(partition, windows[0][0] + span * (i + 0.5) / len(values), v) for i, v in enumerate(values)]
    landed = produce_timed(servers, topic, records)
    # Now the bad records' coordinates are known (positions shifted as they were inserted in order).
    expected_dead = {landed[i]: reason for i, reason in bad_at.items()}
    assert len(expected_dead) == len(BAD_IN_PARTITION_1)

    airflow.wait_for_dag(pipeline.dag_id)
    yield RestCase(pipeline, pipeline.dag_id, windows, expected_dead)
    # Paused, the DAG gets no scheduled run when a later session starts this Airflow again.
    try:
        airflow.set_paused(pipeline.dag_id, True)
    except Exception as exc:  # noqa: BLE001 - best effort: the server may be the thing that failed
        print(f"could not pause {pipeline.dag_id}: {exc}", file=sys.stderr)


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def batch_rows(dsn: str, pipeline: PipelineConfig) -> list[tuple[int, str]]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT batch_id, status FROM kafka_ledger.batches WHERE pipeline = %s ORDER BY batch_id",
            (pipeline.name,),
        )
        rows = cur.fetchall()
    conn.close()
    return rows


def output_batches(dsn: str, pipeline: PipelineConfig) -> dict[RecordId, tuple[datetime, int]]:
    """Each output row's Kafka timestamp and the batch that published it."""
    query = sql.SQL("SELECT kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, batch_id FROM {}").format(
        sql.Identifier(pipeline.output_schema, pipeline.output_table)
    )
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(query)
        rows = {(t, p, o): (at, batch_id) for t, p, o, at, batch_id in cur.fetchall()}
    conn.close()
    return rows


def assert_all_succeeded(airflow: AirflowClient, dag_id: str, runs: list[dict]) -> None:
    failed = [r for r in runs if r["state"] != "success"]
    assert not failed, "runs did not succeed:\n" + airflow.describe_runs(dag_id, failed)


def ensure_caught_up(airflow: AirflowClient, case: RestCase, dsn: str, servers: str) -> None:
    """Unpaused and without lag, whether or not the catch-up test ran before (so each test can run alone)."""
    if airflow.dag(case.dag_id)["is_paused"]:
        airflow.set_paused(case.dag_id, False)
        # Unpausing an hourly DAG with catchup=False makes the scheduler create one scheduled run.
        airflow.wait_for_runs(case.dag_id, "scheduled")
    airflow.wait_until_idle(case.dag_id)
    if audit.lag(LedgerDatabase(dsn), kafka_for(servers), case.pipeline) > 0:
        airflow.trigger(case.dag_id, {"mode": "catch_up", "reason": "rest e2e: catch up first"})
        assert_all_succeeded(airflow, case.dag_id, airflow.wait_until_idle(case.dag_id))
    assert audit.lag(LedgerDatabase(dsn), kafka_for(servers), case.pipeline) == 0


def test_trigger_with_conf_catches_up_exactly_once(airflow: AirflowClient, rest: RestCase, dsn: str, servers: str):
    airflow.set_paused(rest.dag_id, False)
    # The scheduler creates one scheduled run for the last full hour (catchup=False); wait for it, so it
    # cannot appear after the wait below has seen the DAG idle.
    (scheduled,) = airflow.wait_for_runs(rest.dag_id, "scheduled")

    manual = airflow.trigger(rest.dag_id, {"mode": "catch_up", "reason": "rest e2e"})
    assert manual["state"] == "queued" and manual["run_type"] == "manual"
    # The cap (100 per partition) leaves a backlog: drain_backlog triggers follow-up runs by itself.
    runs = airflow.wait_until_idle(rest.dag_id, timeout=600)

    assert_all_succeeded(airflow, rest.dag_id, runs)
    by_id = {r["dag_run_id"]: r for r in runs}
    assert by_id[manual["dag_run_id"]]["conf"] == {"mode": "catch_up", "reason": "rest e2e"}
    assert scheduled["dag_run_id"] in by_id
    assert_exactly_once(dsn, servers, rest.pipeline, rest.expected_dead)
    # Partition 0's 160 records cannot fit one capped batch: the backlog was drained by a second one.
    done = batch_rows(dsn, rest.pipeline)
    assert len(done) >= 2 and {status for _, status in done} == {"committed"}, done
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        assert all(r.span <= 100 for batch_id, _ in done for r in ledger.get_batch(cur, batch_id).ranges)
    conn.close()
    # The project's own names are readable in task logs: no password of the stack is a word Airflow
    # would mask in them.
    plan_log = "\n".join(airflow.task_log(rest.dag_id, manual["dag_run_id"], "plan_batch", 1))
    assert "planned batch" in plan_log or "resum" in plan_log, plan_log[-2000:]
    assert "***" not in plan_log, plan_log[-2000:]
    # librdkafka's informational lines (written to stderr, so logged by Airflow as errors) are silenced.
    assert "Purging" not in plan_log and "librdkafka" not in plan_log.lower(), plan_log[-2000:]


def test_backfill_replays_the_hours_exactly_once(airflow: AirflowClient, rest: RestCase, dsn: str, servers: str):
    ensure_caught_up(airflow, rest, dsn, servers)
    windows = rest.windows[-BACKFILL_HOURS:]
    published_before = output_batches(dsn, rest.pipeline)
    body = {
        "dag_id": rest.dag_id,
        # Inclusive bounds on logical dates; an hourly interval run's logical date is its interval's start.
        "from_date": _iso(windows[0][0]),
        "to_date": _iso(windows[-1][0]),
        "run_backwards": False,
        "dag_run_conf": {},
        # Also re-run the hours that already have a successful run (the scheduled run of the last hour).
        "reprocess_behavior": "completed",
        "max_active_runs": 1,
    }
    planned = airflow.dry_run_backfill(body)
    assert [_parse(p["logical_date"]) for p in planned] == [start for start, _ in windows], planned

    backfill = airflow.create_backfill(body)
    runs = airflow.wait_for_backfill(backfill, runs=len(planned), timeout=900)
    airflow.wait_until_idle(rest.dag_id)  # a backfill run's drain_backlog may have triggered another run

    assert_all_succeeded(airflow, rest.dag_id, runs)
    intervals = sorted((_parse(r["data_interval_start"]), _parse(r["data_interval_end"])) for r in runs)
    assert intervals == windows
    replayed_by: dict[tuple[datetime, datetime], int] = {}  # window -> its backfill batch
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for start, end in intervals:
            cur.execute(
                "SELECT batch_id, status FROM kafka_ledger.batches WHERE pipeline = %s AND kind = 'backfill' "
                "AND window_start = %s AND window_end = %s",
                (rest.pipeline.name, start, end),
            )
            rows = cur.fetchall()
            assert len(rows) <= 1, f"window {start} .. {end} has several backfill batches: {rows}"
            assert all(status == "committed" for _, status in rows), rows
            if rows:
                replayed_by[(start, end)] = rows[0][0]
    conn.close()
    assert replayed_by, "the windows hold records, yet no backfill batch was recorded"
    assert_exactly_once(dsn, servers, rest.pipeline, rest.expected_dead)
    # A replayed window's rows now come from its backfill batch; every other row is untouched.
    for record, (at, batch_id) in output_batches(dsn, rest.pipeline).items():
        window = next(((s, e) for s, e in replayed_by if s <= at < e), None)
        expected = replayed_by[window] if window else published_before.get(record, (None, None))[1]
        assert batch_id == expected, f"{record} at {at}: published by batch {batch_id}, expected {expected}"

    cli = Path(sys.executable).parent / "kafka-ledger"
    verify = subprocess.run(
        [str(cli), "verify", rest.pipeline.name, "--json"], capture_output=True, text=True, timeout=300, check=False
    )
    assert verify.returncode == 0, f"kafka-ledger verify failed:\n{verify.stdout}\n{verify.stderr}"
    assert json.loads(verify.stdout)["ok"] is True, verify.stdout


def test_clearing_a_committed_run_replays_its_own_ranges(
    airflow: AirflowClient, rest: RestCase, dsn: str, servers: str
):
    ensure_caught_up(airflow, rest, dsn, servers)
    name = rest.pipeline.name
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT batch_id, run_id FROM kafka_ledger.batches WHERE pipeline = %s AND kind = 'catch_up' "
                    "AND status = 'committed' AND run_id IS NOT NULL ORDER BY batch_id DESC LIMIT 1", (name,))
        original_id, run_id = cur.fetchone()
        original = ledger.get_batch(cur, original_id)
        positions_before = ledger.positions(cur, name)
    conn.close()
    published_before = output_batches(dsn, rest.pipeline)
    # Some of the run's offsets are new since: clearing must not read them under the old run's name.
    produce_timed(servers, rest.pipeline.topics[0], [(0, datetime.now(UTC), good_value(90_000))])

    airflow.request("POST", f"/api/v2/dags/{rest.dag_id}/clearTaskInstances",
                    json={"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True})
    final = airflow.wait_for_run(rest.dag_id, run_id, timeout=600)
    airflow.wait_until_idle(rest.dag_id)

    assert final["state"] == "success", airflow.describe_run(rest.dag_id, run_id)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %s AND run_id = %s AND batch_id > %s",
                    (name, run_id, original_id))
        (replay_id,) = [row[0] for row in cur.fetchall()]
        replay = ledger.get_batch(cur, replay_id)
        assert ledger.positions(cur, name) == positions_before, "clearing a run moved the positions"
    conn.close()
    assert (replay.kind, replay.status, replay.replay_of) == ("replay", "committed", original_id)
    assert replay.ranges == original.ranges
    # Exactly the run's own ranges were rewritten: their rows now come from the replay, every other row is as it was.
    for (topic, partition, offset), (_, batch_id) in output_batches(dsn, rest.pipeline).items():
        inside = any(r.topic == topic and r.partition == partition and r.from_offset <= offset < r.until_offset
                     for r in original.ranges)
        if not inside and (topic, partition, offset) not in published_before:
            continue  # the record produced above, should an hourly run have read it meanwhile
        expected = replay_id if inside else published_before[(topic, partition, offset)][1]
        assert batch_id == expected, f"{(topic, partition, offset)}: published by {batch_id}, expected {expected}"
    ensure_caught_up(airflow, rest, dsn, servers)  # the record produced above, for the tests after this one
    assert_exactly_once(dsn, servers, rest.pipeline, rest.expected_dead)


def test_invalid_offset_ranges_conf_fails_the_run_without_a_batch(
    airflow: AirflowClient, rest: RestCase, dsn: str, servers: str
):
    ensure_caught_up(airflow, rest, dsn, servers)
    before = batch_rows(dsn, rest.pipeline)
    bad_range = {"topic": rest.pipeline.topics[0], "partition": 0, "from": 50, "until": 10}  # from > until
    conf = {"mode": "offset_ranges", "ranges": [bad_range]}

    run = airflow.trigger(rest.dag_id, conf)
    final = airflow.wait_for_run(rest.dag_id, run["dag_run_id"], timeout=300)

    assert final["state"] == "failed", airflow.describe_run(rest.dag_id, run["dag_run_id"])
    assert batch_rows(dsn, rest.pipeline) == before, "the invalid request wrote a batch"
    # A value the form's schema rejects is refused by the REST API in one sentence, without the schema.
    refused = airflow.request("POST", f"/api/v2/dags/{rest.dag_id}/dagRuns",
                              json={"logical_date": None, "conf": {"mode": "sideways"}}, expect=(400,))
    detail = refused.json()["detail"]
    assert detail.startswith("Invalid input for param mode:") and "\n" not in detail and "schema" not in detail, detail
    # The reason in one sentence, without the validation library's traceback chained to it.
    log = "\n".join(airflow.task_log(rest.dag_id, run["dag_run_id"], "plan_batch", 1))
    assert "refused, nothing was written: invalid run request: ranges.0" in log, log[-3000:]
    assert "pydantic" not in log and "ValidationError" not in log and "refused: refused" not in log, log[-3000:]


def test_an_invalid_pipeline_entry_is_an_import_error_and_hides_no_other_dag(
    airflow: AirflowClient, rest: RestCase, test_pipelines_file: Path
):
    declarations = read_pipelines(test_pipelines_file)
    (invalid,) = declarations.invalid  # conftest's INVALID entry, beside every pipeline of the session
    assert airflow.dag(rest.dag_id) is not None
    deadline = time.monotonic() + 120
    while True:
        errors = airflow.request("GET", "/api/v2/importErrors", params={"limit": 100}).json()["import_errors"]
        reported = [e for e in errors if e["filename"].endswith("kafka_ledger_invalid_pipelines.py")]
        if reported or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert reported, f"no import error for the invalid entry {invalid!r}: {errors}"
    (error,) = reported
    assert f"pipeline {invalid!r} is invalid" in error["stack_trace"]
    assert f"pipelines.{invalid}.columns.0.type" in error["stack_trace"]
    assert airflow.dag(f"kafka_ledger__{invalid}") is None
    assert {e["filename"] for e in errors} == {error["filename"]}, "only the invalid entry's file is an import error"


def test_every_airflow_component_listens_on_loopback_only(airflow: AirflowClient):
    sockets = listening_sockets(session_members(airflow.session_id))
    assert int(airflow.http.base_url.port) in {port for _, port in sockets}  # the api-server was found
    assert not_loopback(sockets) == set(), f"Airflow listens beyond loopback: {sorted(sockets)}"


def test_three_pipelines_run_their_spark_work_at_once_each_exactly_once(
    airflow: AirflowClient, dsn: str, servers: str, test_pipelines_file: Path
):
    pipelines = [p for name, p in read_pipelines(test_pipelines_file).valid.items() if "_parallel_" in name]
    assert len(pipelines) == 3
    producer = RecordedProducer(servers)
    admin = AdminClient({"bootstrap.servers": servers})
    expected_dead: dict[str, dict[RecordId, str]] = {}
    for pipeline in pipelines:
        topic = pipeline.topics[0]
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
        producer.send(topic, [good_value(i) for i in range(5000)])
        value, reason = BAD_VALUES[0]
        expected_dead[pipeline.name] = {producer.send(topic, [value])[0]: reason}
        airflow.wait_for_dag(pipeline.dag_id)
        airflow.set_paused(pipeline.dag_id, False)
    triggered = {p.dag_id: airflow.trigger(p.dag_id, {"mode": "catch_up"})["dag_run_id"] for p in pipelines}

    spark_spans = []
    for pipeline in pipelines:
        runs = airflow.wait_until_idle(pipeline.dag_id, timeout=900)
        assert_all_succeeded(airflow, pipeline.dag_id, runs)
        (spark,) = [ti for ti in airflow.task_instances(pipeline.dag_id, triggered[pipeline.dag_id])
                    if ti["task_id"] in ("read_and_commit", "read_and_stage")]
        spark_spans.append((_parse(spark["start_date"]), _parse(spark["end_date"])))
        airflow.set_paused(pipeline.dag_id, True)

        produced = audit.kafka_record_ids(kafka_for(servers), pipeline.topics)
        stored = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline)
        output, dead = Counter(stored.output), Counter(stored.dead_letters)
        assert max(output.values()) == 1 and max(dead.values()) == 1, "a record is stored twice"
        assert set(output) | set(dead) == produced and not set(output) & set(dead)
        assert set(dead) == set(expected_dead[pipeline.name])
    # Spark work is serialised per pipeline, not across pipelines: the pool's slots (2 here) run at once.
    overlapping = [(a, b) for i, a in enumerate(spark_spans) for b in spark_spans[i + 1:]
                   if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, f"no two pipelines' Spark tasks ran at the same time: {spark_spans}"


def test_a_doorbell_starts_a_run_within_seconds_of_new_data_and_none_without(
    airflow: AirflowClient, dsn: str, servers: str, test_pipelines_file: Path
):
    """The doorbell under the real scheduler and triggerer: each time records arrive, one run starts and
    publishes them exactly once; with nothing new, no run starts; Kafka never sees a group or an offset of it."""
    (pipeline,) = [p for name, p in read_pipelines(test_pipelines_file).valid.items() if name.endswith("_doorbell")]
    topic = pipeline.topics[0]
    admin = AdminClient({"bootstrap.servers": servers})  # kept: the future needs its client alive
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
    producer = RecordedProducer(servers)
    airflow.wait_for_dag(pipeline.dag_id)
    airflow.set_paused(pipeline.dag_id, False)
    try:
        expected_dead = {}
        started_after = []
        for round_ in range(2):
            producer.send(topic, [good_value(1000 * round_ + i) for i in range(500)])
            value, reason = BAD_VALUES[0]
            expected_dead[producer.send(topic, [value])[0]] = reason
            sent = time.monotonic()
            # The first ring waits for the DAG's next parse after the unpause (its watcher is registered then).
            airflow.wait_for_runs(pipeline.dag_id, "asset_triggered", count=round_ + 1, timeout=120)
            started_after.append(time.monotonic() - sent)
            airflow.wait_until_idle(pipeline.dag_id, timeout=300)
        runs = airflow.runs(pipeline.dag_id)
        assert_all_succeeded(airflow, pipeline.dag_id, runs)
        assert {r["run_type"] for r in runs} == {"asset_triggered"}
        # The doorbell starts the second run (on a live triggerer) within seconds of its data.
        print(f"doorbell runs started {[round(s, 1) for s in started_after]} s after their records were sent")
        assert started_after[1] < 30, started_after

        # Nothing new: several polls later, still no other run.
        time.sleep(8)
        assert len(airflow.runs(pipeline.dag_id)) == len(runs) == 2, airflow.describe_runs(pipeline.dag_id, runs)
    finally:
        airflow.set_paused(pipeline.dag_id, True)

    assert_exactly_once(dsn, servers, pipeline, expected_dead)
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        assert {b.requested_by for b in ledger.list_batches(cur, pipeline.name)} == {"doorbell"}
    assert committed_group_offsets(servers, topic) == {}


def test_a_carriers_doorbell_starts_runs_that_carry_every_members_batches_exactly_once(
    airflow: AirflowClient, dsn: str, servers: str, pipeline_factory, test_pipelines_file: Path
):
    """A carrier under the real scheduler and triggerer: its one doorbell rings when its members' records arrive, and
    its run plans, reads and commits every member's batch, each in its own transaction, exactly once; its leases end
    with it; Kafka never sees a group or an offset of it."""
    members = [pipeline_factory("carried_f", partitions=2), pipeline_factory("carried_g", partitions=3)]
    (carrier,) = [c for name, c in read_pipelines(test_pipelines_file).carriers().items() if name.endswith("_carrier")]
    assert [m.name for m in carrier.members] == [m.name for m in members]
    producer = RecordedProducer(servers)
    expected_dead: dict[str, dict] = {m.name: {} for m in members}
    airflow.wait_for_dag(carrier.dag_id)
    airflow.set_paused(carrier.dag_id, False)
    try:
        for round_ in range(2):
            for member in members:
                producer.send(member.topics[0], [good_value(1000 * round_ + i) for i in range(200)])
                value, reason = BAD_VALUES[round_]
                expected_dead[member.name][producer.send(member.topics[0], [value])[0]] = reason
            # The first ring waits for the DAG's next parse after the unpause (its watcher is registered then).
            airflow.wait_for_runs(carrier.dag_id, "asset_triggered", count=round_ + 1, timeout=120)
            airflow.wait_until_idle(carrier.dag_id, timeout=300)
        runs = airflow.runs(carrier.dag_id)
        assert_all_succeeded(airflow, carrier.dag_id, runs)
        assert {r["run_type"] for r in runs} == {"asset_triggered"} and len(runs) == 2
    finally:
        airflow.set_paused(carrier.dag_id, True)
    for member in members:
        assert_exactly_once(dsn, servers, member, expected_dead[member.name])
        with ledger.transaction(LedgerDatabase(dsn)) as cur:
            batches = ledger.list_batches(cur, member.name)
            assert {(b.requested_by, b.dag_id) for b in batches} == {(f"carrier {carrier.name}", carrier.dag_id)}
            assert ledger.carrying_run(cur, member.name) is None, "a carrier's lease outlived its run"
        assert committed_group_offsets(servers, member.topics[0]) == {}


def test_a_doorbell_run_carries_batch_after_batch_and_clearing_it_replays_them_all(
    airflow: AirflowClient, dsn: str, servers: str, pipeline_factory
):
    """While records keep coming, a run the doorbell started plans, reads and commits batch after batch (each its
    own in the ledger, planned before it is read), keeps its doorbell quiet, and ends when its budget is spent;
    clearing it in Airflow replays every batch it carried, as one batch of their joined ranges."""
    pipeline = pipeline_factory("doorbell_carry", partitions=2)
    topic, name = pipeline.topics[0], pipeline.name
    producer = RecordedProducer(servers)
    expected_dead = {}
    airflow.wait_for_dag(pipeline.dag_id)
    airflow.set_paused(pipeline.dag_id, False)
    try:
        # The first ring waits for the DAG's next parse after the unpause (its watcher is registered then).
        producer.send(topic, [good_value(i) for i in range(40)])
        airflow.wait_for_runs(pipeline.dag_id, "asset_triggered", count=1, timeout=120)
        def most_carried() -> int:
            with ledger.transaction(LedgerDatabase(dsn)) as cur:
                return max(Counter(b.run_id for b in ledger.list_batches(cur, name, limit=1000)
                                   if b.kind == "catch_up" and b.status == "committed").values(), default=0)

        # Then 40 records every half second for 20 s at least (longer than one run's budget, 12 s), and on until a
        # run has carried three batches (for at most a minute): a run's first batch on a busy machine can take most
        # of its budget (CI at e31bf12: one run, two batches).
        tick = 0
        while tick < 40 or (tick < 120 and most_carried() < 3):
            tick += 1
            producer.send(topic, [good_value(40 * tick + i) for i in range(40)])
            if tick == 20:
                value, reason = BAD_VALUES[0]
                expected_dead[producer.send(topic, [value])[0]] = reason
            time.sleep(0.5)
        produced = (tick + 1) * 40 + 1

        def caught_up() -> bool:
            with ledger.transaction(LedgerDatabase(dsn)) as cur:
                return sum(ledger.positions(cur, name).values()) >= produced

        deadline = time.monotonic() + 300
        while not caught_up():
            assert time.monotonic() < deadline, airflow.describe_runs(pipeline.dag_id, airflow.runs(pipeline.dag_id))
            time.sleep(1)
        runs = airflow.wait_until_idle(pipeline.dag_id, timeout=300)
    except BaseException:
        airflow.set_paused(pipeline.dag_id, True)
        raise
    assert_all_succeeded(airflow, pipeline.dag_id, runs)
    assert {r["run_type"] for r in runs} == {"asset_triggered"}
    assert_exactly_once(dsn, servers, pipeline, expected_dead)
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        catch_ups = [b for b in ledger.list_batches(cur, name, limit=1000) if b.kind == "catch_up"]
        assert ledger.carrying_run(cur, name) is None, "a run's carrying lease outlived it"
    by_run: dict[str, list[ledger.Batch]] = {}
    for batch in sorted(catch_ups, key=lambda b: b.batch_id):
        by_run.setdefault(batch.run_id, []).append(batch)
    print(f"{len(runs)} doorbell runs carried {sorted(len(b) for b in by_run.values())} batches")
    assert {b.requested_by for b in catch_ups} == {"doorbell"}
    assert set(by_run) <= {r["dag_run_id"] for r in runs}
    # Runs carried several batches each: fewer runs than batches, and no run queued behind a carrying one for
    # nothing (every run committed a batch).
    assert max(len(b) for b in by_run.values()) >= 3 and len(by_run) < len(catch_ups)
    assert len(by_run) == len(runs), airflow.describe_runs(pipeline.dag_id, runs)
    # A run's batches follow one another: each partition's next range starts where its last one ended.
    for batches_of_run in by_run.values():
        joined, gaps = join_consecutive(b.ranges for b in batches_of_run)
        assert not gaps, gaps

    # Clearing the run that carried the most batches replays all of them, positions untouched.
    run_id, carried = max(by_run.items(), key=lambda item: len(item[1]))
    joined, _ = join_consecutive(b.ranges for b in carried)
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        positions_before = ledger.positions(cur, name)
    published_before = output_batches(dsn, pipeline)
    try:  # the DAG still unpaused: a cleared run of a paused DAG waits
        airflow.request("POST", f"/api/v2/dags/{pipeline.dag_id}/clearTaskInstances",
                        json={"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True})
        final = airflow.wait_for_run(pipeline.dag_id, run_id, timeout=600)
    finally:
        airflow.set_paused(pipeline.dag_id, True)
    assert final["state"] == "success", airflow.describe_run(pipeline.dag_id, run_id)
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        (replay,) = [b for b in ledger.list_batches(cur, name, limit=1000) if b.kind == "replay"]
        assert ledger.positions(cur, name) == positions_before, "clearing a run moved the positions"
    assert (replay.run_id, replay.status, replay.replay_of) == (run_id, "committed", carried[0].batch_id)
    assert replay.ranges == joined
    for record, (_, batch_id) in output_batches(dsn, pipeline).items():
        inside = any(r.topic == record[0] and r.partition == record[1] and r.from_offset <= record[2] < r.until_offset
                     for r in joined)
        assert batch_id == (replay.batch_id if inside else published_before[record][1]), record
    assert_exactly_once(dsn, servers, pipeline, expected_dead)


# --- the Kafka Ledger page (plugins/kafka_ledger_plugin.py) ----------------------------------------------------

PAGE = "/kafka-ledger"


def test_the_ledger_page_and_its_api_answer_only_behind_airflow_authentication(
    airflow: AirflowClient, rest: RestCase, dsn: str, servers: str
):
    ensure_caught_up(airflow, rest, dsn, servers)
    name = rest.pipeline.name
    with httpx.Client(base_url=str(airflow.http.base_url), timeout=30) as anonymous:
        for method, path, headers in [
            ("GET", f"{PAGE}/api/pipelines", {}),
            ("GET", f"{PAGE}/api/pipelines", {"Authorization": "Bearer forged"}),
            ("GET", f"{PAGE}/", {}),
            ("GET", f"{PAGE}/pipelines/{name}", {}),
            ("GET", f"{PAGE}/pipelines/{name}/batches/1", {}),
            ("POST", f"{PAGE}/pipelines/{name}/verify", {}),
        ]:
            response = anonymous.request(method, path, headers=headers)
            assert response.status_code in (401, 403), f"{method} {path}: {response.status_code} {response.text[:300]}"
            assert name not in response.text
    plugins = airflow.request("GET", "/api/v2/plugins").json()["plugins"]
    (ours,) = [p for p in plugins if p["name"] == "kafka_ledger"]
    assert {v["destination"] for v in ours["external_views"]} == {"nav", "dag"}

    # The API: every pipeline with its partitions, positions and lag, as Kafka and the ledger say.
    (entry,) = [e for e in airflow.request("GET", f"{PAGE}/api/pipelines").json() if e["pipeline"] == name]
    ends = kafka_offsets.partition_offsets(kafka_for(servers), rest.pipeline.topics)
    assert {(p["topic"], p["partition"]): (p["position"], p["end_offset"], p["lag"]) for p in entry["partitions"]} \
        == {(tp.topic, tp.partition): (o.end, o.end, 0) for tp, o in ends.items()}
    assert entry["lag"] == 0 and entry["dag_id"] == rest.dag_id and entry["kafka_error"] is None
    # Freshness: each partition's newest published record, as the output table holds it; caught up, no lag in time.
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT kafka_partition, max(kafka_timestamp) FROM {} GROUP BY kafka_partition").format(
            sql.Identifier(rest.pipeline.output_schema, rest.pipeline.output_table)))
        newest = {partition: at for partition, at in cur.fetchall()}
    conn.close()
    assert {p["partition"]: datetime.fromisoformat(p["newest_published_at"]) for p in entry["partitions"]} == newest
    assert {p["lag_seconds"] for p in entry["partitions"]} == {0.0} and entry["lag_seconds"] == 0.0

    detail = airflow.request("GET", f"{PAGE}/api/pipelines/{name}").json()
    newest_first = [batch_id for batch_id, _ in reversed(batch_rows(dsn, rest.pipeline))]
    assert [b["batch_id"] for b in detail["batches"]] == newest_first[:20]
    groups = {g["reason"]: g for g in detail["dead_letters"]}
    assert {reason: g["count"] for reason, g in groups.items()} == Counter(rest.expected_dead.values())
    assert {(s["topic"], s["partition"], s["offset"]): reason
            for reason, g in groups.items() for s in g["samples"]} == rest.expected_dead

    # The pipeline's page: a row per partition, the charts, dead letters shown escaped.
    page = airflow.request("GET", f"{PAGE}/pipelines/{name}").text
    assert {(r[0], r[1], r[2], r[5]) for r in html_table(page, "partitions")[1:]} \
        == {(tp.topic, str(tp.partition), str(o.end), "0") for tp, o in ends.items()}
    assert page.count('<svg class="chart"') == 2
    dead_cells = " ".join(cell for row in html_table(page, "dead-letters")[1:] for cell in row)
    malformed = BAD_VALUES[0][0].decode()
    assert malformed in dead_cells and malformed not in page, "a dead letter's value is not shown escaped"

    # A batch's page: its exact ranges (the "Input Metadata"), and its Airflow run linked.
    batch = next(b for b in detail["batches"] if b["kind"] == "catch_up" and b["run_id"])
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        recorded = ledger.get_batch(cur, batch["batch_id"]).ranges
    conn.close()
    html = airflow.request("GET", f"{PAGE}/pipelines/{name}/batches/{batch['batch_id']}").text
    rows = html_table(html, "ranges")
    assert rows[0][:5] == ["Topic", "Partition", "From", "Until", "Offsets"]
    assert {tuple(r[:4]) for r in rows[1:]} \
        == {(r.topic, str(r.partition), str(r.from_offset), str(r.until_offset)) for r in recorded}
    assert f"../dags/{rest.dag_id}/runs/{quote(batch['run_id'])}" in html

    # The DAG's tab lands on its pipeline's page; verify runs on demand.
    moved = airflow.request("GET", f"{PAGE}/dags/{rest.dag_id}", expect=(303,))
    assert moved.headers["location"] == f"../pipelines/{name}"
    verified = airflow.request("POST", f"{PAGE}/pipelines/{name}/verify", timeout=300).text
    (result,) = [line for line in verified.splitlines() if "missing" in line and "duplicates" in line]
    assert "missing 0, duplicates 0, unexpected 0" in result and 'class="ok"' in verified, verified[-3000:]


def test_the_ledger_page_in_a_real_browser(airflow: AirflowClient, rest: RestCase, dsn: str, servers: str):
    """Headless Chromium logs in to Airflow, opens Browse > Kafka Ledger and follows its links; screenshots kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    def cells(table: Any) -> list[list[str]]:
        """The data rows of a rendered table, as the text of their cells."""
        return [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                for tr in table.find_elements(By.TAG_NAME, "tr")][1:]

    ensure_caught_up(airflow, rest, dsn, servers)
    settings = airflow_test_settings()
    artifacts = Path(os.environ["KL_STATE"]) / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and chromedriver, "chromium and chromedriver are missing: run `scripts/stack.sh browser`"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1500,1300"):
        options.add_argument(argument)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not try to download a driver: Debian's is given
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    wait = WebDriverWait(driver, 60)
    try:
        driver.get(f"{settings.base_url}/")
        wait.until(shown.visibility_of_element_located((By.NAME, "username"))).send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys(admin_password(settings))
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda d: d.get_cookie("_token") is not None)

        # The page as a user finds it: inside the Airflow UI (Browse > Kafka Ledger), in the plugin's iframe.
        driver.get(f"{settings.base_url}/plugin/kafka-ledger")
        wait.until(shown.frame_to_be_available_and_switch_to_it((By.CSS_SELECTOR, "iframe[title='Kafka Ledger']")))
        wait.until(shown.element_to_be_clickable((By.LINK_TEXT, rest.pipeline.name))).click()
        partitions = cells(wait.until(shown.visibility_of_element_located((By.ID, "partitions"))))
        ends = kafka_offsets.partition_offsets(kafka_for(servers), rest.pipeline.topics)
        assert {tuple(row[:3]) for row in partitions} \
            == {(tp.topic, str(tp.partition), str(o.end)) for tp, o in ends.items()}
        driver.switch_to.default_content()
        driver.save_screenshot(str(artifacts / "kafka-ledger-pipeline.png"))

        driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, "iframe[title='Kafka Ledger']"))
        batch_link = driver.find_element(By.CSS_SELECTOR, "#batches tr:nth-child(2) a")
        batch_id = int(batch_link.text)
        batch_link.click()
        ranges = cells(wait.until(shown.visibility_of_element_located((By.ID, "ranges"))))
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            recorded = ledger.get_batch(cur, batch_id).ranges
        conn.close()
        assert {tuple(row[:5]) for row in ranges} \
            == {(r.topic, str(r.partition), str(r.from_offset), str(r.until_offset), str(r.span)) for r in recorded}
        driver.switch_to.default_content()
        driver.save_screenshot(str(artifacts / "kafka-ledger-batch.png"))
        print(f"screenshots: {artifacts}/kafka-ledger-pipeline.png, kafka-ledger-batch.png")
    finally:
        driver.quit()


def test_kafkas_own_consumer_groups_tool_shows_the_mirrored_positions_and_lag(
    airflow: AirflowClient, rest: RestCase, dsn: str, servers: str
):
    """The pipeline's commits (under the scheduler) mirror its positions into its consumer group."""
    ensure_caught_up(airflow, rest, dsn, servers)
    group = rest.pipeline.mirror_consumer_group
    tool = subprocess.run(
        [str(Path(sys.executable).parent / "kafka-ledger"), "kafka", "consumer-groups", "--describe", "--group", group],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert tool.returncode == 0, tool.stderr
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
    described = {(row[1], int(row[2])): (int(row[3]), int(row[4]), int(row[5]))
                 for row in (line.split() for line in tool.stdout.splitlines()) if row and row[0] == group}
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        positions = ledger.positions(cur, rest.pipeline.name)
    conn.close()
    ends = kafka_offsets.partition_offsets(kafka_for(servers), rest.pipeline.topics)
    assert described == {(tp.topic, tp.partition): (position, ends[tp].end, 0) for tp, position in positions.items()}, \
        tool.stdout


def test_a_downstream_dag_runs_after_a_commit_and_reads_the_batch_from_the_asset_event(
    airflow: AirflowClient, rest: RestCase, dsn: str, servers: str
):
    """tests/integration/dags/downstream_of_rest.py is scheduled on the pipeline's output asset."""
    ensure_caught_up(airflow, rest, dsn, servers)
    downstream = f"downstream_of_{rest.pipeline.name}"
    airflow.wait_for_dag(downstream)
    airflow.set_paused(downstream, False)
    seen_before = {r["dag_run_id"] for r in airflow.runs(downstream)}

    produce_timed(servers, rest.pipeline.topics[0], [(1, datetime.now(UTC), good_value(91_000 + i)) for i in range(3)])
    run = airflow.trigger(rest.dag_id, {"mode": "catch_up", "reason": "asset test"})
    assert airflow.wait_for_run(rest.dag_id, run["dag_run_id"])["state"] == "success"
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %s AND run_id = %s",
                    (rest.pipeline.name, run["dag_run_id"]))
        (batch_id,) = [row[0] for row in cur.fetchall()]
        batch = ledger.get_batch(cur, batch_id)
    conn.close()

    def announcements() -> list[dict] | None:
        """The asset event extras seen by finished downstream runs since unpausing, once one is this batch's."""
        finished = [r for r in airflow.runs(downstream)
                    if r["dag_run_id"] not in seen_before and r["state"] in ("success", "failed")]
        assert all(r["run_type"] == "asset_triggered" and r["state"] == "success" for r in finished), finished
        extras = []
        for r in finished:
            value = airflow.request("GET", f"/api/v2/dags/{downstream}/dagRuns/{r['dag_run_id']}/taskInstances/"
                                           "triggering_events/xcomEntries/return_value").json()["value"]
            extras += json.loads(value) if isinstance(value, str) else value
        return extras if any(e["batch_id"] == batch_id for e in extras) else None

    extras = airflow._poll(f"a run of {downstream} triggered by batch {batch_id}", announcements, 300)
    (announced,) = [e for e in extras if e["batch_id"] == batch_id]
    assert announced["pipeline"] == rest.pipeline.name and announced["kind"] == "catch_up"
    assert announced["ranges"] == [{"topic": r.topic, "partition": r.partition, "from": r.from_offset,
                                    "until": r.until_offset} for r in batch.ranges]
    assert (announced["records_written"], announced["records_dead_lettered"]) == (
        batch.records_written, batch.records_dead_lettered) == (3, 0)
    airflow.set_paused(downstream, True)


# --- the doorbell's faults (last: they kill this module's triggerer and scheduler, which airflow.sh restarts) ------


@pytest.mark.parametrize("key", ["doorbell_faults", pytest.param("carried_faults", marks=pytest.mark.long)])
def test_the_doorbell_loses_and_doubles_nothing_when_its_triggerer_and_scheduler_are_killed(
    airflow: AirflowClient, dsn: str, servers: str, pipeline_factory, tmp_path: Path, key: str
):
    """The doorbell's short fault campaign: each fault and variant (tools/fault_campaign/doorbell.py) under the real
    scheduler and triggerer, runs carrying batches while the records come, the full campaign's checks after each and
    the record-by-record check at the end; of a pipeline's own doorbell, and of a carrier's (carried_faults: its DAG,
    doorbell and task take the faults). Not the Spark Connect server's restart: the other tests on this stack use
    it (the full doorbell campaign, on a stack of its own, restarts it).

    The pipeline's own campaign is interrupted after its third iteration, the last lines of its journal lost, and
    resumed as a full campaign too long for one working session is (`--resume`): those records are read back from
    Kafka, and the resumed campaign's checks cover them."""
    pipeline = pipeline_factory(key, partitions=4)
    seed = int(os.environ.get("KAFKA_LEDGER_CAMPAIGN_SEED", "4"))
    faults = len(AIRFLOW_STRIKES)
    campaign = DoorbellCampaign(pipeline, dsn, servers, seed=seed, faults=faults, records_per_fault=1000,
                                workdir=tmp_path, airflow=airflow, strikes=AIRFLOW_STRIKES)
    interrupted = key == "doorbell_faults"
    if interrupted:
        class Interrupted(Exception):
            pass

        def progress(line: str) -> None:
            print(line)
            if line.startswith("[3/"):
                raise Interrupted

        with pytest.raises(Interrupted):
            campaign.run_all(progress=progress)
        journal = tmp_path / "landed.tsv"
        lines = journal.read_text().splitlines(keepends=True)
        journal.write_text("".join(lines[:-20]) + lines[-20][:3])  # cut mid-line too
        campaign = DoorbellCampaign.resume_under(airflow, pipeline, dsn, servers, tmp_path)
        assert [it.index for it in campaign.iterations] == [1, 2, 3]
    report = campaign.run_all()  # raises CampaignFailure on the first failed check

    print(json.dumps({k: v for k, v in report.items() if k != "iterations"}))
    assert report["sessions"] == (2 if interrupted else 1)
    assert report["faults_by_kind"] == {"kill_triggerer_mid_poll": 2, "kill_scheduler_with_run_queued": 2,
                                        "kill_task_mid_carry": 2}
    assert report["fault_variants"] == {
        "kill_triggerer_mid_poll": {"mid-poll": 1, "frozen as the records began": 1},
        "kill_scheduler_with_run_queued": {"ring queued while the scheduler was frozen": 1, "run created": 1},
        "kill_task_mid_carry": {"in a carried batch": 1, "between batches": 1}}
    assert (report["lost"], report["duplicated"], report["unexpected"], report["wrong_content"]) == (0, 0, 0, 0)
    # Each iteration's 1,000, and more while a carrying strike waits for its moment (the records keep coming).
    assert report["records_produced"] >= 10 + faults * 1000
    assert report["output_rows"] + report["dead_letters"] == report["records_produced"]
    assert report["verify_ok"]
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        assert {b.requested_by for b in ledger.list_batches(cur, pipeline.name)} == {
            f"carrier {pipeline.carrier}" if pipeline.carrier else "doorbell"}
    assert committed_group_offsets(servers, pipeline.topics[0]) == {}
