"""The doorbell: Airflow's triggerer starts a pipeline's run when new data waits in Kafka, without reading it.

Each poll compares the read_committed end offsets of the pipeline's partitions with the ledger's positions (one
ledger query, one Kafka offsets request; the subscription's partitions and their log starts again once a minute)
and rings when at least `min_backlog` offsets wait (planning.partition_lag: the one definition of lag). It never
joins a consumer group, commits an offset or writes anything. A ring only asks for a run: the run plans from the
ledger, never from the event, so a duplicate, lost or late ring costs at most one empty run, never a record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg2
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from confluent_kafka.admin import OffsetSpec

from kafka_ledger.config.pipeline import PipelineConfig, get_pipeline
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import task_services
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import PartitionOffsets, TopicPartition, partition_lag

log = logging.getLogger(__name__)

# How often the subscription's partitions are looked up again (a topic's new partitions, a pattern's new topics).
PARTITIONS_REFRESH_SECONDS = 60.0
# Kafka's answer to one offsets request is waited for this long; the poll then fails and the next one tries again.
KAFKA_TIMEOUT_SECONDS = 10.0


@dataclass
class RingRule:
    """When to ring: at least `min_backlog` offsets wait, and the doorbell has not rung since the pipeline's last
    progress (`progress`: the newest batch that moved a position; a run that commits its batch changes it), or it
    rang `ring_again_seconds` ago and there was no progress since (the ring was lost, or its run failed). While a
    run is under way there is no progress (its plan recording new partitions' start positions is none): no second
    ring queues a run behind it. A run that carries batch after batch (batch/carry.py) does progress, and holds a
    lease meanwhile: while `carrying`, the doorbell keeps quiet, and rings once the run has ended with data waiting."""

    min_backlog: int
    ring_again_seconds: float
    rung_at: float | None = None
    rung_for: int | None = None

    def rings(self, progress: int | None, backlog: int, now: float, carrying: bool = False) -> bool:
        if carrying or backlog < self.min_backlog:
            return False
        if self.rung_at is not None and progress == self.rung_for and now - self.rung_at < self.ring_again_seconds:
            return False
        self.rung_at, self.rung_for = now, progress
        return True


@dataclass(frozen=True)
class Look:
    """What one poll saw: each partition's lag, the pipeline's progress (the newest batch that moved a position,
    None before any), and whether a run is carrying its batches."""

    progress: int | None
    lag: dict[TopicPartition, int]
    carrying: bool = False

    @property
    def backlog(self) -> int:
        return sum(self.lag.values())

    def event(self, pipeline: str) -> dict[str, Any]:
        """The ring's payload (it only describes: the run it starts plans from the ledger)."""
        waiting = sorted(f"{tp.topic}-{tp.partition}" for tp, lag in self.lag.items() if lag)
        return {"pipeline": pipeline, "backlog": self.backlog, "partitions_waiting": len(waiting),
                "rung_at": datetime.now(UTC).isoformat(timespec="seconds")}


class Probe:
    """The look-ups of one doorbell, on connections it keeps between polls (closed on an error, opened again)."""

    def __init__(self, pipeline: PipelineConfig, services: Services):
        self.pipeline, self.services = pipeline, services
        self._conn: psycopg2.extensions.connection | None = None
        self._admin: kafka_offsets.ReportingAdminClient | None = None
        self._log_starts: dict[TopicPartition, int] = {}
        self._refreshed_at = float("-inf")

    def look(self, now: float) -> Look:
        if self._conn is None:
            self._conn = ledger.connect(self.services.ledger)
        with self._conn, self._conn.cursor() as cur:
            rows = ledger.position_rows(cur, self.pipeline.name)
            carrying = ledger.carrying_run(cur, self.pipeline.name) is not None
        positions = {row.topic_partition: row.position for row in rows}
        if now - self._refreshed_at >= PARTITIONS_REFRESH_SECONDS:
            offsets = kafka_offsets.subscribed_offsets(self.services.kafka, self.pipeline, KAFKA_TIMEOUT_SECONDS)
            self._log_starts = {tp: o.log_start for tp, o in offsets.items()}
            self._refreshed_at = now
        elif self._log_starts:
            if self._admin is None:
                self._admin = kafka_offsets.admin_client(self.services.kafka)
            ends = kafka_offsets.list_offsets(self._admin, sorted(self._log_starts), OffsetSpec.latest(),
                                              KAFKA_TIMEOUT_SECONDS)
            offsets = {tp: PartitionOffsets(log_start=start, end=ends[tp]) for tp, start in self._log_starts.items()}
        else:  # a pattern that matches no topic yet
            offsets = {}
        progress = max((row.last_batch_id for row in rows if row.last_batch_id is not None), default=None)
        return Look(progress, partition_lag(positions, offsets, self.pipeline.start_position), carrying)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._admin = None, None


class DoorbellTrigger(BaseEventTrigger):
    """The doorbell of one pipeline, run by Airflow's triggerer for the asset its DAG is scheduled on
    (airflow_dag.doorbell_asset): one long poll loop that yields an event each time it rings."""

    def __init__(self, pipeline: str, min_backlog: int = 1, poll_seconds: float = 5.0,
                 ring_again_seconds: float = 300.0):
        super().__init__()
        self.pipeline = pipeline
        self.min_backlog, self.poll_seconds, self.ring_again_seconds = min_backlog, poll_seconds, ring_again_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.{type(self).__name__}",
                {"pipeline": self.pipeline, "min_backlog": self.min_backlog, "poll_seconds": self.poll_seconds,
                 "ring_again_seconds": self.ring_again_seconds})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        rule = RingRule(self.min_backlog, self.ring_again_seconds)
        probe: Probe | None = None
        trouble = ""  # the last poll's error: said once as a warning, not every poll while it lasts
        try:
            while True:
                try:
                    if probe is None:
                        probe = await asyncio.to_thread(_probe, self.pipeline)
                    look = await asyncio.to_thread(probe.look, time.monotonic())
                    if trouble:
                        self.log.info("doorbell of %s looks again", self.pipeline)
                        trouble = ""
                    if rule.rings(look.progress, look.backlog, time.monotonic(), look.carrying):
                        event = look.event(self.pipeline)
                        self.log.info("doorbell of %s rings: %d offsets wait in %d partitions", self.pipeline,
                                      event["backlog"], event["partitions_waiting"])
                        yield TriggerEvent(event)
                except Exception as exc:  # a service away for a while: the next poll looks again, nothing is lost
                    if str(exc) != trouble:
                        self.log.warning("doorbell of %s could not look: %s", self.pipeline, exc)
                    trouble = str(exc)
                    if probe is not None:
                        probe.close()
                    probe = None
                await asyncio.sleep(self.poll_seconds)
        finally:  # cancelled (the DAG paused, its declaration changed, the triggerer stopping)
            if probe is not None:
                probe.close()


def _probe(pipeline_name: str) -> Probe:
    # In the triggerer, from the environment or the Airflow connections, as a task finds them.
    return Probe(get_pipeline(pipeline_name), task_services())
