"""The doorbell: Airflow's triggerer starts a pipeline's run when new data waits in Kafka, without reading it.

Each poll compares the read_committed end offsets of the pipeline's partitions with the ledger's positions (for all
the doorbells of a triggerer at once: one ledger transaction, one Kafka offsets request; the subscriptions'
partitions and their log starts again once a minute: Lookout) and rings when at least `min_backlog` offsets wait
(planning.partition_lag: the one definition of lag). It never joins a consumer group, commits an offset or writes
anything. A ring only asks for a run: the run plans from the ledger, never from the event, so a duplicate, lost or
late ring costs at most one empty run, never a record.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg2
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from confluent_kafka import KafkaException
from confluent_kafka.admin import OffsetSpec

from kafka_ledger.config.pipeline import PipelineConfig, PipelineDeclarations, config_path, read_pipelines
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import task_services
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import PartitionOffsets, PlanError, TopicPartition, partition_lag

log = logging.getLogger(__name__)

# How often the subscription's partitions are looked up again (a topic's new partitions, a pattern's new topics).
PARTITIONS_REFRESH_SECONDS = 60.0
# Kafka's answer to one offsets request is waited for this long; the poll then fails and the next one tries again.
KAFKA_TIMEOUT_SECONDS = 10.0
# The doorbells whose polls ask within this long of the first are looked up together.
GATHER_SECONDS = 0.1


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
    rung_for: Hashable = None

    def rings(self, progress: Hashable, backlog: int, now: float, carrying: bool = False) -> bool:
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

    progress: Hashable
    lag: dict[TopicPartition, int]
    carrying: bool = False

    @classmethod
    def of_members(cls, members: list[PipelineConfig], looks: list[Look]) -> Look:
        """A carrier's look at its members: the lag of those whose backlog reaches their own min_backlog, summed per
        partition; progress while any member's changes; carrying while any member is carried."""
        lag: dict[TopicPartition, int] = {}
        for member, look in zip(members, looks, strict=True):
            bell = member.doorbell
            if look.backlog >= (bell.min_backlog if bell is not None else 1):
                for tp, waiting in look.lag.items():
                    lag[tp] = lag.get(tp, 0) + waiting
        return cls(tuple(look.progress for look in looks), lag, any(look.carrying for look in looks))

    @property
    def backlog(self) -> int:
        return sum(self.lag.values())

    def event(self, watched: dict[str, str]) -> dict[str, Any]:
        """The ring's payload (it only describes: the run it starts plans from the ledger); `watched` names what
        rings ({"pipeline": name} or {"carrier": name})."""
        waiting = sorted(f"{tp.topic}-{tp.partition}" for tp, lag in self.lag.items() if lag)
        return {**watched, "backlog": self.backlog, "partitions_waiting": len(waiting),
                "rung_at": datetime.now(UTC).isoformat(timespec="seconds")}


