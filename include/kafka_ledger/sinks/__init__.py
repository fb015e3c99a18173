"""Where rows are published (the output of a pipeline): one Sink per pipeline, chosen by sink_for()."""

from __future__ import annotations

from kafka_ledger.config.pipeline import IcebergSinkSpec, PipelineConfig
from kafka_ledger.ledger import db as ledger
from kafka_ledger.sinks.base import Artifact, ArtifactSink, OutputView, Sink, TransactionalSink
from kafka_ledger.sinks.iceberg.sink import IcebergSink
from kafka_ledger.sinks.postgres.sink import PostgresEntitySink, PostgresSink

__all__ = ["Artifact", "ArtifactSink", "OutputView", "Sink", "TransactionalSink", "remove_pipeline", "sink_for"]


def sink_for(pipeline: PipelineConfig) -> Sink:
    """The pipeline's sink, as its declaration says: its Postgres output table (an entity table with write: upsert),
    or its Iceberg table."""
    if isinstance(pipeline.sink, IcebergSinkSpec):
        return IcebergSink(pipeline)
    return PostgresEntitySink(pipeline) if pipeline.is_entity_table else PostgresSink(pipeline)


def remove_pipeline(cur: ledger.Cursor, pipeline: PipelineConfig) -> None:
    """Remove every trace of a pipeline in the ledger's database: its ledger rows, staging table and its sink's
    tables there (a test's, a benchmark's or a campaign's pipeline at its end)."""
    ledger.delete_pipeline(cur, pipeline)
    sink_for(pipeline).drop(cur)
