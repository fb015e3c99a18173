"""Protobuf schemas as the registry holds them (.proto text, or base64 descriptors as Confluent's Python serializer
registers them), built into the descriptors a batch decodes with, and the columns they fill; confluent-kafka's
in-process registry (`mock://`)."""

import base64
import json
import struct

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference
from google.protobuf import descriptor_pb2

from kafka_ledger.config.pipeline import ConfigError, parse_pipelines
from kafka_ledger.config.services import SchemaRegistry
from kafka_ledger.formats.protobuf import (
    ProtobufFormat,
    build_descriptor_set,
    columns_problems,
    declared_columns,
    descriptor_set,
    field_at,
    message_named,
    messages,
    topic_schemas,
    type_name,
)
from kafka_ledger.formats.schema_registry import SchemaRefused, newest

ADDRESS = """syntax = "proto3";
package shop;
message Address { string city = 1; string zip = 2; }
"""
ORDER = """syntax = "proto3";
package shop;
import "address.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Order {
  string order_id = 1;
  int64 quantity = 2;
  Address address = 3;
  google.protobuf.Timestamp placed_at = 4;
  repeated string tags = 5;
  map<string, int32> counts = 6;
  Status status = 7;
  google.protobuf.Int64Value discount = 8;
  bytes raw = 9;
  oneof payment { string card = 10; string iban = 11; }
  message Line { string sku = 1; }
  Line first_line = 12;
  uint64 big = 13;
}
enum Status { NEW = 0; SHIPPED = 1; }
message Other { string x = 1; }
"""


def order_set() -> bytes:
    return build_descriptor_set(ORDER, {"address.proto": ADDRESS}, "order.proto")


def columns(*declared: dict) -> list:
    return parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "value": {"format": "protobuf"},
        "columns": list(declared)}}}))["p"].columns


def test_proto_text_builds_with_its_imports_and_the_well_known_types():
    built = descriptor_pb2.FileDescriptorSet.FromString(order_set())
    names = [f.name for f in built.file]
    assert names[-1] == "kafka_ledger_schema.proto"
    assert {"address.proto", "google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"} <= set(names)
    assert [m.full_name for m in messages(order_set())] == ["shop.Order", "shop.Other"]
    assert message_named(order_set(), None, "s").full_name == "shop.Order"
    assert message_named(order_set(), "shop.Order.Line", "s").full_name == "shop.Order.Line"
    with pytest.raises(SchemaRefused, match=r"has no message shop\.Nope \(its messages: shop\.Order, shop\.Other"):
        message_named(order_set(), "shop.Nope", "s")


def test_a_schema_protoc_cannot_build_is_refused_with_protocs_words():
    with pytest.raises(SchemaRefused, match=r"version 3 of subject t-value is not a Protobuf schema protoc can build: "
                                            r".*kafka_ledger_schema\.proto:2"):
        build_descriptor_set('syntax = "proto3";\nmessage A { strin x = 1; }\n', {}, "version 3 of subject t-value")


def test_base64_descriptors_build_the_same_messages_as_their_text():
    built = descriptor_pb2.FileDescriptorSet.FromString(order_set())
    by_name = {f.name: f for f in built.file}
    own = by_name["kafka_ledger_schema.proto"]
    encoded = {"address.proto": base64.b64encode(by_name["address.proto"].SerializeToString()).decode()}
    assembled = build_descriptor_set(base64.b64encode(own.SerializeToString()).decode(), encoded, "s")
    order = message_named(assembled, None, "s")
    assert [f.name for f in order.fields] == [f.name for f in message_named(order_set(), None, "s").fields]
    assert type_name(order.fields_by_name["placed_at"]) == "google.protobuf.Timestamp"
    with pytest.raises(SchemaRefused, match="imports address.proto, which is not among its references"):
        build_descriptor_set(base64.b64encode(own.SerializeToString()).decode() + "\n", {}, "s")


def test_field_types_as_the_columns_read_them():
    order = message_named(order_set(), None, "s")
    assert {f.name: type_name(f) for f in order.fields} == {
        "order_id": "string", "quantity": "int64", "address": "message", "placed_at": "google.protobuf.Timestamp",
        "tags": "repeated", "counts": "map", "status": "enum", "discount": "int64", "raw": "bytes", "card": "string",
        "iban": "string", "first_line": "message", "big": "uint64"}
    assert field_at(order, ("address", "city")).name == "city"
    with pytest.raises(KeyError):
        field_at(order, ("tags", "x"))


