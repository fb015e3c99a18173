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
# Spark's Kafka source rows, with their headers (a change event's envelope reads them).
RECORDS = ("topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
           "headers array<struct<key: string, value: binary>>")


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
        [("t", 0, offset, datetime(2026, 11, 27, tzinfo=UTC), b'{"id": 1004}', value, [])
         for offset, value in enumerate(values)], RECORDS)
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
    from kafka_ledger.formats.avro import AvroFormat, topic_schemas
    from kafka_ledger.formats.decode import decode_records
    from kafka_ledger.formats.schema_registry import newest

    client = settings.schema_registry().client()
    topic = f"it-cdc-{uuid.uuid4().hex[:8]}"
    serialize = AvroSerializer(client, json.dumps(AVRO_EVENT), conf={"auto.register.schemas": True})

    def encode(op: str, before: dict | None, after: dict | None) -> bytes:
        return serialize({"before": before, "after": after, "source": {"pos": 42}, "op": op, "ts_ms": 7},
                         SerializationContext(topic, MessageField.VALUE))

    anne = {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}
    values = [encode("r", None, anne), encode("u", anne, {**anne, "email": None}),
              encode("d", {"id": 1004, "first_name": None, "last_name": None, "email": None}, None), None,
              encode("t", None, None), encode("c", None, {**anne, "first_name": None}),
              # An unchanged TOASTed value: Debezium's placeholder, in a required field too.
              encode("u", None, {**anne, "first_name": "__debezium_unavailable_value",
                                 "email": "__debezium_unavailable_value"})]
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": [topic], "output_table": "t", "write": "upsert", "key": ["id"],
        "value": {"format": "avro", "envelope": "debezium"}, "columns": COLUMNS}}}))["p"]
    schema_id, _ = newest(client, f"{topic}-value")
    fmt = AvroFormat({topic: topic_schemas(client, f"{topic}-value", schema_id)})
    records = spark.createDataFrame(
        [(topic, 0, offset, datetime(2026, 11, 27, tzinfo=UTC), b"k", value, [])
         for offset, value in enumerate(values)], RECORDS)

    def decoded(lean: bool) -> dict[int, tuple]:
        frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean, fmt=fmt)
        return {row["kafka_offset"]: (row["error"], tuple(row[n] for n in NAMES), row["kafka_tombstone"],
                                      row["kafka_unavailable"]) for row in frame.collect()}

    lean, full = decoded(True), decoded(False)
    assert lean == full
    published = {o: change for o, (error, *change) in lean.items() if error is None}
    assert published == {0: [(*ROW, "r", 42, 7), False, None],
                         1: [(1004, "Anne", "Kretchmar", None, "u", 42, 7), False, None],
                         2: [(1004, *(None,) * 6), True, None], 3: [(None,) * 7, True, None],
                         6: [(1004, None, "Kretchmar", None, "u", 42, 7), False, '["first_name","email"]']}
    assert {o: error for o, (error, _, _, _) in lean.items() if error is not None} == {
        4: "truncate event (op t): not applied to an entity table (to apply it, delete the table's rows yourself)",
        5: "required field 'after.first_name' is missing or null"}


PLACEHOLDER = "__debezium_unavailable_value"


def _change(op: str, id_: int, row: dict | None = None) -> bytes:
    """A change event as Debezium's JsonConverter writes it without schemas (a delete's before: the key alone)."""
    return json.dumps({"before": {"id": id_} if op == "d" else None,
                       "after": None if op == "d" else {"id": id_, **(row or {})},
                       "source": {"lsn": 1}, "op": op, "ts_ms": 1}).encode()


