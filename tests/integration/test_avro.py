"""Avro values on the real Spark and the stack's schema registry: written by Confluent's own AvroSerializer, decoded by
kafka-ledger with the batch's reader schema, every value published exactly or dead-lettered with its reason."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from integration_support import AVRO_COLUMNS, lean_decoded, published_rows

from kafka_ledger.config import settings
from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.formats.base import SchemaPin

pytestmark = pytest.mark.integration

ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"], "default": None}]}
V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "quantity", "type": "int"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 4}},
    {"name": "ordered_on", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "address", "type": ADDRESS},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "total", "type": "long"},
    {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    {"name": "attachment", "type": ["null", "bytes"], "default": None},
]}
# Version 2 adds a field with a default: values written with version 1 read it as its default.
V2 = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
# A writer the reader cannot read: quantity became a string.
INCOMPATIBLE = {**V1, "fields": [{"name": "quantity", "type": "string"} if f["name"] == "quantity" else f
                                 for f in V1["fields"]]}


def order(i: int, **changes) -> dict:
    return {"order_id": f"o{i}", "quantity": i, "amount": Decimal(f"{i}.5"), "ordered_on": date(2026, 11, 26),
            "at": datetime(2026, 11, 27, 10, 0, i, tzinfo=UTC), "address": {"city": "Lyon", "zip": None},
            "status": "PAID", "tags": ["a", "b"], "total": i * 100, "digest": digest(i),
            "attachment": b"\x00\xff" * (i % 3) or None, **changes}


def digest(i: int) -> bytes:
    """Four bytes that are not UTF-8 text (a NUL, an 0xff)."""
    return bytes([0, 0xFF, i % 256, 7])


def serializer(client, schema: dict):
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})


def encode(serialize, subject_topic: str, value: dict) -> bytes:
    from confluent_kafka.serialization import MessageField, SerializationContext

    return serialize(value, SerializationContext(subject_topic, MessageField.VALUE))


def test_values_of_every_version_decode_into_the_reader_schema_and_bad_ones_are_dead_letters(spark):
    from kafka_ledger.formats.avro import AvroFormat, topic_schemas
    from kafka_ledger.formats.framing import NOT_FRAMED
    from kafka_ledger.formats.schema_registry import newest

    client = settings.schema_registry().client()
    topic = f"it-avro-{uuid.uuid4().hex[:8]}"
    subject = f"{topic}-value"
    v1, v2 = serializer(client, V1), serializer(client, V2)
    values: list[tuple[bytes | None, bytes | None, str | None]] = [
        (encode(v1, topic, order(1)), b"c1", None),
        (encode(v2, topic, {**order(2), "channel": "app"}), b"c2", None),
        (encode(v1, topic, order(3, amount=Decimal("1.2345"))), b"c3",
         "field 'amount' is not a valid decimal(10,2) (it does not fit exactly: more than 2 digit(s) after the point "
         "or 8 before it)"),
        (encode(v1, topic, order(4, total=2**40)), b"c4", "field 'total' is not a valid int (out of range)"),
        (b'{"order_id": "json"}', b"c5", NOT_FRAMED),
        (b"\x00" + (999_999).to_bytes(4, "big") + b"\x02", b"c6",
         f"schema id 999999 is not a version of subject {subject}"),
        (encode(v1, topic, order(7))[:9], b"c7", None),  # truncated: the reason names its writer id (below)
        (None, b"c8", "null value (tombstone)"),
    ]
    incompatible = encode(serializer(client, INCOMPATIBLE), topic, {**order(9), "quantity": "nine"})
    values.append((incompatible, b"c9", None))
    v1_id, v2_id, incompatible_id = (int.from_bytes(value[1:5], "big")
                                     for value in (values[0][0], values[1][0], incompatible))
    # The newest version is the incompatible one: as a reader it could read neither version before it.
    assert newest(client, subject) == (incompatible_id, 3)
    assert set(topic_schemas(client, subject, incompatible_id).unreadable) == {v1_id, v2_id}
    # Pinned on version 2, as a plan before the incompatible one came would have.
    schemas = topic_schemas(client, subject, v2_id)
    assert set(schemas.unreadable) == {incompatible_id}

    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": [topic], "output_table": "t", "columns": AVRO_COLUMNS, "value": {"format": "avro"}}}}))["p"]
    records = spark.createDataFrame(
        [(topic, 0, offset, datetime(2026, 11, 27, tzinfo=UTC), key, value, [("trace", trace(offset))])
         for offset, (value, key, _) in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
        "headers array<struct<key: string, value: binary>>")
    fmt = AvroFormat({topic: schemas})
    lean = lean_decoded(records, pipeline, fmt, [c["name"] for c in AVRO_COLUMNS])
    reasons = {offset: row["error"] for offset, row in lean.items()}
    expected = {offset: reason for offset, (_, _, reason) in enumerate(values)}
    expected[6] = f"value does not decode with its writer schema (id {v1_id})"
    expected[8] = (f"the writer schema (id {incompatible_id}) cannot be read with the reader schema (id {v2_id}) of "
                   f"subject {subject}: " + schemas.unreadable[incompatible_id])
    assert reasons == expected
    first = lean[0]
    assert first == {"kafka_offset": 0, "error": None, "order_id": "o1", "quantity": 1, "amount": Decimal("1.50"),
                     "ordered_on": date(2026, 11, 26), "at": first["at"], "city": "Lyon", "zip": None,
                     "status": "PAID", "tags": '["a","b"]', "total": 100, "channel": "web", "customer": "c1",
                     "digest": digest(1), "attachment": b"\x00\xff", "trace": trace(0)}
    assert first["at"].replace(tzinfo=None) == datetime(2026, 11, 27, 10, 0, 1)
    assert lean[1]["channel"] == "app"



def trace(i: int) -> bytes:
    """Record i's `trace` header: bytes that are not UTF-8 text."""
    return b"\x00\xfe" + i.to_bytes(2, "big")


