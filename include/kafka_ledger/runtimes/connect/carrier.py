"""A carrier: many small pipelines' batches read together in one Spark session, decoded by one Spark job per decode
shape, and each pipeline's rows published with its offsets in a Postgres transaction of its own.

A batch read on its own costs Spark's fixed work of a query (planning, scheduling, a consumer per partition) whatever
its size: 0.72 CPU-seconds for a batch of 1,250 records (docs/benchmark.md, "Two hundred pipelines"), so two hundred
pipelines with a little data each could not be kept fresh on a small machine. A carrier's cycle looks up Kafka once for
all its member pipelines, plans each one's next batch in the ledger as its own run would (before anything is read),
reads all their ranges with one wide read (batch/wide_read.py), decodes the members that decode alike
(publish.decode_shape) in one publish frame, streams its rows to this process and splits them per member, and commits
each member's rows in its own transaction, under its own attempt's fencing and read-coverage check, exactly as a batch
of its own would be committed. A member whose commit fails leaves its batch open for the next cycle, with the same
ranges; the others go on. Two members that read one partition are carried in separate waves: the wide reader reads each
partition once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kafka_ledger.batch import commit, read
from kafka_ledger.batch import plan as planner
from kafka_ledger.batch.columns import with_columns
from kafka_ledger.batch.commit import CommitResult, Streamed, Written
from kafka_ledger.batch.publish import decode_shape, publish_frame
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import PlanError, TopicPartition
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.runtimes.connect.batch import AttemptInterrupted, arrow_stream
from kafka_ledger.sinks import TransactionalSink, sink_for
from kafka_ledger.spark.connect import (
    Heartbeat,
    client_session,
    close_session,
    closed_session,
    configure,
    headline,
    let_go,
    spark_failure,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

# Names a carrier's session on the Spark Connect server (Carrier._session).
SESSION_NAMESPACE = uuid.UUID("0b6c3d2e-8f41-4a57-9e0d-5c2a7f1b9e63")
# The column of a carrier's publish frame that says which member of the frame's shape a row belongs to.
MEMBER = "_carrier_member"

# The members' plans and commits run on this many threads at once: each waits on Postgres and Kafka more than it
# computes, and each holds a ledger connection while it runs.
MEMBER_THREADS = 4

T = TypeVar("T")
R = TypeVar("R")


class CarrierError(RuntimeError):
    """The carrier cannot carry a pipeline this way (its sink, its runtime), or its rows did not split cleanly."""


def requested_by(carrier: str) -> str:
    """Who asked for the batches a carrier plans, as the ledger records it."""
    return f"carrier {carrier}"


def in_waves(members: Sequence[T], partitions: Callable[[T], set[TopicPartition]]) -> list[list[T]]:
    """The members in waves, in their order, first fit: no two members of a wave read one partition."""
    waves: list[tuple[list[T], set[TopicPartition]]] = []
    for member in members:
        wanted = partitions(member)
        for wave, taken in waves:
            if not wanted & taken:
                wave.append(member)
                taken |= wanted
                break
        else:
            waves.append(([member], set(wanted)))
    return [wave for wave, _ in waves]


def by_shape(members: Sequence[T], shape: Callable[[T], Hashable | None]) -> list[list[T]]:
    """The members grouped by decode shape, in order of first appearance; a member of no shape (None) alone."""
    groups: dict[Hashable, list[T]] = {}
    for i, member in enumerate(members):
        key = shape(member)
        groups.setdefault(("alone", i) if key is None else ("shape", key), []).append(member)
    return list(groups.values())


@dataclass(frozen=True)
class Member:
    """A member pipeline's batch in this cycle: its attempt begun, ranges to read."""

    pipeline: PipelineConfig
    attempt: read.Attempt

    @property
    def name(self) -> str:
        return self.pipeline.name

    @property
    def batch_id(self) -> int:
        return self.attempt.batch.batch_id

    @property
    def partitions(self) -> set[TopicPartition]:
        return {r.topic_partition for r in self.attempt.readable}

    def shape(self) -> str | None:
        return decode_shape(self.pipeline, sink_for(self.pipeline), self.attempt.value_format)


@dataclass
class Cycle:
    """What one carrying cycle did: each member's commit, or why its batch stays open for the next cycle."""

    results: dict[str, CommitResult] = field(default_factory=dict)
    failures: dict[str, BaseException] = field(default_factory=dict)
    caught_up: list[str] = field(default_factory=list)
    waves: int = 0
    jobs: int = 0

    @property
    def records_written(self) -> int:
        return sum(r.records_written for r in self.results.values())

    @property
    def records_dead_lettered(self) -> int:
        return sum(r.records_dead_lettered for r in self.results.values())


