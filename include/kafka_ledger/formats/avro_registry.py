"""A batch's Avro schemas from the schema registry (its Confluent API): the reader schema, pinned by id, and the
writer schemas its values may carry, every version of the subject, with why the reader cannot read some of them.

The registry's answers are immutable by id, and a subject only gains versions: what a batch resolves once it resolves
the same way on its retry or replay. A registry that cannot be reached or answers with an error fails the caller
(the batch fails and its retry resumes it): it never turns a record into a dead letter.
"""

from __future__ import annotations

from typing import Any

from kafka_ledger.formats.avro import TopicSchemas


class SchemaRegistryError(RuntimeError):
    """The registry could not say what a batch needs (unreachable, an error, a subject without versions)."""


def unreadable_reason(reader: str, writer: str) -> str | None:
    """Why values written with `writer` cannot be resolved into `reader` (Avro's schema resolution), or None."""
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
    from avro.schema import parse

    result = ReaderWriterCompatibilityChecker().get_compatibility(parse(reader), parse(writer))
    if result.compatibility == SchemaCompatibilityType.compatible:
        return None
    where = sorted(location for location in result.locations if location != "/") or ["/"]
    return f"{'; '.join(sorted(result.messages))} (at {', '.join(where)})"


def _avro(registered: Any, what: str) -> str:
    schema = registered.schema if hasattr(registered, "schema") else registered
    if (schema.schema_type or "AVRO") != "AVRO":
        raise SchemaRegistryError(f"{what} is a {schema.schema_type} schema, not Avro")
    if schema.references:
        raise SchemaRegistryError(f"{what} refers to other schemas ({len(schema.references)} reference(s)), "
                                  "which kafka-ledger does not resolve yet")
    return schema.schema_str


def newest(client: Any, subject: str) -> tuple[int, int]:
    """The subject's newest version: (its schema id, its version number)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

    try:
        latest = client.get_latest_version(subject)
    except ClientError as exc:
        raise SchemaRegistryError(f"the schema registry has no version of subject {subject}: {exc}") from exc
    return latest.schema_id, latest.version


def topic_schemas(client: Any, subject: str, reader_id: int) -> TopicSchemas:
    """The schemas of a topic's values in a batch: the reader `reader_id` and every version of `subject` as writers."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

    try:
        reader = _avro(client.get_schema(reader_id), f"the reader schema (id {reader_id})")
        writers = {}
        for version in client.get_versions(subject):
            registered = client.get_version(subject, version)
            writers[registered.schema_id] = _avro(registered, f"version {version} of subject {subject}")
    except ClientError as exc:
        raise SchemaRegistryError(f"the schema registry could not give the schemas of subject {subject}: {exc}") \
            from exc
    unreadable = {writer_id: why for writer_id, writer in writers.items()
                  if (why := unreadable_reason(reader, writer)) is not None}
    return TopicSchemas(subject, reader_id, reader, writers, unreadable)
