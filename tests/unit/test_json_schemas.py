"""The columns a change event's JsonConverter schema gives (formats/json_schemas.py)."""

from __future__ import annotations

import json

import pytest

from kafka_ledger.formats import json_schemas


def _field(name: str, kind: str, semantic: str | None = None, optional: bool = True, **parameters: str) -> dict:
    return {"field": name, "type": kind, "optional": optional, **({"name": semantic} if semantic else {}),
            **({"parameters": parameters} if parameters else {})}


ROW = {"type": "struct", "name": "shop.public.orders.Value", "optional": True, "fields": [
    _field("ID", "int64", optional=False), _field("on", "int32", "io.debezium.time.Date"),
    _field("at", "int64", "io.debezium.time.Timestamp"), _field("at6", "int64", "io.debezium.time.MicroTimestamp"),
    _field("zoned", "string", "io.debezium.time.ZonedTimestamp"), _field("t", "int64", "io.debezium.time.MicroTime"),
    _field("amount", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2",
           **{"connect.decimal.precision": "12"}),
    _field("cash", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2"),
    _field("doc", "string", "io.debezium.data.Json"), _field("u", "string", "io.debezium.data.Uuid"),
    _field("span", "string", "io.debezium.time.Interval"), _field("mood", "string", "io.debezium.data.Enum"),
    _field("tags", "array"), _field("small", "int16"), _field("ratio", "float"), _field("big_ratio", "double"),
    _field("ok", "boolean"), _field("raw", "bytes"), _field("note", "string", optional=False),
]}
ENVELOPE = {"type": "struct", "name": "shop.public.orders.Envelope", "fields": [
    {**ROW, "field": "before"}, {**ROW, "field": "after"}, _field("op", "string", optional=False)]}


def test_a_change_events_row_image_gives_a_column_of_its_type_for_every_field():
    value = json.dumps({"schema": ENVELOPE, "payload": {"op": "c", "after": {"ID": 1}}}).encode()
    schema = json_schemas.value_schema(value)
    row = json_schemas.row_schema(schema, "debezium")
    assert json_schemas.declared_columns(row) == [
        {"name": "id", "type": "long", "path": "ID", "required": True}, {"name": "on", "type": "date"},
        {"name": "at", "type": "local_timestamp(3)"}, {"name": "at6", "type": "local_timestamp"},
        {"name": "zoned", "type": "timestamp"}, {"name": "t", "type": "time"},
        {"name": "amount", "type": "decimal(12,2)"}, {"name": "cash", "type": "decimal(38,2)"},
        {"name": "doc", "type": "jsonb"}, {"name": "u", "type": "uuid"}, {"name": "span", "type": "interval"},
        {"name": "mood", "type": "string"}, {"name": "tags", "type": "jsonb"}, {"name": "small", "type": "int"},
        {"name": "ratio", "type": "double"}, {"name": "big_ratio", "type": "double"}, {"name": "ok", "type": "boolean"},
        {"name": "raw", "type": "bytes"}, {"name": "note", "type": "string", "required": True}]
    # The same fields, the same hash; another field, another.
    assert json_schemas.schema_hash(row) == json_schemas.schema_hash(json.loads(json.dumps(row)))
    assert json_schemas.schema_hash({**row, "fields": row["fields"][:-1]}) != json_schemas.schema_hash(row)


def test_values_without_a_schema_and_types_no_column_holds_exactly_are_said_so():
    assert json_schemas.value_schema(b'{"op": "c", "after": {"id": 1}}') is None
    assert json_schemas.value_schema(b"not json") is None
    with pytest.raises(ValueError, match="not a change event's schema: it has no field 'after'"):
        json_schemas.row_schema(ROW, "debezium")
    refused = {**ROW, "fields": [_field("price", "struct", "io.debezium.data.VariableScaleDecimal"),
                                 _field("took", "int64", "io.debezium.time.MicroDuration"),
                                 _field("n", "int64", "io.debezium.time.NanoTimestamp"),
                                 _field("wide", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2",
                                        **{"connect.decimal.precision": "40"})]}
    with pytest.raises(ValueError) as refusal:
        json_schemas.declared_columns(refused)
    message = str(refusal.value)
    assert "field price: a numeric without a declared scale (declare its column `decimal(p,s)`" in message
    assert "field took: an interval as microseconds, a month counted as 30.4375 days (set " \
           "interval.handling.mode=string on the connector)" in message
    assert "field n: nanoseconds since the epoch" in message
    assert "field wide: a decimal of precision 40 and scale 2 (a column holds at most 38 digits)" in message
