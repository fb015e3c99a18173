"""Where rows are published (the output of a pipeline): one Sink per pipeline, chosen by sink_for()."""

from __future__ import annotations

from kafka_ledger.config import IcebergSinkSpec, PipelineConfig
from kafka_ledger.sinks.base import Sink
from kafka_ledger.sinks.iceberg import IcebergSink
from kafka_ledger.sinks.postgres import PostgresSink

__all__ = ["IcebergSink", "PostgresSink", "Sink", "sink_for"]


def sink_for(pipeline: PipelineConfig) -> Sink:
    """The pipeline's sink, as its declaration says: its Postgres output table, or its Iceberg table."""
    return IcebergSink(pipeline) if isinstance(pipeline.sink, IcebergSinkSpec) else PostgresSink(pipeline)
