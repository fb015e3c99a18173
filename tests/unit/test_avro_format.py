"""The Avro format's pure logic: the reader schema's fields and the columns' kinds, the writers it cannot read."""

import json

import pytest

from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.formats.avro import TopicSchemas, columns_problems, field_type, reading, type_name, unreadable_reason
from kafka_ledger.model.kinds import parse_kind

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 4}},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}]}], "default": None},
    {"name": "billing", "type": "Address"},
    {"name": "total", "type": "long"},
]}


def test_a_path_follows_records_through_nullable_unions_and_named_types():
    reader = json.dumps(ORDER)
    assert type_name(field_type(reader, ("amount",))) == "decimal(12,4)"
    assert field_type(reader, ("address", "city")) == "string"
    assert field_type(reader, ("billing", "city")) == "string"


def test_each_kind_reads_the_avro_types_it_holds_exactly():
    assert reading(parse_kind("decimal(10,2)"), {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                                 "scale": 4}) == "fit"
    assert reading(parse_kind("long"), "int") == "cast"
    assert reading(parse_kind("int"), "long") == "range"
    assert reading(parse_kind("jsonb"), {"type": "array", "items": "string"}) == "json"
    assert reading(parse_kind("string"), {"type": "enum", "name": "S", "symbols": ["A"]}) == "same"
    assert reading(parse_kind("string"), "long") is None
    assert reading(parse_kind("double"), "long") is None  # not every long is a double exactly
    assert reading(parse_kind("bytes"), "bytes") == reading(parse_kind("bytes"), {"type": "fixed", "name": "F",
                                                                                "size": 16}) == "same"
    assert reading(parse_kind("bytes"), {"type": "bytes", "logicalType": "decimal", "precision": 4}) is None
    assert reading(parse_kind("string"), "bytes") is None


def test_columns_the_reader_schema_cannot_fill_are_named_before_anything_is_read():
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "value": {"format": "avro"}, "columns": [
            {"name": "order_id", "type": "long"}, {"name": "country", "type": "string", "path": "address.country"},
            {"name": "city", "type": "string", "path": "address.city.name"},
            {"name": "amount", "type": "decimal(10,2)"}]}}}))["p"]
    schemas = TopicSchemas("t-value", 7, json.dumps(ORDER), {7: json.dumps(ORDER)})
    assert columns_problems(pipeline.columns, schemas) == [
        "column order_id (long) cannot hold the reader schema's order_id (string) exactly",
        "column country: the reader schema has no field address.country (subject t-value, schema id 7)",
        "column city: address.city is not a record (subject t-value, schema id 7)",
    ]


def test_a_writer_the_reader_cannot_resolve_is_named_with_why():
    reader = json.dumps(ORDER)
    writer = json.dumps({**ORDER, "fields": [{"name": "order_id", "type": "long"}, *ORDER["fields"][1:]]})
    assert unreadable_reason(reader, reader) is None
    assert unreadable_reason(reader, writer) == ("reader type: string not compatible with writer type: long "
                                                 "(at /fields/0/type)")


def test_every_top_level_field_is_declared_with_the_column_type_that_holds_it():
    from kafka_ledger.formats.avro import declared_columns

    schema = {**ORDER, "fields": [*ORDER["fields"],
                                  {"name": "rate", "type": "float"}, {"name": "count", "type": "int"},
                                  {"name": "on", "type": {"type": "int", "logicalType": "date"}},
                                  {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
                                  {"name": "state", "type": {"type": "enum", "name": "S", "symbols": ["A"]}},
                                  {"name": "blob", "type": {"type": "fixed", "name": "F", "size": 2}},
                                  {"name": "tags", "type": {"type": "map", "values": "long"}}]}
    assert declared_columns(json.dumps(schema)) == [
        {"name": "order_id", "type": "string"}, {"name": "amount", "type": "decimal(12,4)"},
        {"name": "address", "type": "jsonb"}, {"name": "billing", "type": "jsonb"}, {"name": "total", "type": "long"},
        {"name": "rate", "type": "double"}, {"name": "count", "type": "int"}, {"name": "on", "type": "date"},
        {"name": "at", "type": "timestamp"}, {"name": "state", "type": "string"}, {"name": "blob", "type": "bytes"},
        {"name": "tags", "type": "jsonb"}]
    # What it declares reads back as a valid pipeline whose reader schema fills every column.
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "value": {"format": "avro"},
        "columns": declared_columns(json.dumps(schema))}}}))["p"]
    assert columns_problems(pipeline.columns, TopicSchemas("t-value", 1, json.dumps(schema), {})) == []


def test_a_field_not_named_in_lower_case_is_read_by_a_lower_case_column_through_its_path():
    from kafka_ledger.formats.avro import declared_columns

    schema = {"type": "record", "name": "R", "fields": [{"name": "orderId", "type": "string"},
                                                        {"name": "total", "type": "long"}]}
    assert declared_columns(json.dumps(schema)) == [{"name": "orderid", "type": "string", "path": "orderId"},
                                                    {"name": "total", "type": "long"}]


