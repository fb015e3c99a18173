"""Change data capture with the real Debezium: its PostgreSQL connector on the stack's Kafka Connect worker captures
a source table in the stack's Postgres; the pipeline (`envelope: debezium`) makes its entity table equal the source
table row by row, through snapshots, inserts, updates, deletes, re-inserts and key changes, a replay and a backfill
over them and more changes after, a column added to the source table while it runs; both runtimes, REPLICA IDENTITY
DEFAULT and FULL, with and without the JsonConverter's wrapper."""

from __future__ import annotations

import contextlib
import os
import random
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import yaml
from integration_support import (
    CDC_COLUMNS,
    batches,
    cli,
    drain,
    pipeline_name,
    positions_equal_end_offsets,
    query,
    topic_name,
)

from kafka_ledger.batch.plan import plan_batch
from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.config.settings import services_for
from kafka_ledger.runtimes import run_batch
from tools import cdc

# On a stack of its own (the own-stacks lane): it starts that stack's Kafka Connect worker, a JVM the shared lane
# need not carry.
pytestmark = [pytest.mark.integration, pytest.mark.own_stack]


@pytest.fixture(scope="module")
def kafka_connect():
    cdc.start_worker()


def _entity_rows(dsn: str, pipeline, columns: tuple[str, ...] = cdc.SOURCE_COLUMNS) -> dict[int, tuple]:
    return {row[0]: tuple(row[1:]) for row in query(
        dsn, f"SELECT {', '.join(columns)} FROM {pipeline.output_schema}.{pipeline.output_table}")}


# REPLICA IDENTITY FULL in the default run (DEFAULT's deletes and unchanged TOASTed values are the type matrix's and
# the TOAST test's); spark-submit's twin in the long lane: the default run's type matrix merges spark-submit's batches
# of Debezium's events, and replays and backfills are planned alike in either runtime.
@pytest.mark.parametrize(("runtime", "identity"), [
    ("connect", "FULL"), pytest.param("submit", "DEFAULT", marks=pytest.mark.long)])
