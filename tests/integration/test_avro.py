"""Avro values on the real Spark and the stack's schema registry: written by Confluent's own AvroSerializer, decoded by
kafka-ledger with the batch's reader schema, every value published exactly or dead-lettered with its reason."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from kafka_ledger.config import settings
from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.config.settings import spark_connect_url
from kafka_ledger.sinks import sink_for

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
]}
# Version 2 adds a field with a default: values written with version 1 read it as its default.
V2 = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
# A writer the reader cannot read: quantity became a string.
INCOMPATIBLE = {**V1, "fields": [{"name": "quantity", "type": "string"} if f["name"] == "quantity" else f
                                 for f in V1["fields"]]}
COLUMNS = [
    {"name": "order_id", "type": "string", "required": True},
    {"name": "quantity", "type": "long"},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "ordered_on", "type": "date"},
    {"name": "at", "type": "timestamp"},
    {"name": "city", "type": "string", "path": "address.city"},
    {"name": "zip", "type": "string", "path": "address.zip"},
    {"name": "status", "type": "string"},
    {"name": "tags", "type": "jsonb"},
    {"name": "total", "type": "int"},
    {"name": "channel", "type": "string"},
    {"name": "customer", "type": "string", "source": "key"},
]


def order(i: int, **changes) -> dict:
    return {"order_id": f"o{i}", "quantity": i, "amount": Decimal(f"{i}.5"), "ordered_on": date(2026, 11, 26),
            "at": datetime(2026, 11, 27, 10, 0, i, tzinfo=UTC), "address": {"city": "Lyon", "zip": None},
            "status": "PAID", "tags": ["a", "b"], "total": i * 100, **changes}


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(spark_connect_url()).create()
    session.conf.set("spark.sql.session.timeZone", "UTC")
    yield session
    session.stop()


def serializer(client, schema: dict):
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})


def encode(serialize, subject_topic: str, value: dict) -> bytes:
    from confluent_kafka.serialization import MessageField, SerializationContext

    return serialize(value, SerializationContext(subject_topic, MessageField.VALUE))


def test_values_of_every_version_decode_into_the_reader_schema_and_bad_ones_are_dead_letters(spark):
    from kafka_ledger.formats.avro import AvroFormat
    from kafka_ledger.formats.avro_registry import newest, topic_schemas
    from kafka_ledger.formats.decode import decode_records
    from kafka_ledger.formats.framing import NOT_FRAMED

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
        "topics": [topic], "output_table": "t", "columns": COLUMNS, "value": {"format": "avro"}}}}))["p"]
    records = spark.createDataFrame(
        [(topic, 0, offset, datetime(2026, 11, 27, tzinfo=UTC), key, value)
         for offset, (value, key, _) in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary")
    fmt = AvroFormat().bound({topic: schemas})
    names = [c["name"] for c in COLUMNS]

    def decoded(lean: bool) -> dict[int, dict]:
        frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean, fmt=fmt)
        return {row["kafka_offset"]: row.asDict() for row in frame.select("kafka_offset", "error", *names).collect()}

    lean, full = decoded(True), decoded(False)
    assert {o: (lean[o], full[o]) for o in lean if lean[o] != full[o]} == {}
    reasons = {offset: row["error"] for offset, row in lean.items()}
    expected = {offset: reason for offset, (_, _, reason) in enumerate(values)}
    expected[6] = f"value does not decode with its writer schema (id {v1_id})"
    expected[8] = (f"the writer schema (id {incompatible_id}) cannot be read with the reader schema (id {v2_id}) of "
                   f"subject {subject}: " + schemas.unreadable[incompatible_id])
    assert reasons == expected
    first = lean[0]
    assert first == {"kafka_offset": 0, "error": None, "order_id": "o1", "quantity": 1, "amount": Decimal("1.50"),
                     "ordered_on": date(2026, 11, 26), "at": first["at"], "city": "Lyon", "zip": None,
                     "status": "PAID", "tags": '["a","b"]', "total": 100, "channel": "web", "customer": "c1"}
    assert first["at"].replace(tzinfo=None) == datetime(2026, 11, 27, 10, 0, 1)
    assert lean[1]["channel"] == "app"