class Carrier:
    """Carries the batches of its member pipelines, a cycle at a time (`carry`), in one Spark Connect session of its
    own. `interrupt()`, from another thread (Airflow's on_kill), stops the running cycle's query: nothing of it is
    published after that."""

    def __init__(self, name: str, services: Services):
        self.name, self.services = name, services
        self._spark: SparkSession | None = None
        self._session_id: str | None = None  # the session replacing the named one, once the server closed that
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    @property
    def tag(self) -> str:
        return f"kafka-ledger:carrier:{self.name}"

    def _session(self) -> SparkSession:
        """The carrier's session on the server, the same run after run (Spark's cache of generated query code is per
        session: a new one compiles its queries again), kept cycle after cycle; once the server has closed it (idle
        too long: its id is refused for good) or was restarted, a new one for this object's life."""
        if self._spark is None:
            session_id = self._session_id or str(uuid.uuid5(SESSION_NAMESPACE, self.name))
            spark = client_session(session_id)
            try:
                configure(spark)
            except Exception as exc:
                close_session(spark, release_session=False)
                if not closed_session(exc) or self._session_id is not None:
                    raise
                self._session_id = str(uuid.uuid4())
                return self._session()
            spark.addTag(self.tag)
            with self._lock:
                self._spark = spark
        return self._spark

    def _forget_session(self) -> None:
        with self._lock:
            spark, self._spark = self._spark, None
        # A restarted server knows no session: the named one is created anew there.
        if spark is not None:
            close_session(spark, release_session=False)

    def close(self) -> None:
        """Stop using the session; the server keeps it for the carrier's next run (the server expires it when idle)."""
        with self._lock:
            spark, self._spark = self._spark, None
        if spark is not None:
            let_go(spark)

    def interrupt(self) -> None:
        self._interrupted.set()
        with self._lock:
            spark = self._spark
        if spark is not None:
            try:
                spark.interruptTag(self.tag)
            except Exception as exc:  # noqa: BLE001 - best effort: an interrupted cycle publishes nothing anyway
                log.warning("could not interrupt carrier %s's query (%s)", self.name, exc)

    def carry(self, pipelines: Sequence[PipelineConfig], *, dag_id: str | None = None, run_id: str | None = None
              ) -> Cycle:
        """One cycle: plan every member's next batch (or resume its open one), read and commit them all."""
        cycle = Cycle()
        self.publish(self.begin(pipelines, cycle, dag_id=dag_id, run_id=run_id), cycle)
        for pipeline in pipelines:
            if pipeline.name in cycle.results and pipeline.mirror_consumer_group:
                commit.mirror_positions(self.services, pipeline)  # never raises
        log.info("carrier %s: %d pipeline(s) committed in %d wave(s) and %d Spark job(s), %d caught up, %d failed: "
                 "%d records written, %d dead-lettered", self.name, len(cycle.results), cycle.waves, cycle.jobs,
                 len(cycle.caught_up), len(cycle.failures), cycle.records_written, cycle.records_dead_lettered)
        return cycle

    def begin(self, pipelines: Sequence[PipelineConfig], cycle: Cycle, *, dag_id: str | None = None,
              run_id: str | None = None) -> list[Member]:
        """The cycle's first half: each pipeline's batch planned in the ledger (or its open one resumed) and its
        attempt begun, from one look-up of Kafka for them all; the members with records to read."""
        try:
            views, problems = kafka_offsets.subscription_views(self.services.kafka, list(pipelines))
        except Exception as exc:  # noqa: BLE001 - Kafka away: no member begins, the next cycle looks again
            log.warning("carrier %s: Kafka did not answer its look-up (%s): no batch begun", self.name, exc)
            cycle.failures.update(dict.fromkeys((p.name for p in pipelines), exc))
            return []

        def begin_one(pipeline: PipelineConfig) -> Member | CommitResult | None:
            if pipeline.name in problems:
                raise PlanError(problems[pipeline.name])
            return self._begin(pipeline, views[pipeline.name], dag_id, run_id)

        members = []
        for pipeline, begun in each(pipelines, begin_one):
            if isinstance(begun, Exception):  # one member's plan or attempt failing stops no other member
                log.warning("carrier %s: %s could not begin its batch: %s", self.name, pipeline.name, begun)
                cycle.failures[pipeline.name] = begun
            elif isinstance(begun, Member):
                members.append(begun)
            elif begun is None:
                cycle.caught_up.append(pipeline.name)
            else:
                cycle.results[pipeline.name] = begun
        return members

    def publish(self, members: Sequence[Member], cycle: Cycle) -> None:
        """The cycle's second half: the members' ranges read, wave by wave, and each member's rows committed."""
        for wave in in_waves(members, lambda m: m.partitions):
            self._carry_wave(wave, cycle)

    def _begin(self, pipeline: PipelineConfig, view: kafka_offsets.SubscriptionView, dag_id: str | None,
               run_id: str | None) -> Member | CommitResult | None:
        """The member's batch planned (or its open one resumed) and its attempt begun; None when it is caught up, the
        commit of a batch with nothing left to read (committed here)."""
        if not isinstance(sink_for(pipeline), TransactionalSink):
            raise CarrierError(f"pipeline {pipeline.name} publishes into {sink_for(pipeline).target}, which Spark "
                               "writes: a carrier publishes into Postgres tables only")
        planned = planner.plan_batch(self.services, pipeline, dag_id=dag_id, run_id=run_id,
                                     requested_by=requested_by(self.name), carrying=True, view=view)
        if planned.batch_id is None:
            return None
        pipeline = with_columns(self.services.ledger, pipeline)
        attempt = read.begin(self.services, pipeline, planned.batch_id,
                             {tp: offsets.log_start for tp, offsets in view.offsets.items()})
        if attempt is not None and attempt.readable:
            return Member(pipeline, attempt)
        if attempt is not None:
            read.mark_nothing_to_read(self.services.ledger, attempt)
        return commit.commit(self.services, pipeline, planned.batch_id, Written())

    def _carry_wave(self, wave: list[Member], cycle: Cycle) -> None:
        """Read the wave's ranges once and publish each shape's members; a wave of several members that Spark fails
        is carried again member by member, so that one member's trouble (a truncated topic) holds up no other."""
        cycle.waves += 1
        try:
            self._read_and_publish(wave, cycle)
        except AttemptInterrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - said per member below
            # The session may be gone with the query (a restarted server, a lost connection the heartbeat closed):
            # the next read opens it again.
            self._forget_session()
            if len(wave) > 1 and not self._interrupted.is_set():
                log.warning("carrier %s: a wave of %d pipelines failed (%s); carrying them one by one", self.name,
                            len(wave), reason(exc))
                for member in wave:
                    self._carry_wave([member], cycle)
                return
            for member in wave:
                self._fail(member, exc, cycle)

    def _read_and_publish(self, wave: list[Member], cycle: Cycle) -> None:
        spark = self._session()
        ranges = [r for member in wave for r in member.attempt.readable]
        headers = any(member.attempt.headers for member in wave)
        groups = by_shape(wave, Member.shape)
        with Heartbeat(spark, f"carrier {self.name}'s read of {len(wave)} pipeline(s)").start():
            started = time.monotonic()
            records = read.read_ranges(spark, ranges, self.services.kafka, f"carrier-{self.name}", headers,
                                       wide=True)
            if len(groups) > 1:  # each shape's job reads from Spark's cache: Kafka is read once
                records = records.persist()
            try:
                for group in groups:
                    cycle.jobs += 1
                    self._publish_group(records, group, started, cycle, filtered=len(groups) > 1)
            finally:
                if len(groups) > 1:
                    records.unpersist()

    def _publish_group(self, records: DataFrame, group: list[Member], started: float, cycle: Cycle,
                       filtered: bool) -> None:
        """One Spark job decodes the group's records (one decode shape); each member's rows are committed alone."""
        from pyspark.sql import functions as F

        member_of = {tp: i for i, member in enumerate(group) for tp in member.partitions}
        first = group[0]
        if filtered:
            records = records.where(_lookup(member_of, F.col("topic"), F.col("partition")).isNotNull())
        topic, partition = F.col("kafka_topic"), F.col("kafka_partition")
        frame = publish_frame(
            records, first.pipeline, sink_for(first.pipeline),
            _lookup({tp: group[i].batch_id for tp, i in member_of.items()}, topic, partition),
            first.attempt.value_format,
            _lookup({tp: group[i].name for tp, i in member_of.items()}, topic, partition),
        ).withColumn(MEMBER, _lookup(member_of, topic, partition))
        tables = split_rows(list(arrow_stream(frame, interrupted=self._interrupted)), len(group))
        rows_of = {member.name: rows for member, rows in zip(group, tables, strict=True)}

        def commit_one(member: Member) -> CommitResult:
            return commit.commit(self.services, member.pipeline, member.batch_id,
                                 Streamed(member.attempt.number, rows_of[member.name], started, Stopwatch()))

        for member, committed in each(group, commit_one):
            if isinstance(committed, Exception):  # its batch stays open; the other members go on
                self._fail(member, committed, cycle)
            else:
                cycle.results[member.name] = committed

    def _fail(self, member: Member, exc: BaseException, cycle: Cycle) -> None:
        log.warning("carrier %s: batch %s of %s was not published (%s); the next cycle resumes it with the same "
                    "ranges", self.name, member.batch_id, member.name, reason(exc))
        cycle.failures[member.name] = exc
        try:
            commit.fail_batch(self.services, member.name, member.batch_id, f"carrier {self.name}: {reason(exc)}")
        except Exception as recording:  # noqa: BLE001 - the batch stays open either way
            log.warning("could not record batch %s as failed (%s)", member.batch_id, recording)