def test_a_change_events_columns_are_the_fields_of_its_row_image():
    from kafka_ledger.formats.avro import declared_columns

    value = {"type": "record", "name": "Value", "namespace": "shop.public.orders", "fields": [
        {"name": "id", "type": "long"}, {"name": "Total", "type": ["null", "long"], "default": None}]}
    event = {"type": "record", "name": "Envelope", "namespace": "shop.public.orders", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [{"name": "lsn", "type": "long"}]}},
        {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
    assert declared_columns(json.dumps(event), "debezium") == [{"name": "id", "type": "long"},
                                                               {"name": "total", "type": "long", "path": "Total"}]
    with pytest.raises(ValueError, match="not a change event's schema: the reader schema has no field after"):
        declared_columns(json.dumps(ORDER), "debezium")


def test_a_field_no_column_type_holds_is_named():
    from kafka_ledger.formats.avro import declared_columns

    schema = {"type": "record", "name": "R", "fields": [
        {"name": "either", "type": ["null", "string", "long"]},
        {"name": "local", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "huge", "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}},
        {"name": "ok", "type": "boolean"}]}
    with pytest.raises(ValueError) as raised:
        declared_columns(json.dumps(schema))
    assert str(raised.value) == ("field either: no column type holds union values exactly; field local: no column "
                                 "type holds time-millis values exactly; field huge: no column type holds "
                                 "decimal(40,2) values exactly")


def test_every_kind_reads_in_every_format():
    """The one place each format decides by a column's kind (kind_readings) names every kind a column may declare."""
    from kafka_ledger.formats.known import FORMATS
    from kafka_ledger.model.kinds import DECLARABLE

    for fmt in FORMATS.values():
        assert set(fmt.kind_readings) == {kind.word for kind in DECLARABLE}, fmt.name
        for kind in DECLARABLE:
            assert fmt.kind_reading(kind) is not None


def test_debeziums_avro_types_read_by_their_connect_names():
    """An AvroConverter writes Debezium's types by Connect's semantic names, not Avro's logical types: a column of
    the source's type reads each; another kind reads its Avro type; a decimal wider than Spark's is decoded from its
    bytes."""
    from kafka_ledger.formats import avro
    from kafka_ledger.model.kinds import parse_kind

    def named(kind: str, name: str) -> dict:
        return {"type": kind, "connect.version": 1, "connect.name": name}

    assert avro.type_name(named("int", "io.debezium.time.Date")) == "io.debezium.time.Date"
    assert avro.type_name(named("string", "io.debezium.data.Enum")) == "string"  # a name no kind reads otherwise
    cases = [("date", named("int", "io.debezium.time.Date"), "epoch days"),
             ("local_timestamp(3)", named("long", "io.debezium.time.Timestamp"), "epoch millis"),
             ("time", named("long", "io.debezium.time.MicroTime"), "epoch micros"),
             ("timestamp", named("string", "io.debezium.time.ZonedTimestamp"), "text"),
             ("jsonb", named("string", "io.debezium.data.Json"), "json text"),
             ("uuid", named("string", "io.debezium.data.Uuid"), "text"),
             ("interval", named("string", "io.debezium.time.Interval"), "text"),
             ("string", named("string", "io.debezium.data.Uuid"), "same"),  # its Avro type
             ("long", named("long", "io.debezium.time.Timestamp"), "same"),
             ("date", named("long", "io.debezium.time.MicroDuration"), None),
             ("decimal(38,10)", {"type": "record", "name": "VariableScaleDecimal", "fields": [],
                                 "connect.name": "io.debezium.data.VariableScaleDecimal"}, "variable scale")]
    assert [(kind, avro.reading(parse_kind(kind), avro_type)) for kind, avro_type, _ in cases] == [
        (kind, how) for kind, _, how in cases]
    row = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "long"}, {"name": "d", "type": ["null", named("int", "io.debezium.time.Date")]},
        {"name": "at", "type": ["null", named("long", "io.debezium.time.MicroTimestamp")]},
        {"name": "doc", "type": ["null", named("string", "io.debezium.data.Json")]},
        {"name": "span", "type": ["null", named("string", "io.debezium.time.Interval")]}]}
    envelope = {"type": "record", "name": "Envelope", "fields": [
        {"name": "before", "type": ["null", row]}, {"name": "after", "type": ["null", "Value"]}]}
    assert avro.declared_columns(json.dumps(envelope), "debezium") == [
        {"name": "id", "type": "long"}, {"name": "d", "type": "date"}, {"name": "at", "type": "local_timestamp"},
        {"name": "doc", "type": "jsonb"}, {"name": "span", "type": "interval"}]
    money = {"type": "bytes", "scale": 2, "precision": 64, "logicalType": "decimal",
             "connect.name": "org.apache.kafka.connect.data.Decimal"}
    wide = {"type": "record", "name": "R", "fields": [{"name": "m", "type": ["null", money]}]}
    assert json.loads(avro._spark_decimals(json.dumps(wide)))["fields"][0]["type"][1] == {
        k: v for k, v in money.items() if k != "logicalType"}
