"""What every registry format asks of the schema registry (its Confluent API): a subject's newest version and a
schema by id, and the registry's failures in words.

The registry's answers are immutable by id, and a subject only gains versions: what a batch resolves once it resolves
the same way on its retry or replay. A registry that cannot be reached or answers with an error fails the caller
(the batch fails and its retry resumes it): it never turns a record into a dead letter.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar

from kafka_ledger.formats.base import DeclaredColumn, DeclaredPipeline, Pins, SchemaPin, ValueFormat
from kafka_ledger.model.refusals import Refusal

log = logging.getLogger(__name__)


class SchemaRegistryError(RuntimeError):
    """The registry could not say what a batch needs (unreachable, an error): the batch fails, its retry resumes it."""


class SchemaRefused(SchemaRegistryError, Refusal):
    """No schema can decode the pipeline's values as declared (a subject without versions, a schema of another
    format, columns it cannot fill): nothing is planned until the declaration or the subject changes."""


class SchemaNotSeen(SchemaRefused):
    """No schema to take columns from yet: a topic whose values carry their schema holds none (empty, or only
    tombstones). Columns taken before stand."""


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


class RegistryFormat(ValueFormat):
    """A format whose values carry a schema id the registry resolves (avro.py, protobuf.py): a batch pins each topic's
    reader schema when planned (its replayed batch's, else the subject's newest version, refused when it cannot fill
    the columns), and its read binds the format to the reader and every version of the subject as writers."""

    uses_registry = True
    derives_columns = True
    # The values (and keys, where the format reads them: `parts`) in a refusal ("Avro values").
    values_name: ClassVar[str]
    keys_name: ClassVar[str] = ""

    def declaration_problems(self, pipeline: DeclaredPipeline) -> list[str]:
        # Every format's rules, then the registry's: never another format's (Protobuf borrows JSON's reading only).
        problems = ValueFormat.declaration_problems(self, pipeline)
        read = self.parts(pipeline)
        inside = [c.name for c in pipeline.columns or [] if c.source not in read and c.field_path]
        if inside:
            problems.append(f"column(s) {', '.join(inside)}: with format {self.name} a key or header column reads the "
                            "whole key or header (no path)" + (" unless the keys are in the format too (key_format)"
                                                               if "key_format" in self.options else ""))
        whole = [c.name for c in pipeline.columns or [] if c.source in read and not c.field_path]
        if whole:
            problems.append(f"column(s) {', '.join(whole)}: with key_format {self.name} a key column reads a field of "
                            "the key (its path)")
        return problems

    def can_derive_columns(self, pipeline: DeclaredPipeline) -> bool:
        return True  # every version in the registry has its schema (before JSON's rule, which Protobuf borrows)

    def columns_subject(self, pipeline: DeclaredPipeline, topics: list[str]) -> str:
        return pipeline.value.subject or pipeline.value.subject_of(min(topics))

    def columns_origin(self, subject: str, schema_id: int, version: int) -> str:
        return f"version {version} of subject {subject} (schema id {schema_id})"

    def parts(self, pipeline: DeclaredPipeline) -> tuple[str, ...]:
        """What of a topic's records the pipeline reads with the registry's schemas: its values, and its keys where
        the declaration says they are in the format too (a pin each, per topic)."""
        return ("value",)

    def subject_of(self, pipeline: DeclaredPipeline, part: str, topic: str) -> str:
        """The subject of a topic's values (or keys)."""
        return pipeline.value.subject_of(topic)

    def check_reader(self, registry: Any, pipeline: DeclaredPipeline, columns: list[DeclaredColumn], subject: str,
                     schema_id: int, version: int, part: str = "value") -> None:
        """Refuse a reader schema that cannot fill the columns of the records' `part` (SchemaRefused naming each
        one)."""
        raise NotImplementedError

    def topic_schemas(self, registry: Any, subject: str, reader_id: int) -> Any:
        """A topic's schemas in a batch: the reader `reader_id` and every version of `subject` as writers."""
        raise NotImplementedError

    def with_schemas(self, schemas: Mapping[tuple[str, str], Any]) -> RegistryFormat:
        """The format with a batch's schemas, by (part, topic)."""
        raise NotImplementedError

    def pin(self, registry: Any, pipeline: DeclaredPipeline, columns: list[DeclaredColumn], topics: set[str],
            replayed: Pins) -> list[SchemaPin]:
        pinned = []
        for topic in sorted(topics):
            for part in self.parts(pipeline):
                if (part, topic) in replayed:
                    pinned.append(replace(replayed[(part, topic)], chosen="pinned"))
                    continue
                subject = self.subject_of(pipeline, part, topic)
                schema_id, version = newest(registry, subject)
                self.check_reader(registry, pipeline, columns, subject, schema_id, version, part)
                pinned.append(SchemaPin(topic, subject, schema_id, version, "newest", part))
                log.info("topic %s: %ss read with version %s of subject %s (schema id %s)", topic, part, version,
                         subject, schema_id)
        return pinned

    def bound(self, registry: Any, pipeline: DeclaredPipeline, pins: Pins, topics: set[str], batch_id: int
              ) -> RegistryFormat:
        for part in self.parts(pipeline):
            unpinned = sorted(topic for topic in topics if (part, topic) not in pins)
            if unpinned:
                what = self.values_name if part == "value" else self.keys_name
                raise SchemaRefused(
                    f"batch {batch_id} has no reader schema for the {part}s of topic(s) {', '.join(unpinned)}: it was "
                    f"planned before the pipeline declared {what}; replay its ranges as a new batch "
                    "(`kafka-ledger replay`)")
        return self.with_schemas({pinned: self.topic_schemas(registry, pin.subject, pin.schema_id)
                                  for pinned, pin in pins.items() if pinned[0] in self.parts(pipeline)})

    def newest(self, registry: Any, pipeline: DeclaredPipeline, topics: set[str]) -> RegistryFormat:
        subjects = {(part, topic): self.subject_of(pipeline, part, topic)
                    for topic in sorted(topics) for part in self.parts(pipeline)}
        return self.with_schemas({pinned: self.topic_schemas(registry, subject, newest(registry, subject)[0])
                                  for pinned, subject in subjects.items()})
