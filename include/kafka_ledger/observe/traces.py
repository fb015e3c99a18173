"""OpenTelemetry traces of batch attempts: one trace per attempt, a span per stage, exported over OTLP when
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, nothing at all when it is not.

An attempt's trace and root span have ids derived from (pipeline, batch id, attempt): the plan task, another process,
puts its `plan` span into the first attempt's trace without any id passing between them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from kafka_ledger.observe import events
from kafka_ledger.observe.stages import STAGES

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

TRACER_NAME = "kafka_ledger"
ROOT_SPAN = "kafka_ledger.batch_attempt"
PLAN_SPAN = "kafka_ledger.plan"
# Stages measured inside another one (observe/stages.py): attributes of that span, not spans of their own.
INNER_STAGES = {"waiting_for_spark": "stream", "copying": "stream"}
FLUSH_TIMEOUT_MILLIS = 2000


def attempt_ids(pipeline: str, batch_id: int, attempt: int) -> tuple[int, int]:
    """The trace id and root span id of a batch attempt's trace (the same in every process)."""
    digest = hashlib.sha256(f"kafka-ledger\0{pipeline}\0{batch_id}\0{attempt}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def otlp_configured(environ: dict[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


class TraceObserver:
    """Turns a batch's events into spans: the root span of an attempt from its start to its commit (or failure), a
    child per stage the runtime timed, and the plan's span in the first attempt's trace."""

    def __init__(self, provider: TracerProvider, flush_timeout_millis: int = FLUSH_TIMEOUT_MILLIS):
        self.provider, self.flush_timeout_millis = provider, flush_timeout_millis
        self.tracer = provider.get_tracer(TRACER_NAME)
        self._started: dict[tuple[int, int], int] = {}  # (batch id, attempt) -> start, ns since the epoch
        self._read: dict[tuple[int, int], events.BatchRead] = {}

    def notify(self, event: events.Event) -> None:
        handler = getattr(self, f"_{type(event).__name__}", None)
        if handler is not None:
            handler(event)

    def _BatchPlanned(self, e: events.BatchPlanned) -> None:  # noqa: N802 - named after its event
        from opentelemetry import trace

        end = time.time_ns()
        attributes = {"kafka_ledger.pipeline": e.pipeline, "kafka_ledger.batch_id": e.batch_id,
                      "kafka_ledger.batch_kind": e.kind, "kafka_ledger.resumed": e.resumed,
                      "kafka_ledger.partitions": e.partitions, "kafka_ledger.offsets": e.offsets,
                      "kafka_ledger.backlog_after": e.backlog_after}
        context = None
        if not e.resumed:  # a new batch: its first attempt's trace (a resumed one's next attempt is not known here)
            trace_id, span_id = attempt_ids(e.pipeline, e.batch_id, 1)
            parent = trace.SpanContext(trace_id, span_id, is_remote=True,
                                       trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        span = self.tracer.start_span(PLAN_SPAN, context=context, start_time=end - int(e.seconds * 1e9),
                                      attributes=attributes)
        span.end(end_time=end)
        self._flush()

    def _AttemptStarted(self, e: events.AttemptStarted) -> None:  # noqa: N802
        self._started[e.batch_id, e.attempt] = time.time_ns()

    def _BatchRead(self, e: events.BatchRead) -> None:  # noqa: N802
        self._read[e.batch_id, e.attempt] = e

    def _BatchCommitted(self, e: events.BatchCommitted) -> None:  # noqa: N802
        if e.already_committed or e.attempt is None:
            return
        end = time.time_ns()
        start = self._started.pop((e.batch_id, e.attempt), None)
        if start is None:
            start = end - int((e.attempt_seconds or e.seconds) * 1e9)
        attributes = {"kafka_ledger.batch_kind": e.kind, "kafka_ledger.target": e.target,
                      "kafka_ledger.records_written": e.records_written,
                      "kafka_ledger.records_dead_lettered": e.records_dead_lettered,
                      "kafka_ledger.rows_replaced": e.replaced}
        root = self._root(e.pipeline, e.batch_id, e.attempt, start, attributes)
        self._stage_spans(root, start, e.stages)
        root.end(end_time=end)
        self._flush()

    def _BatchFailed(self, e: events.BatchFailed) -> None:  # noqa: N802
        from opentelemetry.trace import Status, StatusCode

        attempts = sorted(attempt for batch_id, attempt in self._started if batch_id == e.batch_id)
        if not attempts:
            return  # no attempt of it began in this process: its failure is the plan's or a previous run's
        attempt = attempts[-1]
        root = self._root(e.pipeline, e.batch_id, attempt, self._started.pop((e.batch_id, attempt)), {})
        root.set_status(Status(StatusCode.ERROR, e.error[:500]))
        root.end()
        self._flush()

    def _root(self, pipeline: str, batch_id: int, attempt: int, start: int, attributes: dict[str, Any]) -> Any:
        ids = self.provider.id_generator
        if isinstance(ids, AttemptIds):
            ids.preset(*attempt_ids(pipeline, batch_id, attempt))
        read = self._read.pop((batch_id, attempt), None)
        if read is not None:
            attributes = {**attributes, "kafka_ledger.records_read": read.records,
                          "kafka_ledger.offset_gaps": read.offset_gaps}
        return self.tracer.start_span(ROOT_SPAN, context=None, start_time=start, attributes={
            "kafka_ledger.pipeline": pipeline, "kafka_ledger.batch_id": batch_id, "kafka_ledger.attempt": attempt,
            **attributes})

    def _stage_spans(self, root: Any, start: int, stages: dict[str, float]) -> None:
        """The stages, one after the other from the attempt's start (they are laps of one stopwatch)."""
        from opentelemetry import trace

        context = trace.set_span_in_context(root)
        at = start
        for stage in STAGES:
            if stage in INNER_STAGES or stage not in stages:
                continue
            took = int(stages[stage] * 1e9)
            inner = {f"kafka_ledger.{name}_seconds": stages[name] for name, outer in INNER_STAGES.items()
                     if outer == stage and name in stages}
            span = self.tracer.start_span(f"kafka_ledger.{stage}", context=context, start_time=at,
                                          attributes={"kafka_ledger.stage": stage, **inner})
            span.end(end_time=at + took)
            at += took

    def _flush(self) -> None:
        # A task process may end right after its commit: its spans leave now, within a bound.
        if not self.provider.force_flush(self.flush_timeout_millis):
            log.warning("traces: the OTLP exporter did not take the spans within %d ms", self.flush_timeout_millis)


class AttemptIds:
    """Random ids (as the SDK's), except the next root span's when `preset`: its trace id and span id."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self._random = RandomIdGenerator()
        self._preset = threading.local()

    def preset(self, trace_id: int, span_id: int) -> None:
        self._preset.ids = (trace_id, span_id)
        self._preset.span_pending = False

    def generate_trace_id(self) -> int:
        ids = getattr(self._preset, "ids", None)
        if ids is None:
            return self._random.generate_trace_id()
        self._preset.span_pending = True  # the root span's own id is asked for next
        return ids[0]

    def generate_span_id(self) -> int:
        ids = getattr(self._preset, "ids", None)
        if ids is not None and getattr(self._preset, "span_pending", False):
            self._preset.ids, self._preset.span_pending = None, False
            return ids[1]
        return self._random.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return False


_PROVIDER: list[TracerProvider] = []
_PROVIDER_LOCK = threading.Lock()


def otlp_provider() -> TracerProvider:
    """The process's tracer provider exporting over OTLP as the OTEL_* variables say (http/protobuf unless
    OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL is grpc); made once per process, its own (never Airflow's global one)."""
    with _PROVIDER_LOCK:
        if not _PROVIDER:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get(
                "OTEL_SERVICE_NAME", "kafka-ledger")}), id_generator=AttemptIds())  # type: ignore[arg-type]
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            _PROVIDER.append(provider)
        return _PROVIDER[0]