class Lookout:
    """The look-ups of every doorbell of a triggerer process that talks to the same ledger and Kafka: at each poll,
    one ledger transaction and one Kafka offsets request for all the pipelines whose doorbells look at that moment
    (their polls fall on the same ticks: DoorbellTrigger.run), on one ledger connection and one Kafka admin client
    kept between polls. A connection each would hold a Postgres connection slot each: two hundred pipelines took
    every slot of the ledger's `max_connections`."""

    def __init__(self, services: Services):
        self.services = services
        self._conn: psycopg2.extensions.connection | None = None
        self._admin: kafka_offsets.ReportingAdminClient | None = None
        # Each pipeline's subscribed partitions with their log starts, and when they were looked up; by its name and
        # subscription (a pipeline declared anew with other topics is looked up at once).
        self._log_starts: dict[tuple[str, str], tuple[float, dict[TopicPartition, int]]] = {}
        self._asked: dict[str, tuple[PipelineConfig, list[asyncio.Future[Look]]]] = {}
        self._gathering: asyncio.Task[None] | None = None

    async def look(self, pipeline: PipelineConfig) -> Look:
        """What the pipeline's poll sees, looked up with the other doorbells' that ask within GATHER_SECONDS."""
        seen: asyncio.Future[Look] = asyncio.get_running_loop().create_future()
        self._asked.setdefault(pipeline.name, (pipeline, []))[1].append(seen)
        if self._gathering is None or self._gathering.done():
            self._gathering = asyncio.create_task(self._gather())
        return await seen

    async def _gather(self) -> None:
        while self._asked:
            await asyncio.sleep(GATHER_SECONDS)
            asked, self._asked = self._asked, {}
            try:
                looks = await asyncio.to_thread(self.look_all, [p for p, _ in asked.values()], time.monotonic())
            except Exception as exc:  # neither the ledger nor Kafka answered: every doorbell hears why
                looks = dict.fromkeys(asked, exc)
            for name, (_, waiting) in asked.items():
                for seen in waiting:
                    if seen.done():  # its doorbell was cancelled meanwhile
                        continue
                    if isinstance(found := looks[name], Exception):
                        seen.set_exception(found)
                    else:
                        seen.set_result(found)

    def look_all(self, pipelines: list[PipelineConfig], now: float) -> dict[str, Look | Exception]:
        """Each pipeline's look, or why its own could not be had (a topic Kafka lacks); raises when the ledger or
        Kafka did not answer at all."""
        names = [p.name for p in pipelines]
        try:
            if self._conn is None:
                self._conn = ledger.connect(self.services.ledger)
            with self._conn, self._conn.cursor() as cur:
                positions = ledger.pipelines_position_rows(cur, names)
                carrying = ledger.carrying_pipelines(cur, names)
        except psycopg2.Error:
            self._close_ledger()
            raise
        try:
            offsets, problems = self._offsets(pipelines, now)
        except (KafkaException, PlanError):
            self._admin = None  # a client made again: its reports of the connections' errors start afresh
            raise
        looks: dict[str, Look | Exception] = {}
        for pipeline in pipelines:
            if pipeline.name in problems:
                looks[pipeline.name] = PlanError(problems[pipeline.name])
                continue
            held = positions[pipeline.name]
            lag = partition_lag({tp: row.position for tp, row in held.items()}, offsets[pipeline.name],
                                pipeline.start_position)
            progress = max((row.last_batch_id for row in held.values() if row.last_batch_id is not None),
                           default=None)
            looks[pipeline.name] = Look(progress, lag, pipeline.name in carrying)
        return looks

    def _offsets(self, pipelines: list[PipelineConfig],
                 now: float) -> tuple[dict[str, dict[TopicPartition, PartitionOffsets]], dict[str, str]]:
        """Each pipeline's partitions with their offsets. Their partitions and log starts are looked up again once a
        minute (a topic's new partitions, a pattern's new topics), and at once for a pipeline new to this lookout or
        whose topics were missing; between, only the end offsets."""
        if self._admin is None:
            self._admin = kafka_offsets.admin_client(self.services.kafka)
        def known(pipeline: PipelineConfig) -> tuple[str, str]:
            return pipeline.name, pipeline.subscription

        stale = [p for p in pipelines
                 if now - self._log_starts.get(known(p), (float("-inf"), {}))[0] >= PARTITIONS_REFRESH_SECONDS]
        offsets, problems = (kafka_offsets.pipelines_offsets(self.services.kafka, stale, KAFKA_TIMEOUT_SECONDS,
                                                             self._admin) if stale else ({}, {}))
        for pipeline in stale:
            if pipeline.name in offsets:
                self._log_starts[known(pipeline)] = (now, {tp: o.log_start for tp, o in offsets[pipeline.name].items()})
            else:
                self._log_starts.pop(known(pipeline), None)
        fresh = [p for p in pipelines if p.name not in offsets and p.name not in problems]
        asked = sorted({tp for p in fresh for tp in self._log_starts[known(p)][1]})
        ends = (kafka_offsets.list_offsets(self._admin, asked, OffsetSpec.latest(), KAFKA_TIMEOUT_SECONDS)
                if asked else {})
        for pipeline in fresh:
            offsets[pipeline.name] = {tp: PartitionOffsets(log_start=start, end=ends[tp])
                                      for tp, start in self._log_starts[known(pipeline)][1].items()}
        return offsets, problems

    def _close_ledger(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


# One lookout per event loop (a triggerer runs its triggers in one) and per ledger and Kafka.
_lookouts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[object, ...], Lookout]] = (
    weakref.WeakKeyDictionary())