def test_the_entity_table_equals_the_source_table_through_every_kind_of_change(
        kafka_connect, dsn, servers, test_pipelines_file, runtime, identity):
    key = f"cdc_{runtime}"
    pipeline = get_pipeline(pipeline_name(key))
    table = f"customers_{runtime}"
    # The connect runtime's events carry the JsonConverter's {schema, payload} wrapper, the submit runtime's not.
    capture = cdc.Capture(name=pipeline_name(key), topic_prefix=topic_name(key), tables=(f"public.{table}",),
                          value_schemas=runtime == "connect")
    topic = capture.topic(f"public.{table}")
    assert pipeline.topics == [topic]
    declaration = test_pipelines_file.read_text()
    rng = random.Random(20261127)
    source = psycopg2.connect(cdc.source_dsn())
    source.autocommit = True
    cur = source.cursor()
    cdc.create_source_table(cur, table, identity)
    made, next_id = cdc.change_source(cur, table, rng, 40, next_id=1)   # before the connector: its snapshot
    snapshot = len(cdc.source_rows(cur, table))
    started = datetime.now(UTC) - timedelta(seconds=5)
    capture.register()
    try:
        # The source database's password reaches the connector through the worker's config provider: the config the
        # REST API shows holds the reference only.
        shown = capture.shown_config()
        assert shown["database.password"].startswith("${file:")
        # The worker's REST API answers its user only.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{cdc.worker_url()}/connectors/{capture.name}/config", timeout=10)
        assert refused.value.code == 401
        password = os.environ["KL_PG_CDC_PASSWORD"]
        assert password not in str(shown)

        made, next_id = cdc.change_source(cur, table, rng, 120, next_id)
        assert made["delete"] and made["key change"] and made["update"] and made["insert"]
        cdc.wait_for_records(servers, topic, snapshot + cdc.events_of(made))
        drain(dsn, servers, pipeline)
        assert _entity_rows(dsn, pipeline) == cdc.source_rows(cur, table)
        positions_equal_end_offsets(dsn, servers, pipeline)
        assert query(dsn, "SELECT count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s", pipeline.name) == [(0,)]
        ops = dict(query(dsn, f"SELECT op, count(*) FROM {pipeline.output_schema}.{pipeline.output_table} GROUP BY op"))
        assert set(ops) <= {"r", "c", "u"} and ops.get("u")  # a row's op is its newest event's (no delete)
        assert query(dsn, f"SELECT count(*) FROM {pipeline.output_schema}.{pipeline.output_table} "
                          "WHERE source_lsn IS NULL") == [(0,)]

        # A replay of every range read so far: older events never move an entity back, deletes stay deletes.
        positions = query(dsn, "SELECT partition, position FROM kafka_ledger.positions WHERE pipeline = %s",
                          pipeline.name)
        code, data, err = cli("replay", pipeline.name, *[f"--range={topic}:{p}:0:{end}" for p, end in positions],
                              "--reason", "replay over deletes")
        assert code == 0, (data, err)
        assert batches(dsn, pipeline)[-1].kind == "offset_ranges"
        assert _entity_rows(dsn, pipeline) == cdc.source_rows(cur, table)
        # An Airflow backfill of the minutes the events were written in, as its plan task plans one (its data
        # interval): the same.
        services = services_for(dsn, servers)
        backfill = plan_batch(services, pipeline, dag_id=pipeline.dag_id, run_id=f"backfill__{runtime}",
                              requested_by="backfill", backfill_window=(started, datetime.now(UTC)))
        assert backfill.batch_id is not None
        run_batch(pipeline, backfill.batch_id, services)
        assert batches(dsn, pipeline)[-1].kind == "backfill"
        assert _entity_rows(dsn, pipeline) == cdc.source_rows(cur, table)

        # A column added to the source table while the pipeline runs, and to the declaration: the commit that
        # publishes its first values adds it to the entity table. More changes after the replay too.
        events = snapshot + cdc.events_of(made)
        cur.execute(f"ALTER TABLE {table} ADD COLUMN tier text")
        cur.execute(f"UPDATE {table} SET tier = 'gold' WHERE id % 3 = 0")
        events += cur.rowcount
        made, next_id = cdc.change_source(cur, table, rng, 60, next_id)
        cdc.wait_for_records(servers, topic, events + cdc.events_of(made))
        # In the pipelines file: spark-submit's job reads its pipeline from there.
        entries = yaml.safe_load(test_pipelines_file.read_text())
        entries["pipelines"][pipeline.name]["columns"] = [*CDC_COLUMNS, {"name": "tier", "type": "string"}]
        test_pipelines_file.write_text(yaml.safe_dump(entries))
        with_tier = get_pipeline(pipeline.name)
        drain(dsn, servers, with_tier)
        columns = (*cdc.SOURCE_COLUMNS, "tier")
        rows = cdc.source_rows(cur, table, columns)
        assert _entity_rows(dsn, with_tier, columns) == rows
        assert {tier for *_, tier in rows.values()} == {"gold", None}
        assert all(isinstance(balance, Decimal) for _, _, balance, _, _ in rows.values())
    finally:
        test_pipelines_file.write_text(declaration)
        capture.remove()
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        source.close()
    log = (Path(os.environ["KL_STATE"]) / "logs" / "kafka-connect.log").read_text()
    assert password not in log


@contextlib.contextmanager
def _captured(key: str, table: str, create: Callable[[Any, str], None], **capture: Any
              ) -> Iterator[tuple[Any, cdc.Capture, str, Any]]:
    """The test pipeline `key`, its source table `table` made by `create` in the source database, and Debezium's
    connector of it (registered by the test, after the changes its snapshot should hold): (pipeline, the capture, its
    topic, a cursor on the source database). Both are gone afterwards."""
    pipeline = get_pipeline(pipeline_name(key))
    connector = cdc.Capture(name=pipeline_name(key), topic_prefix=topic_name(key), tables=(f"public.{table}",),
                            **capture)
    source = psycopg2.connect(cdc.source_dsn())
    source.autocommit = True
    cur = source.cursor()
    create(cur, table)
    try:
        yield pipeline, connector, connector.topic(f"public.{table}"), cur
    finally:
        connector.remove()
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        source.close()


def _toasted_entities(dsn: str, pipeline) -> dict[int, tuple]:
    return {row[0]: tuple(row[1:]) for row in query(
        dsn, f"SELECT {', '.join(cdc.TOASTED_COLUMNS)} FROM {pipeline.output_schema}.{pipeline.output_table}")}


def _change_tables_rows(dsn: str, pipeline) -> tuple[int, int]:
    """(moved rows, parked rows) the entity table keeps for its primary-key changes."""
    return tuple(query(dsn, f'SELECT count(*) FROM kafka_ledger_tombstones."{pipeline.name}${table}"')[0][0]
                 for table in ("moved", "parked"))


