"""Batch attempts as OpenTelemetry traces, seen through the SDK's in-memory exporter."""

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kafka_ledger.observe import events, traces
from kafka_ledger.observe.observer import LogObserver, Observers, default_observer


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=traces.AttemptIds())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return traces.TraceObserver(provider), exporter


def test_an_attempt_is_a_trace_with_the_plan_and_a_span_per_stage(traced):
    observer, exporter = traced
    stages = {"begin": 0.05, "session": 0.1, "to_first_rows": 0.4, "stream": 1.5, "waiting_for_spark": 0.9,
              "copying": 0.6, "commit": 0.2}
    observer.notify(events.BatchPlanned("clicks", 7, "catch_up", False, 3, 900, 0, seconds=0.3))
    observer.notify(events.AttemptStarted("clicks", 7, 1, 3, 900))
    observer.notify(events.BatchRead("clicks", 7, 1, 890, 4, 10, 1.9))
    observer.notify(events.BatchCommitted("clicks", 7, "catch_up", "public.clicks", 886, 4, 0, 3, 0.2, attempt=1,
                                          stages=stages, attempt_seconds=2.25))

    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"kafka_ledger.plan", "kafka_ledger.batch_attempt", "kafka_ledger.begin",
                          "kafka_ledger.session", "kafka_ledger.to_first_rows", "kafka_ledger.stream",
                          "kafka_ledger.commit"}
    root = spans["kafka_ledger.batch_attempt"]
    trace_id, span_id = traces.attempt_ids("clicks", 7, 1)
    assert (root.context.trace_id, root.context.span_id, root.parent) == (trace_id, span_id, None)
    assert {k: root.attributes[k] for k in ("kafka_ledger.pipeline", "kafka_ledger.batch_id", "kafka_ledger.attempt",
                                            "kafka_ledger.records_read", "kafka_ledger.records_written")} == {
        "kafka_ledger.pipeline": "clicks", "kafka_ledger.batch_id": 7, "kafka_ledger.attempt": 1,
        "kafka_ledger.records_read": 890, "kafka_ledger.records_written": 886}
    # The plan task's span joins the first attempt's trace, under its root, with nothing passed between them.
    plan = spans["kafka_ledger.plan"]
    assert (plan.context.trace_id, plan.parent.span_id) == (trace_id, span_id)
    assert plan.end_time - plan.start_time == pytest.approx(0.3e9, rel=1e-6)
    # The stages follow one another from the attempt's start, under the root.
    order = ["begin", "session", "to_first_rows", "stream", "commit"]
    chain = [spans[f"kafka_ledger.{stage}"] for stage in order]
    assert all(s.parent.span_id == span_id and s.context.trace_id == trace_id for s in chain)
    assert [round((s.end_time - s.start_time) / 1e9, 3) for s in chain] == [stages[s] for s in order]
    assert all(a.end_time == b.start_time for a, b in zip(chain, chain[1:], strict=False))
    assert chain[0].start_time == root.start_time
    assert spans["kafka_ledger.stream"].attributes["kafka_ledger.waiting_for_spark_seconds"] == 0.9


def test_each_attempt_is_a_trace_of_its_own_and_a_failure_is_an_error(traced):
    observer, exporter = traced
    observer.notify(events.AttemptStarted("clicks", 8, 1, 1, 10))
    observer.notify(events.BatchFailed("clicks", 8, "Spark job failed: boom"))
    observer.notify(events.AttemptStarted("clicks", 8, 2, 1, 10))
    observer.notify(events.BatchCommitted("clicks", 8, "catch_up", "public.clicks", 10, 0, 0, 1, 0.1, attempt=2,
                                          stages={"commit": 0.1}, attempt_seconds=0.5))

    roots = [s for s in exporter.get_finished_spans() if s.name == "kafka_ledger.batch_attempt"]
    assert [(s.attributes["kafka_ledger.attempt"], s.status.status_code) for s in roots] == [
        (1, StatusCode.ERROR), (2, StatusCode.UNSET)]
    assert [s.context.trace_id for s in roots] == [traces.attempt_ids("clicks", 8, n)[0] for n in (1, 2)]
    assert "boom" in roots[0].status.description


def test_a_resumed_batchs_plan_and_spans_after_a_root_get_ids_of_their_own(traced):
    observer, exporter = traced
    observer.notify(events.BatchPlanned("clicks", 9, "catch_up", True, 1, 10, 0, seconds=0.1))
    observer.notify(events.AttemptStarted("clicks", 9, 2, 1, 10))
    observer.notify(events.BatchCommitted("clicks", 9, "catch_up", "public.clicks", 10, 0, 0, 1, 0.1, attempt=2,
                                          stages={"begin": 0.01, "commit": 0.1}, attempt_seconds=0.5))
    spans = exporter.get_finished_spans()
    plan = next(s for s in spans if s.name == "kafka_ledger.plan")
    assert plan.parent is None and plan.context.trace_id not in {traces.attempt_ids("clicks", 9, n)[0] for n in (1, 2)}
    ids = [s.context.span_id for s in spans]
    assert len(set(ids)) == len(ids)


def test_a_commit_found_done_already_and_the_verify_make_no_span(traced):
    observer, exporter = traced
    observer.notify(events.BatchCommitted("clicks", 7, "catch_up", "public.clicks", 0, 0, 0, None, 0.0,
                                          already_committed=True))
    observer.notify(events.VerifyFinished("clicks", True, "full", 3, 100, 0, 1.0))
    assert exporter.get_finished_spans() == ()


def test_traces_only_when_an_otlp_endpoint_is_set(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(default_observer(), LogObserver)
    assert traces.otlp_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not traces.otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    observer = default_observer()
    assert isinstance(observer, Observers)
    assert [type(o) for o in observer.observers] == [LogObserver, traces.TraceObserver]