def _produce(servers: str, topic: str, values: list[tuple[bytes | None, bytes]]) -> list[tuple[str, int, int]]:
    from integration_support import RecordedProducer

    landed = RecordedProducer(servers).send(topic, [v for v, _ in values], keys=[k for _, k in values],
                                            headers=[[("trace", trace(i))] for i in range(len(values))])
    return landed


def _published(dsn: str, pipeline) -> dict[tuple[int, int], dict]:
    return published_rows(dsn, pipeline, [c["name"] for c in AVRO_COLUMNS])


# The twins in the long lane: the decode of Avro is the same whichever runtime runs it and whichever sink takes its
# rows (the default run reads Avro in spark-submit without declared columns).
@pytest.mark.parametrize("key", ["avro_connect", pytest.param("avro_submit", marks=pytest.mark.long),
                                 pytest.param("avro_iceberg", marks=pytest.mark.long)])
def test_avro_values_are_published_exactly_and_a_replay_decodes_with_its_batchs_reader(
        dsn, servers, pipeline_factory, key):
    """Versions 1 and 2 written by Confluent's serializer, read into version 2 (the newest at plan time: version 1's
    values get channel's default); a third version registered later changes nothing for a replay of that batch."""
    from integration_support import assert_exactly_once, catch_up

    from kafka_ledger.batch.plan import plan_batch
    from kafka_ledger.batch.requests import BatchRequest
    from kafka_ledger.config.settings import services_for
    from kafka_ledger.formats.schema_registry import newest
    from kafka_ledger.ledger import db as ledger
    from kafka_ledger.runtimes import run_batch

    pipeline = pipeline_factory(key, partitions=2)
    topic = pipeline.topics[0]
    client = settings.schema_registry().client()
    v1, v2 = serializer(client, V1), serializer(client, V2)
    values = [(encode(v1, topic, order(i)), f"c{i}".encode()) for i in range(10)]
    values += [(encode(v2, topic, {**order(i), "channel": "app"}), f"c{i}".encode()) for i in range(10, 20)]
    values += [(encode(v1, topic, order(20, total=2**40)), b"c20"), (b'{"order_id": "json"}', b"c21")]
    landed = _produce(servers, topic, values)
    if key == "avro_connect":  # the server's warm-up reads them with the subject's newest version, as a batch would
        from kafka_ledger.runtimes.connect.warm_up import warm_up

        done = warm_up(1_000, [pipeline], services_for(dsn, servers))
        assert (done.skipped, done.pipeline_records) == ({}, {pipeline.name: len(values)})
    first = catch_up(dsn, servers, pipeline)
    assert_exactly_once(dsn, servers, pipeline, {
        landed[20]: "field 'total' is not a valid int (out of range)",
        landed[21]: "value is not in Confluent's wire format (a magic byte 0 and a 4-byte schema id before the "
                    "payload)"})
    rows = _published(dsn, pipeline)
    assert {landed[i][1:]: rows[landed[i][1:]]["channel"] for i in range(20)} == {
        landed[i][1:]: "web" if i < 10 else "app" for i in range(20)}
    assert rows[landed[3][1:]]["amount"] == Decimal("3.50") and rows[landed[3][1:]]["customer"] == "c3"
    assert {n: bytes(rows[landed[3][1:]][n]) for n in ("digest", "trace")} == {"digest": digest(3), "trace": trace(3)}
    assert (rows[landed[3][1:]]["attachment"], bytes(rows[landed[4][1:]]["attachment"])) == (None, b"\x00\xff")
    services = services_for(dsn, servers)
    with ledger.session(services.ledger) as conn, conn.cursor() as cur:
        pinned = ledger.schema_pins(cur, first.batch_id)
    v2_id = int.from_bytes(values[10][0][1:5], "big")
    assert pinned == {("value", topic): SchemaPin(topic, f"{topic}-value", v2_id, 2, "newest")}

    # Version 3 (a field added with a default, which no column reads): the replay keeps version 2.
    v3 = {**V2, "fields": [*V2["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}]}
    encode(serializer(client, v3), topic, order(30))  # registers it
    replay = plan_batch(services, pipeline, BatchRequest(mode="replay_batch", batch_id=first.batch_id,
                                                         reason="test"))
    run_batch(pipeline, replay.batch_id, services)
    with ledger.session(services.ledger) as conn, conn.cursor() as cur:
        assert ledger.schema_pins(cur, replay.batch_id) == {
            ("value", topic): SchemaPin(topic, f"{topic}-value", v2_id, 2, "pinned")}
    assert _published(dsn, pipeline) == rows
    # Asked for, the newest version instead, recorded so; version 3's new field is read by no column.
    v3_id = newest(client, f"{topic}-value")[0]
    newer = plan_batch(services, pipeline, BatchRequest(mode="replay_batch", batch_id=first.batch_id, reason="test",
                                                        reader_schema="newest"))
    run_batch(pipeline, newer.batch_id, services)
    with ledger.session(services.ledger) as conn, conn.cursor() as cur:
        assert ledger.schema_pins(cur, newer.batch_id) == {
            ("value", topic): SchemaPin(topic, f"{topic}-value", v3_id, 3, "newest")}
    assert _published(dsn, pipeline) == rows


def test_a_reader_schema_that_cannot_fill_the_columns_is_refused_and_nothing_is_planned(
        dsn, servers, pipeline_factory):
    from kafka_ledger.batch.plan import plan_next_batch
    from kafka_ledger.config.settings import services_for
    from kafka_ledger.formats.schema_registry import SchemaRefused
    from kafka_ledger.ledger import db as ledger

    pipeline = pipeline_factory("avro_refused", partitions=1)
    topic = pipeline.topics[0]
    _produce(servers, topic, [(encode(serializer(settings.schema_registry().client(), V2), topic, order(1)), b"c")])
    services = services_for(dsn, servers)
    with pytest.raises(SchemaRefused, match="column coupon: the reader schema has no field coupon"):
        plan_next_batch(services, pipeline)
    with ledger.session(services.ledger) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM kafka_ledger.batches WHERE pipeline = %s", (pipeline.name,))
        assert cur.fetchone()[0] == 0


@pytest.mark.own_stack  # it kills the registry every test shares
def test_a_registry_away_fails_the_plan_or_the_read_writing_nothing_and_the_retry_publishes_exactly(
        dsn, servers, pipeline_factory):
    from integration_support import assert_exactly_once, stack

    from kafka_ledger.batch.plan import plan_next_batch
    from kafka_ledger.config.settings import services_for
    from kafka_ledger.formats.schema_registry import SchemaRegistryError
    from kafka_ledger.ledger import db as ledger
    from kafka_ledger.runtimes import run_batch

    pipeline = pipeline_factory("avro_registry_away", partitions=2)
    topic = pipeline.topics[0]
    v2 = serializer(settings.schema_registry().client(), V2)
    _produce(servers, topic, [(encode(v2, topic, order(i)), f"c{i}".encode()) for i in range(30)])
    services = services_for(dsn, servers)

    def recorded() -> list[tuple]:
        with ledger.session(services.ledger) as conn, conn.cursor() as cur:
            cur.execute("SELECT batch_id, status, attempts FROM kafka_ledger.batches WHERE pipeline = %s",
                        (pipeline.name,))
            return cur.fetchall()

    stack("kill-schema-registry")
    try:
        with pytest.raises(SchemaRegistryError, match="could not be reached"):
            plan_next_batch(services, pipeline)
        assert recorded() == []
    finally:
        stack("start")
    planned = plan_next_batch(services, pipeline)
    stack("kill-schema-registry")
    try:
        with pytest.raises(SchemaRegistryError, match="could not be reached"):
            run_batch(pipeline, planned.batch_id, services)
        assert recorded() == [(planned.batch_id, "planned", 0)]  # no attempt begun, nothing read
    finally:
        stack("start")
    run_batch(pipeline, planned.batch_id, services)
    assert_exactly_once(dsn, servers, pipeline, {})


@pytest.mark.parametrize("runtime", ["connect", "submit"])
def test_a_pipeline_without_columns_takes_its_reader_schemas_fields_and_the_fields_a_version_adds(
        dsn, servers, pipeline_factory, runtime):
    """Its first plan records every top-level field of the newest version as a column; a version registered later
    with a field added makes it a column at the next plan, added to the table by that batch's commit, and its values
    publish exactly."""
    from integration_support import assert_exactly_once, catch_up, query

    from kafka_ledger.config.settings import services_for
    from kafka_ledger.ledger import db as ledger

    pipeline = pipeline_factory(f"avro_schema_columns_{runtime}", partitions=2)
    assert pipeline.columns is None
    topic = pipeline.topics[0]
    client = settings.schema_registry().client()
    v1 = serializer(client, V1)
    landed = _produce(servers, topic, [(encode(v1, topic, order(i)), f"c{i}".encode()) for i in range(6)])
    catch_up(dsn, servers, pipeline)
    v1_id = int.from_bytes(encode(v1, topic, order(0))[1:5], "big")
    expected_columns = [
        {"name": "order_id", "type": "string"}, {"name": "quantity", "type": "int"},
        {"name": "amount", "type": "decimal(12,4)"}, {"name": "ordered_on", "type": "date"},
        {"name": "at", "type": "timestamp"}, {"name": "address", "type": "jsonb"}, {"name": "status", "type": "string"},
        {"name": "tags", "type": "jsonb"}, {"name": "total", "type": "long"}, {"name": "digest", "type": "bytes"},
        {"name": "attachment", "type": "bytes"}]
    with ledger.session(services_for(dsn, servers).ledger) as conn, conn.cursor() as cur:
        assert ledger.pipeline_columns(cur, pipeline.name) == ledger.RecordedColumns(
            f"{topic}-value", v1_id, 1, expected_columns)
    if runtime == "submit":  # its job and its commit task took the recorded columns; what follows is the runtime's
        assert_exactly_once(dsn, servers, pipeline, {})
        return

    # Version 2 adds channel (with a default): a column from the next plan on, added to the table with the rows of
    # its batch (the first batch's rows hold NULL there); its values, and version 1's after it, publish.
    v2 = serializer(client, V2)
    landed += _produce(servers, topic, [(encode(v2, topic, {**order(i), "channel": "app"}), f"c{i}".encode())
                                        for i in range(6, 10)])
    landed += _produce(servers, topic, [(encode(v1, topic, order(10)), b"c10")])
    second = catch_up(dsn, servers, pipeline)
    assert second.batch_id is not None
    assert_exactly_once(dsn, servers, pipeline, {})
    with ledger.session(services_for(dsn, servers).ledger) as conn, conn.cursor() as cur:
        recorded = ledger.pipeline_columns(cur, pipeline.name)
    assert (recorded.version, recorded.columns) == (2, [*expected_columns, {"name": "channel", "type": "string"}])
    table = pipeline.qualified_output_table
    schema_name, table_name = table.split(".")
    assert [name for (name,) in query(dsn, "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                           f"'{schema_name}' AND table_name = '{table_name}' ORDER BY ordinal_position"
                                      ) if not name.startswith("kafka_") and name != "batch_id"] == [
        *(c["name"] for c in expected_columns), "channel"]
    rows = {(p, o): rest for p, o, *rest in query(
        dsn, f"SELECT kafka_partition, kafka_offset, order_id, amount, address, total, digest, channel FROM {table}")}
    assert {landed[i][1:]: rows[landed[i][1:]][0] for i in range(11)} == {landed[i][1:]: f"o{i}" for i in range(11)}
    order_id, amount, address, total, stored_digest, channel = rows[landed[7][1:]]
    assert (amount, address, total, bytes(stored_digest), channel) == (
        Decimal("7.5000"), {"city": "Lyon", "zip": None}, 700, digest(7), "app")
    assert [rows[landed[i][1:]][-1] for i in (0, 5, 10)] == [None, None, "web"]
