"""The stack's schema registry (Apicurio Registry, its Confluent API) as kafka-ledger's settings find it."""

from __future__ import annotations

import json
import uuid

import pytest
from integration_support import stack

from kafka_ledger.config import settings

pytestmark = pytest.mark.integration


def _schema(name: str, *fields: dict) -> str:
    return json.dumps({"type": "record", "name": name, "fields": list(fields)})


def test_the_registry_keeps_the_versions_of_a_subject_and_their_ids():
    from confluent_kafka.schema_registry import Schema

    client = settings.schema_registry().client()
    subject = f"it-{uuid.uuid4().hex[:8]}-value"
    v1 = _schema("Impression", {"name": "id", "type": "long"})
    v2 = _schema("Impression", {"name": "id", "type": "long"}, {"name": "city", "type": "string", "default": ""})
    first = client.register_schema(subject, Schema(v1, "AVRO"))
    second = client.register_schema(subject, Schema(v2, "AVRO"))
    assert first != second
    assert client.register_schema(subject, Schema(v1, "AVRO")) == first  # the same schema keeps its id
    latest = client.get_latest_version(subject)
    assert (latest.schema_id, latest.version) == (second, 2)
    assert json.loads(client.get_schema(first).schema_str) == json.loads(v1)


@pytest.mark.own_stack  # it restarts the registry every test shares
@pytest.mark.parametrize("how", ["restart-schema-registry", "kill-schema-registry"])
def test_a_restarted_registry_still_knows_every_id(how):
    """Records on the topics carry their writer schema's id: a registry that forgot it would make them unreadable."""
    from confluent_kafka.schema_registry import Schema

    registry = settings.schema_registry()
    subject = f"it-{uuid.uuid4().hex[:8]}-value"
    schema = _schema("Kept", {"name": "id", "type": "long"})
    schema_id = registry.client().register_schema(subject, Schema(schema, "AVRO"))
    stack(how)
    if how == "kill-schema-registry":
        stack("start")
    client = registry.client()  # a new client: nothing cached
    assert json.loads(client.get_schema(schema_id).schema_str) == json.loads(schema)
    assert client.get_latest_version(subject).schema_id == schema_id


def test_the_cli_declares_the_columns_of_a_subject_s_newest_version():
    from confluent_kafka.schema_registry import Schema
    from integration_support import cli

    client = settings.schema_registry().client()
    subject = f"it-{uuid.uuid4().hex[:8]}-value"
    client.register_schema(subject, Schema(_schema("Order", {"name": "id", "type": "long"}), "AVRO"))
    newest = client.register_schema(subject, Schema(_schema(
        "Order", {"name": "id", "type": "long"}, {"name": "city", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "lines", "type": {"type": "array", "items": "string"}, "default": []}), "AVRO"))
    code, out, _ = cli("columns", subject)
    assert (code, out) == (0, {"subject": subject, "version": 2, "schema_id": newest, "columns": [
        {"name": "id", "type": "long"}, {"name": "city", "type": "string"}, {"name": "amount", "type": "decimal(9,2)"},
        {"name": "lines", "type": "jsonb"}]})
    code, out, err = cli("columns", f"it-{uuid.uuid4().hex[:8]}-value")
    assert (code, out) == (3, None) and "no version of subject" in err
    # A subject of Debezium's change events: the fields of their row image; a subject of rows is no such subject.
    events = f"it-{uuid.uuid4().hex[:8]}-value"
    row = json.loads(_schema("Value", {"name": "id", "type": "long"}, {"name": "Email", "type": "string"}))
    schema_id = client.register_schema(events, Schema(json.dumps({
        "type": "record", "name": "Envelope", "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None}, {"name": "op", "type": "string"}]}), "AVRO"))
    code, out, _ = cli("columns", events, "--envelope", "debezium")
    assert (code, out) == (0, {"subject": events, "version": 1, "schema_id": schema_id, "columns": [
        {"name": "id", "type": "long"}, {"name": "email", "type": "string", "path": "Email"}]})
    code, out, err = cli("columns", subject, "--envelope", "debezium")
    assert code == 3 and "not a change event's schema: the reader schema has no field after" in err
