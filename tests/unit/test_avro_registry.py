"""A batch's Avro schemas as the registry gives them, asked of confluent-kafka's in-process registry (`mock://`)."""

import json

import pytest
from confluent_kafka.schema_registry import Schema

from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.config.services import SchemaRegistry
from kafka_ledger.formats.avro import check_reader, topic_schemas
from kafka_ledger.formats.schema_registry import SchemaRefused, SchemaRegistryError, newest

V1 = {"type": "record", "name": "Impression", "fields": [
    {"name": "event_id", "type": "string"}, {"name": "user_id", "type": "long"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "placement", "type": "string", "default": "feed"}]}
# user_id's type changed from long to string: values written so cannot be read with V2.
V3 = {**V1, "fields": [V1["fields"][0], {"name": "user_id", "type": "string"}]}


def columns(*declared: dict) -> list:
    return parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "value": {"format": "avro"}, "columns": list(declared)}}}))["p"].columns


@pytest.fixture
def registry():
    return SchemaRegistry("mock://unit").client()


def register(client, subject: str, schema: dict | str, schema_type: str = "AVRO") -> int:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return client.register_schema(subject, Schema(text, schema_type))


def test_the_newest_version_and_every_version_as_a_writer(registry):
    first, second = register(registry, "t-value", V1), register(registry, "t-value", V2)
    assert newest(registry, "t-value") == (second, 2)
    schemas = topic_schemas(registry, "t-value", second)
    assert (schemas.subject, schemas.reader_id, set(schemas.writers), schemas.unreadable) == (
        "t-value", second, {first, second}, {})
    # Pinned to the first version, the batch still reads with it after a newer one was registered.
    assert topic_schemas(registry, "t-value", first).reader_id == first


def test_a_version_the_reader_cannot_resolve_is_a_writer_with_its_reason(registry):
    register(registry, "t-value", V1)
    reader = register(registry, "t-value", V2)
    incompatible = register(registry, "t-value", V3)
    schemas = topic_schemas(registry, "t-value", reader)
    assert set(schemas.unreadable) == {incompatible}
    assert "reader type: long not compatible with writer type: string" in schemas.unreadable[incompatible]


def test_a_subject_without_versions_refuses_the_plan(registry):
    with pytest.raises(SchemaRefused, match="no version of subject orders-value"):
        newest(registry, "orders-value")


def test_a_reader_schema_that_cannot_fill_the_columns_or_is_not_avro_is_refused(registry):
    reader = register(registry, "t-value", V2)
    check_reader(registry, columns({"name": "event_id", "type": "string"}, {"name": "user_id", "type": "long"}),
                 "t-value", reader)
    with pytest.raises(SchemaRefused, match="column user_id .boolean. cannot hold the reader schema's user_id"):
        check_reader(registry, columns({"name": "user_id", "type": "boolean"}), "t-value", reader)
    json_schema = register(registry, "j-value", json.dumps({"type": "object"}), "JSON")
    with pytest.raises(SchemaRefused, match="is a JSON schema, not Avro"):
        check_reader(registry, columns({"name": "event_id", "type": "string"}), "j-value", json_schema)


def test_a_registry_that_cannot_be_reached_fails_the_caller_and_refuses_nothing():
    away = SchemaRegistry("http://127.0.0.1:9", {"max.retries": 0, "timeout": 2}).client()
    with pytest.raises(SchemaRegistryError, match="could not be reached") as raised:
        newest(away, "t-value")
    assert not isinstance(raised.value, SchemaRefused)