def test_an_unchanged_toasted_value_keeps_the_entitys_value_never_the_placeholder(kafka_connect, dsn, servers):
    """Updates that leave TOASTed text, jsonb, array and bytea values unchanged (REPLICA IDENTITY DEFAULT: Debezium
    sends its placeholder for them), primary-key changes (the new key's create holds placeholders too; its delete of
    the old key is in another partition, read by batches of 9 records a partition at their own pace), deletes:
    the entity table equals the source table, no dead letter, no placeholder; then after a replay of every range,
    and after more changes. In the connect runtime: spark-submit's batches hold the same events (the type matrix's
    unchanged TOASTed note) and their merge is the same SQL."""
    table = "toasted"
    rng = random.Random(20261129)
    with _captured("toast", table, cdc.create_toasted_table, value_schemas=True) as (
            pipeline, capture, topic, cur):
        made, next_id = cdc.change_toasted_source(cur, table, rng, 15, next_id=1)
        events = len(cdc.toasted_rows(cur, table))
        capture.register()
        for _ in range(2):
            made, next_id = cdc.change_toasted_source(cur, table, rng, 120, next_id)
            assert made["key change"] and made["update"] and made["delete"]
            events += cdc.events_of(made)
            cdc.wait_for_records(servers, topic, events)
            drain(dsn, servers, pipeline)
            assert _toasted_entities(dsn, pipeline) == cdc.toasted_rows(cur, table)
            assert query(dsn, "SELECT count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s",
                         pipeline.name) == [(0,)]
            # Nothing waits once every event is read; the moved rows of creates read already are forgotten.
            moved, parked = _change_tables_rows(dsn, pipeline)
            assert parked == 0 and moved <= made["key change"]

        # The placeholder was there to be kept from: Debezium sent it, in every column's form.
        placeholders = query(dsn, f"SELECT count(*) FROM {pipeline.output_schema}.{pipeline.output_table} WHERE "
                                  "note LIKE '%%unavailable_value%%' OR doc LIKE '%%unavailable_value%%' "
                                  "OR tags::text LIKE '%%unavailable_value%%' OR raw = 'X19kZWJleml1bV91bmF2YWlsYWJsZV"
                                  "92YWx1ZQ=='")
        assert placeholders == [(0,)]
        sent = cdc.records_with(servers, topic, b"__debezium_unavailable_value")
        assert sent > 20

        # A replay of every range read so far: the same rows, still no dead letter (older events of an entity that
        # holds newer ones change nothing, whatever they lack).
        positions = query(dsn, "SELECT partition, position FROM kafka_ledger.positions WHERE pipeline = %s",
                          pipeline.name)
        code, data, err = cli("replay", pipeline.name, *[f"--range={topic}:{p}:0:{end}" for p, end in positions],
                              "--reason", "replay over unchanged TOASTed values")
        assert code == 0, (data, err)
        assert _toasted_entities(dsn, pipeline) == cdc.toasted_rows(cur, table)
        assert query(dsn, "SELECT count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s",
                     pipeline.name) == [(0,)]


# Each value shape in one runtime in the default run, in the other in the long lane (the merge is the same SQL).
@pytest.mark.parametrize(("shape", "runtime"), [
    ("schemas", "connect"), ("plain", "submit"), ("avro", "connect"),
    *(pytest.param(shape, runtime, marks=pytest.mark.long)
      for shape, runtime in (("schemas", "submit"), ("plain", "connect"), ("avro", "submit"),
                             ("alternatives", "connect")))])