def each(items: Sequence[T], work: Callable[[T], R]) -> list[tuple[T, R | Exception]]:
    """`work` done for every item, on up to MEMBER_THREADS threads (the members' plans and commits mostly wait for
    Postgres and Kafka), in the items' order: each item's result, or the error it raised."""
    def attempt(item: T) -> R | Exception:
        try:
            return work(item)
        except Exception as exc:  # noqa: BLE001 - the caller says what became of each item
            return exc

    def attempt_all(share: Sequence[T]) -> list[R | Exception]:
        # Each thread's members' many short ledger transactions on one connection of the thread's.
        with ledger.keeping_connections():
            return [attempt(item) for item in share]

    threads = min(MEMBER_THREADS, len(items))
    if threads <= 1:
        return list(zip(items, attempt_all(items), strict=True))
    shares = [items[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads, thread_name_prefix="carrier-member") as pool:
        done = list(pool.map(attempt_all, shares))
    results: list[R | Exception] = [None] * len(items)  # type: ignore[list-item]
    for i, share_results in enumerate(done):
        results[i::threads] = share_results
    return list(zip(items, results, strict=True))


def reason(exc: BaseException) -> str:
    """An error in one line: Spark's headline for a failed query, else the error itself."""
    return headline(exc) if spark_failure(exc) else str(exc)


def _lookup(values: dict[TopicPartition, Any], topic: Column, partition: Column) -> Column:
    """Each row's value for its topic-partition (NULL for one not in `values`), as a Spark column."""
    from pyspark.sql import functions as F

    pairs = [part for tp, value in values.items() for part in (F.lit(f"{tp.topic}\x00{tp.partition}"), F.lit(value))]
    return F.create_map(*pairs)[F.concat_ws("\x00", topic, partition.cast("string"))]


def split_rows(tables: list[pa.Table], members: int) -> list[list[pa.Table]]:
    """A carrier frame's Arrow tables split by their MEMBER column: each member's rows, none lost, none in two."""
    import pyarrow as pa
    import pyarrow.compute as pc

    split: list[list[pa.Table]] = [[] for _ in range(members)]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return split
    rows = pa.concat_tables(tables)
    owner = rows[MEMBER]
    placed = 0
    for i in range(members):
        mine = rows.filter(pc.equal(owner, i))
        placed += mine.num_rows
        split[i].append(mine)
    if placed != rows.num_rows:  # a row of a partition no member reads: the read and the plan disagree
        raise CarrierError(f"{rows.num_rows - placed} of {rows.num_rows} rows read belong to no member's batch")
    return split


@dataclass
class CarriedRun:
    """What a carrier's DAG run carried: its cycles' commits, the members whose batch failed in their last cycle (their
    batches stay open for the next one), and why it stopped."""

    cycles: int = 0
    results: dict[str, list[CommitResult]] = field(default_factory=dict)  # by member, in commit order
    failing: dict[str, BaseException] = field(default_factory=dict)
    ended: str = "budget spent"


def carry_for(carrier: Carrier, members: Sequence[PipelineConfig], *, seconds: float, pace_seconds: float,
              dag_id: str | None, run_id: str | None, stopped: threading.Event) -> CarriedRun:
    """Cycle after cycle, at most one every `pace_seconds`, until `seconds` are spent, a cycle finds every member
    caught up, or `stopped` is set."""
    started = time.monotonic()
    carried = CarriedRun()
    while True:
        cycle_started = time.monotonic()
        cycle = carrier.carry(members, dag_id=dag_id, run_id=run_id)
        carried.cycles += 1
        for name, result in cycle.results.items():
            carried.results.setdefault(name, []).append(result)
        for name in [*cycle.results, *cycle.caught_up]:
            carried.failing.pop(name, None)
        carried.failing.update(cycle.failures)
        if not cycle.results and not cycle.failures:
            carried.ended = "caught up"
            return carried
        next_start = cycle_started + pace_seconds
        if next_start >= started + seconds:
            return carried
        if stopped.wait(max(0.0, next_start - time.monotonic())):
            carried.ended = "stopped"
            return carried
