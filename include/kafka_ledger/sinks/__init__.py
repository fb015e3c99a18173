"""Where rows are published (the output of a pipeline): one Sink per pipeline, chosen by sink_for()."""

from __future__ import annotations

from kafka_ledger.config.pipeline import IcebergSinkSpec, PipelineConfig
from kafka_ledger.sinks.base import Sink
from kafka_ledger.sinks.iceberg.sink import IcebergSink
from kafka_ledger.sinks.postgres.sink import PostgresEntitySink, PostgresSink

__all__ = ["IcebergSink", "PostgresEntitySink", "PostgresSink", "Sink", "sink_for"]


def sink_for(pipeline: PipelineConfig) -> Sink:
    """The pipeline's sink, as its declaration says: its Postgres output table (an entity table with write: upsert),
    or its Iceberg table."""
    if isinstance(pipeline.sink, IcebergSinkSpec):
        return IcebergSink(pipeline)
    return PostgresEntitySink(pipeline) if pipeline.is_entity_table else PostgresSink(pipeline)