def lookout_for(services: Services) -> Lookout:
    """The lookout of the running event loop for those services."""
    kafka = services.kafka
    key = (services.ledger, kafka.servers, tuple(sorted(kafka.settings.items())))
    lookouts = _lookouts.setdefault(asyncio.get_running_loop(), {})
    if key not in lookouts:
        lookouts[key] = Lookout(services)
    return lookouts[key]


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

    def watched(self) -> dict[str, str]:
        """What this doorbell watches, as its events and log lines name it."""
        return {"pipeline": self.pipeline}

    def watched_pipelines(self) -> tuple[list[PipelineConfig], Services]:
        """The pipelines it watches as declared now, and the services (in a thread: it reads the pipelines file)."""
        pipeline, services = _pipeline_and_services(self.pipeline)
        return [pipeline], services

    async def watched_now(self, pipelines: list[PipelineConfig]) -> list[PipelineConfig]:
        """The pipelines to look at this poll: a pipeline's doorbell keeps the declaration it read (a new one is a
        new trigger: the DAG changed)."""
        return pipelines

    def combined(self, pipelines: list[PipelineConfig], looks: list[Look]) -> Look:
        """The one look the ring rule judges."""
        return looks[0]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        rule = RingRule(self.min_backlog, self.ring_again_seconds)
        pipelines: list[PipelineConfig] | None = None
        lookout: Lookout | None = None
        what = " ".join(f"{kind} {name}" for kind, name in self.watched().items())
        trouble = ""  # the last poll's error: said once as a warning, not every poll while it lasts
        partly = ""  # the pipelines the last poll could not look at (a carrier's members), and why
        while True:
            try:
                if lookout is None or pipelines is None:
                    pipelines, services = await asyncio.to_thread(self.watched_pipelines)
                    lookout = lookout_for(services)
                else:
                    pipelines = await self.watched_now(pipelines)
                answers = await asyncio.gather(*(lookout.look(p) for p in pipelines), return_exceptions=True)
                seen = [(p, a) for p, a in zip(pipelines, answers, strict=True) if isinstance(a, Look)]
                missed = [(p, a) for p, a in zip(pipelines, answers, strict=True) if not isinstance(a, Look)]
                for _, answer in missed:
                    if not isinstance(answer, Exception):  # cancelled
                        raise answer
                if not seen:
                    raise missed[0][1]
                # A carrier's member whose look failed (its topic missing) holds up none of the others.
                unseen = "; ".join(f"{p.name}: {answer}" for p, answer in missed)
                if unseen != partly:
                    if unseen:
                        self.log.warning("doorbell of %s could not look at %d of its pipelines: %s", what, len(missed),
                                         unseen)
                    partly = unseen
                look = self.combined([p for p, _ in seen], [answer for _, answer in seen])
                if trouble:
                    self.log.info("doorbell of %s looks again", what)
                    trouble = ""
                if rule.rings(look.progress, look.backlog, time.monotonic(), look.carrying):
                    event = look.event(self.watched())
                    self.log.info("doorbell of %s rings: %d offsets wait in %d partitions", what,
                                  event["backlog"], event["partitions_waiting"])
                    yield TriggerEvent(event)
            except Exception as exc:  # a service away for a while: the next poll looks again, nothing is lost
                if str(exc) != trouble:
                    self.log.warning("doorbell of %s could not look: %s", what, exc)
                trouble = str(exc)
                lookout = None  # the declarations and the services are read again
            # On the poll's ticks of the clock: the doorbells of one poll_seconds look together (Lookout).
            await asyncio.sleep(self.poll_seconds - time.time() % self.poll_seconds)


class CarrierDoorbellTrigger(DoorbellTrigger):
    """The doorbell of a carrier (config CarrierDeclaration): rings when any of its members has data waiting (at least
    that member's min_backlog), unless the carrier's run is carrying them; looks at all its members at once."""

    def __init__(self, carrier: str, poll_seconds: float = 5.0, ring_again_seconds: float = 300.0):
        super().__init__(carrier, 1, poll_seconds, ring_again_seconds)
        self.carrier = carrier

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.{type(self).__name__}",
                {"carrier": self.carrier, "poll_seconds": self.poll_seconds,
                 "ring_again_seconds": self.ring_again_seconds})

    def watched(self) -> dict[str, str]:
        return {"carrier": self.carrier}

    def watched_pipelines(self) -> tuple[list[PipelineConfig], Services]:
        return list(_declarations_now().carrier(self.carrier).members), task_services()

    async def watched_now(self, pipelines: list[PipelineConfig]) -> list[PipelineConfig]:
        # Members join and leave in the pipelines file, and the trigger's arguments do not show it: read at every poll
        # (a stat while the file is unchanged; parsed in a thread when it changed).
        return await asyncio.to_thread(lambda: list(_declarations_now().carrier(self.carrier).members))

    def combined(self, pipelines: list[PipelineConfig], looks: list[Look]) -> Look:
        return Look.of_members(pipelines, looks)


def _pipeline_and_services(pipeline_name: str) -> tuple[PipelineConfig, Services]:
    # In the triggerer, from the environment or the Airflow connections, as a task finds them.
    return _declarations_now().pipeline(pipeline_name), task_services()


def _declarations_now() -> PipelineDeclarations:
    """The pipelines file as it is now, read again only when it changed."""
    path = config_path()
    try:
        stat = path.stat()
    except OSError:
        return read_pipelines(path)  # its error says why the file cannot be read
    return _declarations(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _declarations(path: str, mtime_ns: int, size: int) -> PipelineDeclarations:
    """The pipelines file, read once for all the doorbells starting while it is unchanged: each reading it alone
    read two hundred pipelines two hundred times (10 s of the triggerer's CPU at its start)."""
    return read_pipelines(path)