def test_the_merge_fills_what_change_events_lack_or_parks_them_or_dead_letters_them(
        dsn, servers, pipeline_factory, producer):
    """Values Debezium did not send (its placeholder) are filled from the entity as it was: from an earlier event of
    the batch, from the entity table, from the row a primary-key change moved; a change's create read before its
    delete (in another partition) waits, parked with its key's later events, until a batch reads the delete; a value
    found nowhere is a dead letter saying so; a replay changes nothing."""
    from integration_support import cli, drain, query

    pipeline = pipeline_factory("lacking", partitions=2)
    topic = pipeline.topics[0]
    table = f"{pipeline.output_schema}.{pipeline.output_table}"

    def send(partition: int, events: list[tuple[int, bytes | None, dict[str, bytes] | None]]) -> None:
        producer.send(topic, [value for _, value, _ in events], partition=partition,
                      keys=[json.dumps({"id": id_}).encode() for id_, _, _ in events],
                      headers=[list((headers or {}).items()) for _, _, headers in events])

    def entities() -> dict[int, tuple]:
        return {row[0]: tuple(row[1:]) for row in query(dsn, f"SELECT id, n, note, doc FROM {table}")}

    def change_tables() -> tuple[int, int]:
        return tuple(query(dsn, f'SELECT count(*) FROM kafka_ledger_tombstones."{pipeline.name}${name}"')[0][0]
                     for name in ("moved", "parked"))

    # Filled from the batch's earlier event, and from the table's row.
    send(0, [(1, _change("c", 1, {"n": 1, "note": "A", "doc": "D1"}), None),
             (1, _change("u", 1, {"n": 2, "note": PLACEHOLDER, "doc": PLACEHOLDER}), None),
             (4, _change("c", 4, {"n": 1, "note": "N4", "doc": "D4"}), None)])
    drain(dsn, servers, pipeline)
    send(0, [(1, _change("u", 1, {"n": 3, "note": "A2", "doc": PLACEHOLDER}), None)])
    drain(dsn, servers, pipeline)
    assert entities() == {1: (3, "A2", "D1"), 4: (1, "N4", "D4")}

    # Key 4 becomes 5: the create (partition 1) is read before the delete (partition 0): it waits, with the update
    # after it, and entity 4 stays as it was.
    send(1, [(5, _change("c", 5, {"n": 2, "note": PLACEHOLDER, "doc": PLACEHOLDER}),
              {"__debezium.oldkey": b'{"id":4}'}),
             (5, _change("u", 5, {"n": 9, "note": PLACEHOLDER, "doc": "D5"}), None)])
    drain(dsn, servers, pipeline)
    assert entities() == {1: (3, "A2", "D1"), 4: (1, "N4", "D4")}
    assert change_tables() == (0, 2)
    # Then entity 4's last update and the delete of the change: the create takes 4's row as it stood.
    send(0, [(4, _change("u", 4, {"n": 2, "note": "N4b", "doc": PLACEHOLDER}), None),
             (4, _change("d", 4), {"__debezium.newkey": b'{"id":5}'}),
             (4, None, {"__debezium.newkey": b'{"id":5}'})])
    drain(dsn, servers, pipeline)
    assert entities() == {1: (3, "A2", "D1"), 5: (9, "N4b", "D5")}
    assert change_tables() == (0, 0)
    assert query(dsn, "SELECT count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s", pipeline.name) == [(0,)]

    # An update of an entity never seen: a dead letter saying why, the placeholder never stored.
    # Its raw key and value are read again from Kafka by offset (the merge's rows do not carry them).
    unknown = _change("u", 7, {"n": 1, "note": PLACEHOLDER, "doc": "D7"})
    send(1, [(7, unknown, None)])
    drain(dsn, servers, pipeline)
    assert 7 not in entities()
    reason = ("field 'after.note' holds Debezium's unavailable-value placeholder (a value the source did not log: "
              "unchanged and TOASTed), and no earlier value of the entity is known to keep: the entity table has no "
              "row of it (with REPLICA IDENTITY FULL on the source table, Debezium sends such values)")
    dead_letters = query(dsn, "SELECT kafka_partition, kafka_key, kafka_value, error FROM kafka_ledger.dead_letters "
                              "WHERE pipeline = %s", pipeline.name)
    assert [(p, bytes(k), bytes(v), e) for p, k, v, e in dead_letters] == [(1, b'{"id": 7}', unknown, reason)]

    # A replay of everything: the same entities, the same one dead letter.
    code, data, err = cli("replay", pipeline.name, f"--range={topic}:0:0:7", f"--range={topic}:1:0:3",
                          "--reason", "replay over lacking values")
    assert code == 0, (data, err)
    assert entities() == {1: (3, "A2", "D1"), 5: (9, "N4b", "D5")}
    assert query(dsn, "SELECT count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s", pipeline.name) == [(1,)]
    assert change_tables() == (0, 0)


