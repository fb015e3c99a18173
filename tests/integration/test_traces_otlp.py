"""Traces on the real stack: a batch planned here and read and committed by a task process of its own reaches a
real OpenTelemetry Collector over OTLP as one trace, the plan's span included."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from integration_support import finish, good_value, stack, start_task

from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config import settings
from kafka_ledger.observe import traces

pytestmark = pytest.mark.integration


def collector_spans(log: Path, trace_id: int) -> list[dict[str, object]]:
    """The spans of `trace_id` the collector's debug exporter wrote to its log: name, ids, attributes."""
    spans, span = [], None
    for line in log.read_text(errors="replace").splitlines():
        if re.match(r"\s*Span #\d+", line):
            span = {"attributes": {}}
            spans.append(span)
        elif span is not None and (field := re.match(r"\s+(Trace ID|Parent ID|ID|Name)\s+:\s*(\S*)", line)):
            span[field.group(1)] = field.group(2)
        elif span is not None and (attribute := re.match(r"\s+-> (kafka_ledger\.\w+): \w+\((.*)\)$", line)):
            span["attributes"][attribute.group(1)] = attribute.group(2)
    return [s for s in spans if s.get("Trace ID") == f"{trace_id:032x}"]


def test_a_batch_attempt_reaches_a_real_collector_as_one_trace(dsn, servers, producer, pipeline_factory,
                                                               monkeypatch):
    stack("otel-collector")
    log = Path(os.environ["KL_STATE"]) / "logs" / "otel-collector.log"
    endpoint = f"http://127.0.0.1:{os.environ['KL_OTLP_PORT']}"
    pipeline = pipeline_factory("traces", partitions=2)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(50)])

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    batch_id = plan_next_batch(settings.services_for(dsn, servers), pipeline).batch_id
    code, _, err = finish(start_task(pipeline, batch_id, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint))
    assert code == 0, err

    trace_id, root_id = traces.attempt_ids(pipeline.name, batch_id, 1)
    deadline = time.monotonic() + 30
    while True:
        spans = {s["Name"]: s for s in collector_spans(log, trace_id)}
        if {"kafka_ledger.plan", "kafka_ledger.batch_attempt", "kafka_ledger.commit"} <= set(spans):
            break
        assert time.monotonic() < deadline, f"the collector has only {sorted(spans)} of trace {trace_id:032x}"
        time.sleep(0.5)
    root = spans["kafka_ledger.batch_attempt"]
    assert (root["ID"], root["Parent ID"]) == (f"{root_id:016x}", "")
    assert root["attributes"]["kafka_ledger.batch_id"] == str(batch_id)
    assert root["attributes"]["kafka_ledger.records_written"] == "50"
    # Every stage the connect runtime times, and the plan of this process, under the attempt's root span.
    assert {"kafka_ledger.begin", "kafka_ledger.session", "kafka_ledger.to_first_rows", "kafka_ledger.stream",
            "kafka_ledger.commit", "kafka_ledger.plan"} <= set(spans)
    assert {name: span["Parent ID"] for name, span in spans.items() if name != "kafka_ledger.batch_attempt"} == {
        name: f"{root_id:016x}" for name in spans if name != "kafka_ledger.batch_attempt"}
