"""What every registry format asks of the schema registry (its Confluent API): a subject's newest version and a
schema by id, and the registry's failures in words.

The registry's answers are immutable by id, and a subject only gains versions: what a batch resolves once it resolves
the same way on its retry or replay. A registry that cannot be reached or answers with an error fails the caller
(the batch fails and its retry resumes it): it never turns a record into a dead letter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kafka_ledger.model.refusals import Refusal


class SchemaRegistryError(RuntimeError):
    """The registry could not say what a batch needs (unreachable, an error): the batch fails, its retry resumes it."""


class SchemaRefused(SchemaRegistryError, Refusal):
    """No schema can decode the pipeline's values as declared (a subject without versions, a schema of another
    format, columns it cannot fill): nothing is planned until the declaration or the subject changes."""


@contextlib.contextmanager
def asking(what: str, subject: str | None = None) -> Iterator[None]:
    """The registry's failures as SchemaRegistryError saying what was asked (a subject it does not know: refused)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError
    from httpx2 import HTTPError  # confluent-kafka's HTTP client: unreachable, a timeout

    try:
        yield
    except ClientError as exc:
        if subject is not None and exc.http_status_code == 404:
            raise SchemaRefused(f"the schema registry has no version of subject {subject} (register the values' "
                                "schema, or name another subject in `value.subject`)") from exc
        raise SchemaRegistryError(f"the schema registry could not give {what}: {exc}") from exc
    except (HTTPError, OSError) as exc:
        raise SchemaRegistryError(f"the schema registry could not be reached for {what}: "
                                  f"{type(exc).__name__}: {exc}") from exc


def schema_of(registered: Any, what: str, schema_type: str) -> Any:
    """A registered schema (a client's Schema, or its RegisteredSchema) of `schema_type` (`AVRO`, `PROTOBUF`), or
    SchemaRefused naming what it is instead."""
    schema = registered.schema if hasattr(registered, "schema") else registered
    if (schema.schema_type or "AVRO") != schema_type:
        raise SchemaRefused(f"{what} is a {schema.schema_type or 'AVRO'} schema, not {schema_type.capitalize()}")
    return schema


def newest(client: Any, subject: str) -> tuple[int, int]:
    """The subject's newest version: (its schema id, its version number)."""
    with asking(f"subject {subject}'s newest version", subject):
        latest = client.get_latest_version(subject)
    return latest.schema_id, latest.version


def newest_schema(client: Any, subject: str) -> tuple[int, int, Any]:
    """The subject's newest version: its schema id, version number and schema (the client's Schema)."""
    schema_id, version = newest(client, subject)
    with asking(f"schema id {schema_id}"):
        return schema_id, version, client.get_schema(schema_id)