def test_a_message_that_cannot_fill_the_columns_says_which_and_why():
    order = message_named(order_set(), None, "s")
    declared = columns({"name": "order_id", "type": "string"},
                       {"name": "city", "path": "address.city", "type": "string"},
                       {"name": "placed_at", "type": "timestamp"}, {"name": "quantity", "type": "int"},
                       {"name": "missing", "type": "string"}, {"name": "tags", "type": "jsonb"},
                       {"name": "discount", "type": "decimal(20,0)"}, {"name": "raw", "type": "bytes"})
    assert columns_problems(declared, order, "version 1 of subject t-value") == [
        "column quantity: field quantity is int64, which a int column cannot hold exactly (it holds int32, sint32, "
        "sfixed32)",
        "column missing: message shop.Order of version 1 of subject t-value has no field missing"]


def test_columns_are_derived_from_the_message_with_the_kinds_that_hold_them():
    derived = {c["name"]: c["type"] for c in declared_columns(message_named(order_set(), None, "s"))}
    assert derived == {"order_id": "string", "quantity": "long", "address": "jsonb", "placed_at": "timestamp",
                       "tags": "jsonb", "counts": "jsonb", "status": "string", "discount": "long", "raw": "bytes",
                       "card": "string", "iban": "string", "first_line": "jsonb", "big": "decimal(20,0)"}
    # Every derived column is one the message fills.
    assert columns_problems(columns(*declared_columns(message_named(order_set(), None, "s"))),
                            message_named(order_set(), None, "s"), "s") == []


def test_a_batch_binds_the_reader_and_every_version_and_hands_the_decoder_one_blob():
    registry = SchemaRegistry("mock://protobuf-unit").client()
    registry.register_schema("address.proto", Schema(ADDRESS, "PROTOBUF"))
    reference = SchemaReference("address.proto", "address.proto", 1)
    first = registry.register_schema("t-value", Schema(ORDER, "PROTOBUF", [reference]))
    second = registry.register_schema("t-value", Schema(ORDER.replace("uint64 big = 13;", "uint64 big = 13; "
                                                                      "string note = 14;"), "PROTOBUF", [reference]))
    assert newest(registry, "t-value") == (second, 2)
    schemas = topic_schemas(registry, "t-value", first)
    assert (schemas.subject, schemas.reader_id, sorted(schemas.writers)) == ("t-value", first, sorted([first, second]))
    assert "note" not in schemas.reader_message(None).fields_by_name
    blob = schemas.blob("shop.Order", [(("order_id",), "S"), (("address", "city"), "S"), (("tags",), "V")], True)
    (reader_id,) = struct.unpack(">i", blob[:4])
    texts, at = [], 4
    for _ in range(3):
        (size,) = struct.unpack(">H", blob[at:at + 2])
        texts.append(blob[at + 2:at + 2 + size].decode())
        at += 2 + size
    assert (reader_id, texts) == (first, ["shop.Order", "value", "the topic's subject"])
    assert struct.unpack(">i", blob[at:at + 4]) == (3,)
    asked, at = [], at + 4
    for _ in range(3):
        (size,) = struct.unpack(">H", blob[at:at + 2])
        asked.append((blob[at + 2:at + 2 + size].decode(), blob[at + 2 + size:at + 3 + size].decode()))
        at += 3 + size
    assert asked == [("order_id", "S"), ("address.city", "S"), ("tags", "V")]
    assert struct.unpack(">?i", blob[at:at + 5]) == (True, 2)
    assert descriptor_set(registry, registry.get_schema(second), "s") == schemas.writers[second]
    with pytest.raises(SchemaRefused, match="is a AVRO schema, not Protobuf"):
        descriptor_set(registry, Schema('{"type": "string"}', "AVRO"), "s")


