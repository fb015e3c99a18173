"""Where rows are published (the output of a pipeline): one Sink per pipeline, chosen by sink_for()."""

from __future__ import annotations

from kafka_ledger.config import PipelineConfig
from kafka_ledger.sinks.base import Sink
from kafka_ledger.sinks.postgres import PostgresSink

__all__ = ["PostgresSink", "Sink", "sink_for"]


def sink_for(pipeline: PipelineConfig) -> Sink:
    """The pipeline's sink: its Postgres output table (the only kind so far)."""
    return PostgresSink(pipeline)
