"""Observers of a pipeline's events (events.py): the log (today's lines, `LogObserver`), and any others a deployment
adds (metrics, traces). An observer that fails never fails the batch it watches."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from kafka_ledger.observe import events, traces
from kafka_ledger.observe.stages import describe

log = logging.getLogger(__name__)


class Observer(Protocol):
    """Receives every event of the pipelines it watches."""

    def notify(self, event: events.Event) -> None:
        """Take note of `event`; never raise for the batch's sake (Observers catches what escapes)."""


class LogObserver:
    """Events as lines of the task's log (the logger `kafka_ledger.events`): what the task did, in words."""

    def __init__(self, logger: logging.Logger | None = None):
        self.log = logger or logging.getLogger("kafka_ledger.events")

    def notify(self, event: events.Event) -> None:
        handler = getattr(self, f"_{type(event).__name__}", None)
        if handler is not None:
            handler(event)

    def _BatchPlanned(self, e: events.BatchPlanned) -> None:  # noqa: N802 - named after its event
        ranges = "\n".join(f"  {r}" for r in e.ranges)
        if e.resumed:
            self.log.info("resuming %s batch %s of %s%s with its recorded ranges:\n%s", e.kind, e.batch_id,
                          e.pipeline, f" ({e.detail})" if e.detail else "", ranges)
        elif e.kind == "catch_up":
            self.log.info("planned batch %s of %s (%s): %d partition(s), %d offsets, %d offsets left for later "
                          "batches:\n%s", e.batch_id, e.pipeline, e.detail, e.partitions, e.offsets, e.backlog_after,
                          ranges)
        else:
            self.log.info("planned %s batch %s of %s%s: %d offsets to re-read and replace:\n%s", e.kind, e.batch_id,
                          e.pipeline, f" ({e.detail})" if e.detail else "", e.offsets, ranges)

    def _AttemptStarted(self, e: events.AttemptStarted) -> None:  # noqa: N802
        self.log.info("batch %s of %s, attempt %d: reading %d range(s), %d offsets%s", e.batch_id, e.pipeline,
                      e.attempt, e.partitions, e.offsets,
                      f" (removed {e.removed_staged} rows staged by earlier attempts)" if e.removed_staged else "")

    def _BatchRead(self, e: events.BatchRead) -> None:  # noqa: N802
        self.log.info("batch %s read: %d records in %.1fs (%.0f records/s), %d to dead letters, %d offset gap(s) "
                      "(transaction markers, aborted or compacted records)", e.batch_id, e.records, e.seconds,
                      e.records / e.seconds if e.seconds else 0.0, e.dead_letters, e.offset_gaps)

    def _BatchCommitted(self, e: events.BatchCommitted) -> None:  # noqa: N802
        if e.already_committed:
            self.log.info("batch %s was already committed: nothing to do", e.batch_id)
            return
        self.log.info("committed %s batch %s of %s: %d rows into %s (%d rows of earlier runs replaced), %d dead "
                      "letters, %s in %.2fs", e.kind, e.batch_id, e.pipeline, e.records_written, e.target, e.replaced,
                      e.records_dead_lettered,
                      "positions unchanged" if e.positions_advanced is None
                      else f"{e.positions_advanced} partition position(s) advanced", e.seconds)
        if e.attempt_seconds is not None:
            self.log.info("batch %s attempt %d took %.2f s%s: %s", e.batch_id, e.attempt, e.attempt_seconds,
                          f" ({e.artifact})" if e.artifact else "", describe(e.stages))

    def _BatchFailed(self, e: events.BatchFailed) -> None:  # noqa: N802
        self.log.error("batch %s of %s marked failed; the next run resumes it with the same ranges: %s", e.batch_id,
                       e.pipeline, e.error)

    def _VerifyFinished(self, e: events.VerifyFinished) -> None:  # noqa: N802
        self.log.info("verify %s %s: %s, %d partition(s), %d records compared, %d problem(s), in %.1f s", e.pipeline,
                      e.mode, "OK" if e.ok else "PROBLEMS", e.partitions, e.records_compared, e.problems, e.seconds)


class Observers:
    """Several observers as one: each gets every event; one that raises is logged and the others go on."""

    def __init__(self, observers: Iterable[Observer]):
        self.observers = list(observers)

    def notify(self, event: events.Event) -> None:
        for observer in self.observers:
            try:
                observer.notify(event)
            except Exception as exc:  # noqa: BLE001 - an observer never fails the batch it watches
                log.warning("observer %s failed on %s: %s", type(observer).__name__, type(event).__name__, exc)


class Recorder:
    """Keeps every event it is told of, in order (the tests', the benchmark's)."""

    def __init__(self) -> None:
        self.events: list[events.Event] = []

    def notify(self, event: events.Event) -> None:
        self.events.append(event)


def default_observer() -> Observer:
    """What hears a deployment's events: the log, and OpenTelemetry traces when OTLP is configured (traces.py)."""
    if traces.otlp_configured():
        return Observers([LogObserver(), traces.TraceObserver(traces.otlp_provider())])
    return LogObserver()