def test_a_protobuf_declaration_takes_a_subject_and_a_message_and_refuses_what_it_cannot_read():
    def pipeline(value: dict, **more) -> dict:
        return {"pipelines": {"p": {"topics": ["t"], "output_table": "t", "value": value,
                                    "columns": [{"name": "a", "type": "string"}], **more}}}

    parsed = parse_pipelines(json.dumps(pipeline({"format": "protobuf", "message": "shop.Order"})))["p"]
    assert (parsed.value.message, parsed.value.subject_of("t")) == ("shop.Order", "t-value")
    for value, more, problem in [
        ({"format": "avro", "message": "shop.Order"}, {}, "message applies to format protobuf, not avro"),
        ({"format": "protobuf", "framing": "confluent"}, {}, "framing applies to format json, not protobuf"),
        ({"format": "protobuf", "envelope": "debezium"}, {"write": "upsert", "key": ["a"]},
         "envelope debezium reads JSON or Avro change events, not Protobuf"),
    ]:
        with pytest.raises(ConfigError, match=problem):
            parse_pipelines(json.dumps(pipeline(value, **more)))
    keyed = pipeline({"format": "protobuf"})
    keyed["pipelines"]["p"]["columns"] = [{"name": "a", "type": "string", "source": "key", "path": "x"}]
    with pytest.raises(ConfigError, match="with format protobuf a key or header column reads the whole key"):
        parse_pipelines(json.dumps(keyed))
    assert ProtobufFormat().uses_registry and ProtobufFormat().derives_columns


KEY = 'syntax = "proto3";\npackage shop;\nmessage OrderKey { string id = 1; int64 region = 2; }\n'


def test_protobuf_keys_are_declared_with_key_format_and_pinned_beside_the_values():
    def pipeline(value: dict, columns: list[dict]) -> dict:
        return {"pipelines": {"p": {"topics": ["t"], "output_table": "t", "value": value, "columns": columns}}}

    key_column = {"name": "id", "type": "string", "source": "key", "path": "id", "required": True}
    declared = pipeline({"format": "protobuf", "key_format": "protobuf"},
                        [key_column, {"name": "order_id", "type": "string"}])
    parsed = parse_pipelines(json.dumps(declared))["p"]
    assert (parsed.value.key_subject_of("t"), ProtobufFormat().parts(parsed)) == ("t-key", ("value", "key"))
    for value, columns, problem in [
        ({"format": "protobuf", "key_message": "shop.OrderKey"}, [key_column],
         "key_message apply to key_format protobuf"),
        ({"format": "protobuf"}, [key_column],
         "a key or header column reads the whole key or header \\(no path\\) unless the keys are in the format too"),
        ({"format": "protobuf", "key_format": "protobuf"}, [{"name": "id", "type": "string", "source": "key"}],
         "with key_format protobuf a key column reads a field of the key \\(its path\\)"),
        ({"format": "avro", "key_format": "protobuf"}, [{"name": "a", "type": "string"}],
         "key_format applies to format protobuf, not avro"),
    ]:
        with pytest.raises(ConfigError, match=problem):
            parse_pipelines(json.dumps(pipeline(value, columns)))

    registry = SchemaRegistry("mock://protobuf-keys").client()
    registry.register_schema("address.proto", Schema(ADDRESS, "PROTOBUF"))
    value_id = registry.register_schema("t-value", Schema(ORDER, "PROTOBUF", [
        SchemaReference("address.proto", "address.proto", 1)]))
    key_id = registry.register_schema("t-key", Schema(KEY, "PROTOBUF"))
    fmt = ProtobufFormat()
    pins = fmt.pin(registry, parsed, parsed.columns, {"t"}, {})
    assert [(p.part, p.subject, p.schema_id, p.chosen) for p in pins] == [
        ("value", "t-value", value_id, "newest"), ("key", "t-key", key_id, "newest")]
    # A replay keeps both; a batch planned before the keys were declared has no key pin: refused, never decoded
    # without it (its keys would all be dead letters).
    replayed = fmt.pin(registry, parsed, parsed.columns, {"t"}, {p.pinned: p for p in pins})
    assert [p.chosen for p in replayed] == ["pinned", "pinned"]
    bound = fmt.bound(registry, parsed, {p.pinned: p for p in pins}, {"t"}, 7)
    assert (bound.schemas["t"].reader_id, bound.key_schemas["t"].reader_id) == (value_id, key_id)
    with pytest.raises(SchemaRefused, match="batch 7 has no reader schema for the keys of topic\\(s\\) t"):
        fmt.bound(registry, parsed, {("value", "t"): pins[0]}, {"t"}, 7)
    wrong = parse_pipelines(json.dumps(pipeline({"format": "protobuf", "key_format": "protobuf"}, [
        {**key_column, "path": "customer"}, {"name": "order_id", "type": "string"}])))["p"]
    with pytest.raises(SchemaRefused, match="message shop.OrderKey of .* has no field customer"):
        fmt.pin(registry, wrong, wrong.columns, {"t"}, {})