def _unscaled(value: int) -> str:
    """A Connect Decimal's unscaled value, as the JsonConverter writes it: big-endian two's complement, in base64."""
    import base64

    size = max(1, (value.bit_length() + 8) // 8)
    return base64.b64encode(value.to_bytes(size, "big", signed=True)).decode()


def test_precise_numerics_read_their_scale_from_the_records_schema_or_their_own_object(spark):
    """Debezium's default decimal.handling.mode (precise): a numeric(p,s) as its unscaled value, the scale in the
    JsonConverter's schema; a numeric without a declared scale as an object of both. Read exactly, whatever their
    size and sign; one that does not fit, or has no schema to take its scale from, is a dead letter saying so."""
    from decimal import Decimal

    from kafka_ledger.formats.decode import decode_records

    columns = [{"name": "id", "type": "long"}, {"name": "amount", "type": "decimal(12,2)"},
               {"name": "big", "type": "decimal(38,10)"}, {"name": "var", "type": "decimal(38,20)"}]
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "write": "upsert", "key": ["id"],
        "value": {"format": "json", "envelope": "debezium"}, "columns": columns}}}))["p"]
    decimal = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "optional": True}
    row_schema = {"type": "struct", "optional": True, "fields": [
        {"type": "int64", "field": "id"}, {**decimal, "parameters": {"scale": "2"}, "field": "amount"},
        {**decimal, "parameters": {"scale": "10"}, "field": "big"},
        {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "optional": True, "field": "var",
         "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}]}]}
    schema = {"type": "struct", "fields": [{**row_schema, "field": "before"}, {**row_schema, "field": "after"},
                                           {"type": "string", "field": "op"}]}

    def wrapped(after: dict) -> bytes:
        return json.dumps({"schema": schema, "payload": {"before": None, "after": after, "op": "c"}}).encode()

    values = [
        wrapped({"id": 1, "amount": _unscaled(12345), "big": _unscaled(10**37 - 1),
                 "var": {"scale": 3, "value": _unscaled(3141592)}}),
        wrapped({"id": 2, "amount": _unscaled(-1), "big": _unscaled(-(2**100)), "var": {"scale": 0, "value": "AA=="}}),
        wrapped({"id": 3, "amount": _unscaled(0), "big": None, "var": None}),
        wrapped({"id": 4, "amount": _unscaled(12345), "big": _unscaled(2**127 - 1), "var": None}),
        wrapped({"id": 5, "amount": _unscaled(10**12), "big": None, "var": None}),
        wrapped({"id": 6, "amount": "not base64!", "big": None, "var": None}),
        # Without the JsonConverter's wrapper, the fixed numeric has no scale to be read with.
        json.dumps({"before": None, "after": {"id": 7, "amount": _unscaled(1)}, "op": "c"}).encode(),
        json.dumps({"before": None, "after": {"id": 8, "var": {"scale": 21, "value": _unscaled(1)}},
                    "op": "c"}).encode(),
    ]
    records = spark.createDataFrame(
        [("t", 0, offset, datetime(2026, 11, 27, tzinfo=UTC), b'{"id": 1}', value, [])
         for offset, value in enumerate(values)], RECORDS)
    frames = [{row["kafka_offset"]: row["error"] or (row["amount"], row["big"], row["var"])
               for row in decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean).collect()}
              for lean in (True, False)]
    assert frames[0] == frames[1]
    assert frames[0] == {
        0: (Decimal("123.45"), Decimal("999999999999999999999999999.9999999999"), Decimal("3141.592")),
        1: (Decimal("-0.01"), Decimal("-126765060022822940149.6703205376"), Decimal("0")),  # -(2**100), scale 10
        2: (Decimal("0.00"), None, None),
        3: "field 'after.big' is not a valid decimal(38,10) (more than 38 digits)",
        4: "field 'after.amount' is not a valid decimal(12,2) (it does not fit exactly: more than 2 digit(s) after the "
           "point or 10 before it)",
        5: "field 'after.amount' is not a valid decimal(12,2) (an unscaled value in base64 of 1 to 16 bytes, and its "
           "scale)",
        6: "field 'after.amount' has no scale: Debezium's decimal.handling.mode precise writes it in the record's "
           "schema, and this value has none (set value.converter.schemas.enable=true on the connector, or "
           "decimal.handling.mode=string, and declare it)",
        7: "field 'after.var' is not a valid decimal(38,20) (it does not fit exactly: more than 20 digit(s) after the "
           "point or 18 before it)",
    }


def test_the_typed_tables_events_get_the_same_reason_and_values_on_both_paths(spark):
    """The wide typed table's change events as Debezium writes them without schemas (tools/cdc.py), each column in
    turn holding a value it cannot take, JSON null, or Debezium's placeholder: the lean path (each column proven by
    its value where FieldRead.present says so) gives every record the full path's reason and values."""
    import base64

    from kafka_ledger.formats.decode import decode_records
    from kafka_ledger.model.columns import UNAVAILABLE
    from kafka_ledger.model.debezium import UNAVAILABLE_PLACEHOLDER
    from tools.benchmark import TYPED_CDC_COLUMNS, cdc_value
    from tools.cdc import TYPED_DEBEZIUM

    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "write": "upsert", "key": ["id"],
        "value": {"format": "json", "envelope": "debezium", "debezium": TYPED_DEBEZIUM},
        "columns": TYPED_CDC_COLUMNS}}}))["p"]
    bad = {"j": ["{not json", "[1e400]", 7, {"a": 1}], "jb": ["[1, 2", '{"n": 1e400}'], "d": ["2026-01-01", 1.5],
           "ts0": ["soon"], "ts6": [10**20], "tstz": ["yesterday", "0001-01-01T00:00:00Z", 5], "t3": [-1],
           "t6": [86_400_000_001], "n": ["1.005", "abc", 12.5, "12345678901.5"], "nv": ["1e5", True],
           "m": [True, "1.1.1"], "big": [1.5e3, "x"], "b": ["***", "QUJD", 5], "u": ["not-a-uuid", 5],
           "ai": ["x", "[1, 2]", {"a": 1}], "at": ["[\"a\"", 5], "sm": [70000], "bo": ["yes"],
           "iv": ["1 day", "PT0.0000001S", "PT", "P99999999999Y", 5], "note": [5, {"a": 1}]}
    values = [cdc_value(op, 7, lsn, "typed") for op, lsn in (("c", 1), ("u", 3), ("r", 4), ("d", 5))]
    # Debezium's placeholder as each column carries it: a bytea column's in base64.
    placeholders = {**dict.fromkeys(("j", "jb", "ai", "iv", "u"), UNAVAILABLE_PLACEHOLDER),
                    "b": base64.b64encode(UNAVAILABLE_PLACEHOLDER.encode()).decode()}
    changed = [(name, w) for name, ws in bad.items() for w in ws] + [
        (c["name"], None) for c in TYPED_CDC_COLUMNS if c["name"] not in ("id", "source_lsn", "op")] + [
        *placeholders.items()]
    for name, wrong in changed:
        event = json.loads(cdc_value("u", 7, 1, "typed"))
        event["after"][name] = wrong
        values.append(json.dumps(event).encode())
    names = [c["name"] for c in TYPED_CDC_COLUMNS]
    records = spark.createDataFrame(
        [("t", 0, offset, datetime(2026, 11, 27, tzinfo=UTC), b'{"id": 7}', value, [])
         for offset, value in enumerate(values)], RECORDS)
    lean, full = ({row["kafka_offset"]: row.asDict() for row in decode_records(
        records, pipeline, sink_for(pipeline).envelope, lean=lean).select("kafka_offset", "error", UNAVAILABLE.name,
                                                                           *names).collect()}
        for lean in (True, False))
    assert len(lean) == len(values)
    assert {o: (lean[o], full[o]) for o in lean if lean[o] != full[o]} == {}
    # By (column, the value as JSON text): a value may be an object.
    reason = {(name, json.dumps(wrong)): lean[offset]["error"] for offset, (name, wrong) in enumerate(changed, start=4)}
    assert [lean[o]["error"] for o in range(4)] == [None] * 4
    refused = [("j", "{not json"), ("j", "[1e400]"), ("jb", "[1, 2"), ("jb", '{"n": 1e400}'), ("d", "2026-01-01"),
               ("tstz", "yesterday"), ("n", "1.005"), ("n", "abc"), ("n", "12345678901.5"), ("nv", "1e5"),
               ("m", "1.1.1"), ("big", "x"), ("b", "***"), ("u", "not-a-uuid"), ("ai", "x"),
               ("at", '["a"'), ("iv", "1 day"), ("iv", "PT0.0000001S"), ("iv", "PT"),
               ("iv", UNAVAILABLE_PLACEHOLDER), ("u", UNAVAILABLE_PLACEHOLDER)]
    assert {(n, w): reason[n, json.dumps(w)] for n, w in refused if reason[n, json.dumps(w)] is None} == {}
    # A TOASTed kind's placeholder is no value and no problem: the merge keeps the entity's.
    kept = ["j", "jb", "b", "ai"]
    assert {name: (reason[name, json.dumps(placeholders[name])], lean[4 + changed.index((name, placeholders[name]))][
        UNAVAILABLE.name]) for name in kept} == {name: (None, json.dumps([name])) for name in kept}
    # JSON null is no value and no problem (no column of the table is required).
    assert {name: reason[name, "null"] for name in bad if reason[name, "null"] is not None} == {}
