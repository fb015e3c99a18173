"""Debezium change events (`envelope: debezium`) decoded on the real Spark: Debezium's own published events, with and
without the JsonConverter's wrapper, and every op; the lean path agrees with the full one."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.sinks import sink_for

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "debezium"
COLUMNS = [
    {"name": "id", "type": "long"},
    {"name": "first_name", "type": "string", "required": True},
    {"name": "last_name", "type": "string"},
    {"name": "email", "type": "string"},
    {"name": "op", "type": "string", "path": "op"},
    {"name": "binlog_pos", "type": "long", "path": "source.pos"},
    {"name": "changed_ms", "type": "long", "path": "ts_ms"},
]
NAMES = [c["name"] for c in COLUMNS]


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"serde-{name}.json").read_text())


def event(op: str | None, before: dict | None, after: dict | None) -> bytes:
    """A change event shaped like Debezium's published ones (serde-update.json's source), with `op`, before, after."""
    document = {**fixture("update"), "before": before, "after": after}
    if op is None:
        del document["op"]
    else:
        document["op"] = op
    return json.dumps(document).encode()


ANNE = {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}
ROW = (1004, "Anne", "Kretchmar", "annek@noanswer.org")
# value -> (reason, the row's (id, first_name, last_name, email, op, binlog_pos, changed_ms), kafka_tombstone)
CASES: list[tuple[bytes | None, str | None, tuple | None, bool]] = [
    ((FIXTURES / "serde-with-schema.json").read_bytes(), None, (*ROW, "c", 154, 1465491411815), False),
    (json.dumps(fixture("with-schema")).encode(), None, (*ROW, "c", 154, 1465491411815), False),
    ((FIXTURES / "serde-without-schema.json").read_bytes(), None, (*ROW, "c", 154, 1465491411815), False),
    ((FIXTURES / "serde-update.json").read_bytes(), None, (*ROW, "u", 154, 1465491411815), False),
    (event("r", None, ANNE), None, (*ROW, "r", 154, 1465491411815), False),
    # A delete: the key from the old row image (REPLICA IDENTITY DEFAULT: only the key), nothing else.
    (event("d", {"id": 1004, "first_name": None}, None), None, (1004, *(None,) * 6), True),
    # The Kafka tombstone after a delete: no key, no reason (the merge passes over it).
    (None, None, (None,) * 7, True),
    (event("d", None, None), "delete event (op d) without its key: field 'before.id' is null (the source table's "
                             "REPLICA IDENTITY must hold the key)", None, True),
    (event("t", None, None), "truncate event (op t): not applied to an entity table (to apply it, delete the "
                             "table's rows yourself)", None, False),
    (event("m", None, None), "unknown op 'm' (a change event's op is c, r, u or d)", None, False),
    (event(None, None, ANNE), "not a change event: no op (envelope debezium; a row already unwrapped, e.g. by "
                              "ExtractNewRecordState, needs no envelope)", None, False),
    ((FIXTURES / "serde-unwrapped.json").read_bytes(), "not a change event: no op (envelope debezium; a row already "
     "unwrapped, e.g. by ExtractNewRecordState, needs no envelope)", None, False),
    (event("u", ANNE, {**ANNE, "first_name": None}), "required field 'after.first_name' is missing or null", None,
     False),
    (event("c", None, {**ANNE, "id": "x"}), "field 'after.id' is not a valid long", None, False),
    (b'{"schema": {}, "payload": {"op": "c", "after": {"id": 7, "first_name": "W"}}}', None,
     (7, "W", None, None, "c", None, None), False),
    (b"not json", "malformed JSON (not a JSON object)", None, False),
]


def _pipeline(extra_fields: str):
    return parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "write": "upsert", "key": ["id"], "extra_fields": extra_fields,
        "value": {"format": "json", "envelope": "debezium"}, "columns": COLUMNS}}}))["p"]


def _decoded(spark, pipeline, values: list[bytes | None], lean: bool) -> dict[int, tuple]:
    from kafka_ledger.formats.decode import decode_records

    records = spark.createDataFrame(
        [("t", 0, offset, datetime(2026, 11, 27, tzinfo=UTC), b'{"id": 1004}', value)
         for offset, value in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary")
    frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean)
    return {row["kafka_offset"]: (row["error"], tuple(row[n] for n in NAMES), row["kafka_tombstone"])
            for row in frame.collect()}


@pytest.mark.parametrize("extra_fields", ["ignore", "dead_letter"])
def test_every_op_of_debeziums_own_events_decodes_to_its_change_or_its_reason(spark, extra_fields):
    values = [value for value, _, _, _ in CASES]
    pipeline = _pipeline(extra_fields)
    lean, full = (_decoded(spark, pipeline, values, lean) for lean in (True, False))
    assert {o: (lean[o], full[o]) for o in lean if lean[o] != full[o]} == {}
    for offset, (_, reason, row, tombstone) in enumerate(CASES):
        error, values_, flag = lean[offset]
        assert error == reason, offset
        if reason is None:
            assert (values_, flag) == (row, tombstone), offset


def test_a_field_of_the_row_image_no_column_reads_is_unexpected_but_not_the_events_own(spark):
    """extra_fields: dead_letter looks inside the row image only: `source`, `ts_ms` and the old row image are the
    event's, not the entity's."""
    values = [(FIXTURES / "serde-unknown-property.json").read_bytes(), (FIXTURES / "serde-update.json").read_bytes()]
    for extra_fields, reasons in (("ignore", [None, None]),
                                  ("dead_letter", ["unexpected field(s): after.middle_name", None])):
        pipeline = _pipeline(extra_fields)
        lean, full = (_decoded(spark, pipeline, values, lean) for lean in (True, False))
        assert lean == full
        assert [lean[o][0] for o in range(len(values))] == reasons


# Change events as Debezium's AvroConverter shapes them: before and after a nullable Value record, source a record.
AVRO_VALUE = {"type": "record", "name": "Value", "namespace": "shop.public.customers", "fields": [
    {"name": "id", "type": "long"}, {"name": "first_name", "type": ["null", "string"], "default": None},
    {"name": "last_name", "type": ["null", "string"], "default": None},
    {"name": "email", "type": ["null", "string"], "default": None}]}
AVRO_EVENT = {"type": "record", "name": "Envelope", "namespace": "shop.public.customers", "fields": [
    {"name": "before", "type": ["null", AVRO_VALUE], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": "pos", "type": ["null", "long"], "default": None}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def test_avro_change_events_through_the_registry_decode_to_their_changes(spark):
    import uuid

    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_ledger.config import settings
    from kafka_ledger.formats.avro import AvroFormat
    from kafka_ledger.formats.avro_registry import newest, topic_schemas
    from kafka_ledger.formats.decode import decode_records

    client = settings.schema_registry().client()
    topic = f"it-cdc-{uuid.uuid4().hex[:8]}"
    serialize = AvroSerializer(client, json.dumps(AVRO_EVENT), conf={"auto.register.schemas": True})

    def encode(op: str, before: dict | None, after: dict | None) -> bytes:
        return serialize({"before": before, "after": after, "source": {"pos": 42}, "op": op, "ts_ms": 7},
                         SerializationContext(topic, MessageField.VALUE))

    anne = {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}
    values = [encode("r", None, anne), encode("u", anne, {**anne, "email": None}),
              encode("d", {"id": 1004, "first_name": None, "last_name": None, "email": None}, None), None,
              encode("t", None, None), encode("c", None, {**anne, "first_name": None})]
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": [topic], "output_table": "t", "write": "upsert", "key": ["id"],
        "value": {"format": "avro", "envelope": "debezium"}, "columns": COLUMNS}}}))["p"]
    schema_id, _ = newest(client, f"{topic}-value")
    fmt = AvroFormat().bound({topic: topic_schemas(client, f"{topic}-value", schema_id)})
    records = spark.createDataFrame(
        [(topic, 0, offset, datetime(2026, 11, 27, tzinfo=UTC), b"k", value) for offset, value in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary")

    def decoded(lean: bool) -> dict[int, tuple]:
        frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean, fmt=fmt)
        return {row["kafka_offset"]: (row["error"], tuple(row[n] for n in NAMES), row["kafka_tombstone"])
                for row in frame.collect()}

    lean, full = decoded(True), decoded(False)
    assert lean == full
    published = {o: change for o, (error, *change) in lean.items() if error is None}
    assert published == {0: [(*ROW, "r", 42, 7), False], 1: [(1004, "Anne", "Kretchmar", None, "u", 42, 7), False],
                         2: [(1004, *(None,) * 6), True], 3: [(None,) * 7, True]}
    assert {o: error for o, (error, _, _) in lean.items() if error is not None} == {
        4: "truncate event (op t): not applied to an entity table (to apply it, delete the table's rows yourself)",
        5: "required field 'after.first_name' is missing or null"}
