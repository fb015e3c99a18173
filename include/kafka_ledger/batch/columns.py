"""The columns of a pipeline that leaves `columns:` out (its format's values have their schemas in the registry, or
carry them: the JsonConverter's): taken from its subject's newest schema (a topic's newest change event's) at its
first plan, recorded in the ledger, and extended by a later plan that finds a newer version with new fields.

Every entry point that reads, publishes or prepares a pipeline's table resolves its columns here first; a pipeline
that declares its columns passes through unchanged. A field added to the subject becomes a column at the first plan
that pins a version holding it, and the commit of that batch adds it to the output (sinks/postgres/evolution.py, the
Iceberg sink's evolve_schema); each batch still decodes with the schema its plan pinned: one pinned before a column
existed reads it as NULL (formats/avro.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka_ledger.config.pipeline import ColumnsUnknownError, PipelineConfig
from kafka_ledger.config.services import KafkaClient, LedgerDatabase, Services
from kafka_ledger.formats.known import value_format
from kafka_ledger.formats.schema_registry import SchemaNotSeen, SchemaRefused
from kafka_ledger.kafka.offsets import newest_values
from kafka_ledger.ledger import db as ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColumnSourcesOf:
    """Where a format finds the schema of derived columns (formats.base.ColumnSources): the schema registry and Kafka,
    each looked up when first asked (a JSON pipeline needs no registry; a registry format's derivation, no Kafka)."""

    registry_of: Callable[[], Any]
    kafka_of: Callable[[], KafkaClient]

    def registry(self) -> Any:
        return self.registry_of()

    def newest_values(self, topic: str) -> list[bytes]:
        return newest_values(self.kafka_of(), topic)


def column_sources(services: Services) -> ColumnSourcesOf:
    return ColumnSourcesOf(services.registry, lambda: services.kafka)


def _origin(pipeline: PipelineConfig, recorded: ledger.RecordedColumns) -> str:
    return value_format(pipeline).columns_origin(recorded.subject, recorded.schema_id, recorded.version)


def _applied(pipeline: PipelineConfig, recorded: ledger.RecordedColumns) -> PipelineConfig:
    try:
        return pipeline.with_columns(recorded.columns)
    except ValueError as exc:
        raise SchemaRefused(
            f"pipeline {pipeline.name} takes its columns from {_origin(pipeline, recorded)}, and they do not fit its "
            f"declaration: {exc}. Declare its `columns:` (`kafka-ledger columns` prints them)") from None


def with_recorded_columns(cur: ledger.Cursor, pipeline: PipelineConfig) -> PipelineConfig:
    """The pipeline with its columns: as declared, or those its first plan recorded (ColumnsUnknownError when none
    was recorded yet)."""
    if not pipeline.columns_from_reader_schema:
        return pipeline
    found = ledger.pipeline_columns(cur, pipeline.name)
    if found is None:
        raise ColumnsUnknownError(pipeline.name)
    return _applied(pipeline, found)


def with_recorded_columns_or_none(cur: ledger.Cursor, pipeline: PipelineConfig) -> PipelineConfig | None:
    """The pipeline with its columns, or None when it takes them from its reader schema and was never planned."""
    try:
        return with_recorded_columns(cur, pipeline)
    except ColumnsUnknownError:
        return None


def with_columns(db: LedgerDatabase, pipeline: PipelineConfig) -> PipelineConfig:
    """`with_recorded_columns` in a transaction of its own (no query for a pipeline that declares its columns)."""
    if not pipeline.columns_from_reader_schema:
        return pipeline
    with ledger.transaction(db) as cur:
        return with_recorded_columns(cur, pipeline)


def with_columns_or_none(db: LedgerDatabase, pipeline: PipelineConfig) -> PipelineConfig | None:
    """`with_recorded_columns_or_none` in a transaction of its own (none for a pipeline that declares its columns)."""
    try:
        return with_columns(db, pipeline)
    except ColumnsUnknownError:
        return None


def with_columns_taken(cur: ledger.Cursor, services: Services, pipeline: PipelineConfig,
                       topics: list[str]) -> PipelineConfig:
    """At a plan (in its transaction, `topics` those it subscribes to now): the pipeline with its columns, taken
    from the newest version of its subject (the first topic's) and recorded when this is its first plan."""
    if not pipeline.columns_from_reader_schema:
        return pipeline
    found = ledger.pipeline_columns(cur, pipeline.name)
    if found is None and pipeline.value.subject is None and not topics:
        raise SchemaRefused(
            f"pipeline {pipeline.name} takes its columns from its topics' reader schema, and none of its topics "
            "exists yet")
    fmt = value_format(pipeline)
    subject = found.subject if found else fmt.columns_subject(pipeline, topics)
    try:
        derived = fmt.derived_columns(column_sources(services), subject, pipeline.value.envelope)
    except SchemaNotSeen:
        if found is None:
            raise
        return _applied(pipeline, found)  # a topic emptied by retention: the columns taken before stand
    schema_id, version, columns = derived.schema_id, derived.version, derived.columns
    if found is not None and found.schema_id == schema_id:
        return _applied(pipeline, found)
    if found is None:
        found = ledger.record_pipeline_columns(cur, pipeline.name, ledger.RecordedColumns(
            subject, schema_id, version, columns))
        log.info("pipeline %s takes its columns from %s: %s", pipeline.name, _origin(pipeline, found),
                 ", ".join(f"{c['name']} {c['type']}" for c in found.columns))
        return _applied(pipeline, found)
    # A newer version: its new fields become columns, added to the output by the commit of this batch (the first
    # that reads them). A field it no longer has stays a column: the plan's check of the reader refuses it, naming it.
    known = {c["name"] for c in found.columns}
    added = [c for c in columns if c["name"] not in known]
    found = ledger.extend_pipeline_columns(cur, pipeline.name, ledger.RecordedColumns(
        subject, schema_id, version, [*found.columns, *added]))
    if added:
        log.info("pipeline %s takes the new field(s) of %s as column(s): %s; the commit of this batch adds them to "
                 "its output", pipeline.name, _origin(pipeline, found), ", ".join(f"{c['name']} {c['type']}"
                                                                                  for c in added))
    return _applied(pipeline, found)
