"""A batch's Avro schemas from the schema registry (its Confluent API): the reader schema, pinned by id, and the
writer schemas its values may carry, every version of the subject, with why the reader cannot read some of them.

The registry's answers are immutable by id, and a subject only gains versions: what a batch resolves once it resolves
the same way on its retry or replay. A registry that cannot be reached or answers with an error fails the caller
(the batch fails and its retry resumes it): it never turns a record into a dead letter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kafka_ledger.formats.avro import TopicSchemas, columns_problems
from kafka_ledger.model.refusals import Refusal

if TYPE_CHECKING:
    from kafka_ledger.config.pipeline import ColumnSpec


class SchemaRegistryError(RuntimeError):
    """The registry could not say what a batch needs (unreachable, an error): the batch fails, its retry resumes it."""


class ReaderSchemaRefused(SchemaRegistryError, Refusal):
    """No reader schema can decode the pipeline's values as declared (a subject without versions, a schema that is
    not Avro, columns it cannot fill): nothing is planned until the declaration or the subject changes."""


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
        raise ReaderSchemaRefused(f"{what} is a {schema.schema_type} schema, not Avro")
    if schema.references:
        raise ReaderSchemaRefused(f"{what} refers to other schemas ({len(schema.references)} reference(s)), "
                                  "which kafka-ledger does not resolve yet")
    return schema.schema_str


@contextlib.contextmanager
def _asking(what: str, subject: str | None = None) -> Iterator[None]:
    """The registry's failures as SchemaRegistryError saying what was asked (a subject it does not know: refused)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError
    from httpx2 import HTTPError  # confluent-kafka's HTTP client: unreachable, a timeout

    try:
        yield
    except ClientError as exc:
        if subject is not None and exc.http_status_code == 404:
            raise ReaderSchemaRefused(f"the schema registry has no version of subject {subject} (register the "
                                      "values' schema, or name another subject in `value.subject`)") from exc
        raise SchemaRegistryError(f"the schema registry could not give {what}: {exc}") from exc
    except (HTTPError, OSError) as exc:
        raise SchemaRegistryError(f"the schema registry could not be reached for {what}: "
                                  f"{type(exc).__name__}: {exc}") from exc


def newest(client: Any, subject: str) -> tuple[int, int]:
    """The subject's newest version: (its schema id, its version number)."""
    with _asking(f"subject {subject}'s newest version", subject):
        latest = client.get_latest_version(subject)
    return latest.schema_id, latest.version


def newest_reader(client: Any, subject: str) -> tuple[int, int, str]:
    """The subject's newest version: its schema id, version number and schema (Avro's JSON)."""
    schema_id, version = newest(client, subject)
    with _asking(f"schema id {schema_id}"):
        return schema_id, version, _avro(client.get_schema(schema_id), f"version {version} of subject {subject}")


def check_reader(client: Any, columns: list[ColumnSpec], subject: str, schema_id: int) -> None:
    """Refuse a reader schema that cannot fill the columns (ReaderSchemaRefused naming each one)."""
    with _asking(f"schema id {schema_id}"):
        reader = _avro(client.get_schema(schema_id), f"the reader schema (id {schema_id}) of subject {subject}")
    problems = columns_problems(columns, TopicSchemas(subject, schema_id, reader, {}))
    if problems:
        raise ReaderSchemaRefused("; ".join(problems))


def topic_schemas(client: Any, subject: str, reader_id: int) -> TopicSchemas:
    """The schemas of a topic's values in a batch: the reader `reader_id` and every version of `subject` as writers."""
    with _asking(f"the schemas of subject {subject}"):
        reader = _avro(client.get_schema(reader_id), f"the reader schema (id {reader_id})")
        writers = {}
        for version in client.get_versions(subject):
            registered = client.get_version(subject, version)
            writers[registered.schema_id] = _avro(registered, f"version {version} of subject {subject}")
    unreadable = {writer_id: why for writer_id, writer in writers.items()
                  if (why := unreadable_reason(reader, writer)) is not None}
    return TopicSchemas(subject, reader_id, reader, writers, unreadable)


def newest_schemas(client: Any, subjects: dict[str, str]) -> dict[str, TopicSchemas]:
    """Each topic's schemas with its subject's newest version as the reader (`subjects`: topic -> subject), as a
    batch planned now would pin them (the Spark Connect server's warm-up reads with them)."""
    return {topic: topic_schemas(client, subject, newest(client, subject)[0]) for topic, subject in subjects.items()}