def test_every_everyday_type_lands_as_the_source_had_it(kafka_connect, dsn, servers, shape, runtime):
    """A source table of PostgreSQL's everyday types (json and jsonb, date, timestamps with and without a zone and of
    three precisions, times, numerics fixed and unconstrained, money, bytea, uuid, an enum, arrays, real, smallint,
    char, inet, intervals, a TOASTed text its updates often leave unchanged), each column declared as the source's,
    captured by Debezium through inserts, updates, deletes and key changes, with its defaults and the JsonConverter's
    (schemas, precise numerics), without schemas (numerics as text), or as Avro through the registry (Apicurio's
    AvroConverter: logical types and Connect's names), in either runtime, and with its common alternatives (numerics
    as text, times in microseconds, bytea in hex; the long lane); intervals as ISO-8601 text (its numeric
    default counts a month as 30.4375 days): the entity table equals the source table value by value, no dead
    letter."""
    table = f"typed_{shape}_{runtime}"
    defaults = shape != "plain"  # Debezium's and the JsonConverter's own defaults: schemas, precise numerics
    rng = random.Random(20261130)
    alternatives = {"decimal_handling_mode": "string", "time_precision_mode": "adaptive_time_microseconds",
                    "binary_handling_mode": "hex"} if shape == "alternatives" else {}
    with _captured(f"typed_{shape}_{runtime}", table, cdc.create_typed_table, value_schemas=defaults,
                   **{"decimal_handling_mode": "precise" if defaults else "string", **alternatives},
                   interval_handling_mode="string",
                   value_format="avro" if shape == "avro" else "json") as (pipeline, capture, topic, cur):
        made, next_id = cdc.change_typed_source(cur, table, rng, 20, next_id=1)
        events = len(cdc.typed_rows(cur, table))
        capture.register()
        made, next_id = cdc.change_typed_source(cur, table, rng, 150, next_id)
        assert made["key change"] and made["update"] and made["delete"]
        events += cdc.events_of(made)
        cdc.wait_for_records(servers, topic, events)
        drain(dsn, servers, pipeline)
        assert query(dsn, "SELECT kafka_offset, error FROM kafka_ledger.dead_letters WHERE pipeline = %s",
                     pipeline.name) == []
        # Updates that left the TOASTed note unchanged sent Debezium's placeholder, which the comparison below
        # finds nowhere.
        assert cdc.records_with(servers, topic, b"__debezium_unavailable_value") > 0
        with psycopg2.connect(dsn) as out, out.cursor() as entity:
            landed = cdc.typed_rows(entity, f"{pipeline.output_schema}.{pipeline.output_table}", cdc.ENTITY_SELECT)
        out.close()
        expected = cdc.typed_rows(cur, table)
        assert landed.keys() == expected.keys()
        names = cdc.TYPED_COLUMNS[1:]
        assert {(k, name): (got, want) for k in landed for name, got, want in zip(names, landed[k], expected[k],
                                                                                   strict=True) if got != want} == {}
        # Every column lands as the source's type.
        types = dict(query(dsn, "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = "
                                "%s AND table_name = %s", pipeline.output_schema, pipeline.output_table))
        assert {name: types[name] for name in ("ts0", "ts6", "tstz", "t3", "u", "b", "jb", "n", "iv")} == {
            "ts0": "timestamp without time zone", "ts6": "timestamp without time zone",
            "tstz": "timestamp with time zone", "t3": "time without time zone", "u": "uuid", "b": "bytea",
            "jb": "jsonb", "n": "numeric", "iv": "interval"}


def test_columns_left_out_are_taken_from_the_jsonconverters_schema(kafka_connect, dsn, servers):
    """A pipeline of Debezium's events written with its defaults (the JsonConverter's schemas, precise numerics;
    intervals as text) that leaves `columns:` out: its first plan takes them from the newest event's schema, types
    included (a date, timestamps and times of their precision, numerics of their precision and scale, uuid, jsonb,
    an array, an interval, bytea, an enum; NOT NULL fields required), `kafka-ledger columns --topic` prints the same,
    and the entity table equals the source table value by value; a column added to the source table becomes a column
    of the entity table with the next batch that reads it."""
    table = "derived"
    rng = random.Random(20261201)
    with _captured("derived", table, cdc.create_derived_table, value_schemas=True, decimal_handling_mode="precise",
                   interval_handling_mode="string") as (pipeline, capture, topic, cur):
        made, next_id = cdc.change_derived_source(cur, table, rng, 20, next_id=1)
        events = len(cdc.derived_rows(cur, table, source=True))
        capture.register()
        made, next_id = cdc.change_derived_source(cur, table, rng, 60, next_id)
        events += cdc.events_of(made)
        cdc.wait_for_records(servers, topic, events)
        code, printed, err = cli("columns", "--topic", topic)
        assert code == 0, err
        assert printed["columns"] == cdc.DERIVED_COLUMNS
        drain(dsn, servers, pipeline)
        [(recorded,)] = query(dsn, "SELECT columns FROM kafka_ledger.pipeline_columns WHERE pipeline = %s",
                              pipeline.name)
        assert recorded == cdc.DERIVED_COLUMNS
        entity = f"{pipeline.output_schema}.{pipeline.output_table}"
        with psycopg2.connect(dsn) as out, out.cursor() as entity_cur:
            assert cdc.derived_rows(entity_cur, entity, source=False) == cdc.derived_rows(cur, table, source=True)
        out.close()
        assert query(dsn, "SELECT count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s", pipeline.name) == [
            (0,)]

        # A column added at the source: Debezium's next events carry it in their schema.
        cur.execute(f"ALTER TABLE {table} ADD COLUMN seen_on date")
        cur.execute(f"UPDATE {table} SET seen_on = DATE '2026-11-29' WHERE id IN (SELECT id FROM {table} LIMIT 3)")
        cdc.wait_for_records(servers, topic, events + 3)
        drain(dsn, servers, pipeline)
        assert query(dsn, f"SELECT count(*) FROM {entity} WHERE seen_on = DATE '2026-11-29'") == [(3,)]
