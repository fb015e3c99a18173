"""Committing a batch: ONE transaction publishes its rows and dead letters and advances its offsets; then the epilogue.

One way in, `commit(..., publication)`, one transaction (`_publishing`) and one tail (`_finish`: topic ids and counts
checked, coverage and positions recorded by compare-and-set, the batch committed). What differs is how the rows reach
the sink inside the transaction, the `Publication`:

- `Streamed`: an attempt's rows stream into a transactional sink's COPY as Spark sends them (the connect runtime);
- `Written`: what an attempt's Spark work wrote before (the submit runtime's staged rows, an at_least_once batch's
  direct append, or nothing to read), published from the staging table;
- `Adopted`: an artifact sink's artifact (an Iceberg snapshot) that Spark wrote, found in the output and adopted.

`after_commit` is what follows every commit, wherever it ran.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extras

from kafka_ledger.batch.columns import with_columns
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.kafka import consumer_group
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model.ranges import (
    PartitionReadStats,
    TopicIdentityError,
    check_read_coverage,
    cover_with_read,
    identity_changes,
)
from kafka_ledger.observe import failpoints
from kafka_ledger.observe.events import BatchCommitted, BatchFailed, BatchRead
from kafka_ledger.observe.observer import Observer
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.sinks import Artifact, ArtifactSink, Sink, TransactionalSink, sink_for
from kafka_ledger.sinks.base import SinkWrite

log = logging.getLogger(__name__)

# Bytes handed to COPY per read of a stream.
COPY_CHUNK_BYTES = 1 << 20
# Appended to the reason of a dead letter whose record Kafka no longer holds when the commit reads it again.
RECORD_GONE = (" (its raw key and value are not kept: Kafka no longer held the record when the commit read it again, "
               "e.g. deleted by the topic's retention)")


class CommitError(ledger.LedgerError):
    """The batch cannot be committed; nothing was written and no offset moved."""


@dataclass(frozen=True)
class CommitResult:
    """The outcome of a commit: counts published, or that the batch was already committed."""

    batch_id: int
    already_committed: bool
    records_written: int
    records_dead_lettered: int
    seconds: float
    # Seconds per stage of the attempt's data path (stages.STAGES), where the runtime measured them.
    stages: dict[str, float] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "already_committed": self.already_committed,
                "records_written": self.records_written, "records_dead_lettered": self.records_dead_lettered,
                "commit_seconds": round(self.seconds, 3), **({"stages": self.stages} if self.stages else {})}


def writes_output_directly(pipeline: PipelineConfig, batch: ledger.Batch) -> bool:
    """at_least_once catch-up batches are appended by spark-submit's job itself; everything else is staged."""
    return pipeline.delivery_mode == "at_least_once" and batch.kind == "catch_up"


def log_read(
    observer: Observer, batch: ledger.Batch, attempt: int, stats: list[PartitionReadStats], read_seconds: float
) -> dict[str, object]:
    """Tell `observer` what an attempt read (records, dead letters, offset gaps); returns the same as a dict."""
    total = sum(s.records for s in stats)
    dead = sum(s.dead_letters for s in stats)
    gaps = sum(r.span for r in batch.ranges) - total
    observer.notify(BatchRead(batch.pipeline, batch.batch_id, attempt, total, dead, gaps, read_seconds))
    return {"batch_id": batch.batch_id, "attempt": attempt, "records_read": total,
            "read_seconds": round(read_seconds, 3), "offset_gaps": gaps}


@dataclass
class _Publishing:
    """The open commit transaction of one batch: its cursor, the batch (locked), the pipeline and its sink, and the
    Kafka it was read from."""

    cur: ledger.Cursor
    batch: ledger.Batch
    pipeline: PipelineConfig
    sink: Sink
    services: Services
    started: float

    def remove_published(self) -> int:
        """Replace, not append: what the batch's offsets published before goes first (rows of a transactional sink;
        an artifact replaces its rows itself), and so do their dead letters."""
        removed = self.sink.remove(self.cur, self.batch.ranges) if isinstance(self.sink, TransactionalSink) else 0
        self.cur.execute(sql.DELETE_DEAD_LETTER_RANGES, {"pipeline": self.pipeline.name,
                                                         **sql.ranges_params(self.batch.ranges)})
        return removed + self.cur.rowcount

    def copy_dead_letters(self, lines: bytes) -> int:
        if not lines:
            return 0
        self.cur.copy_expert(sql.COPY_DEAD_LETTERS, io.BytesIO(lines), size=COPY_CHUNK_BYTES)
        return self.cur.rowcount

    def complete_dead_letters(self, wrote: SinkWrite) -> None:
        """Give the dead letters the sink wrote without their record their raw key and value, read again from Kafka
        by offset (those of a record Kafka no longer holds say so in their reason)."""
        if not wrote.records_to_read:
            return
        records = kafka_offsets.records_at(self.services.kafka, wrote.records_to_read)
        psycopg2.extras.execute_values(self.cur, sql.COMPLETE_DEAD_LETTERS, [
            (self.pipeline.name, *record, *records.get(record, (None, None)),
             None if record in records else RECORD_GONE) for record in wrote.records_to_read],
            template=sql.DEAD_LETTER_RECORD_VALUES, page_size=1000)
        gone = len(wrote.records_to_read) - len(records)
        log.info("%d dead letter(s) given their record's key and value, read again from Kafka by offset%s",
                 len(records), f"; {gone} record(s) Kafka no longer holds" if gone else "")


@dataclass(frozen=True)
class Published:
    """What a publication put in the transaction: rows and dead letters, rows of earlier runs replaced; `batch` the
    batch as it stands now (marked written, with its read counts)."""

    batch: ledger.Batch
    written: int
    dead: int
    replaced: int
    attempt: int | None = None
    started: float | None = None
    clock: Stopwatch | None = None
    note: str = ""


class Publication(ABC):
    """How an attempt's rows reach the sink inside the commit's transaction."""

    @abstractmethod
    def publish(self, p: _Publishing) -> Published | CommitResult:
        """Put the rows and dead letters in the transaction (or say the batch was committed already)."""


@dataclass
class Written(Publication):
    """What an attempt's Spark work wrote before the commit: the rows spark-submit staged (an at_least_once catch-up
    batch: appended to the output already), or nothing at all (a batch with nothing to read). Committing a committed
    batch is a no-op."""

    def publish(self, p: _Publishing) -> Published | CommitResult:
        batch, pipeline = p.batch, p.pipeline
        if batch.status == "committed":
            return CommitResult(batch.batch_id, True, batch.records_written or 0, batch.records_dead_lettered or 0,
                                0.0)
        if batch.status != "written":
            raise CommitError(f"batch {batch.batch_id} is {batch.status}, not written: its Spark job has not staged "
                              "it completely")
        if not isinstance(p.sink, TransactionalSink):
            raise CommitError(f"batch {batch.batch_id} was staged, but {p.sink.target} is not written by the commit")
        attempt = batch.staged_attempt
        params = {"batch_id": batch.batch_id, "attempt": attempt, "pipeline": pipeline.name}
        if writes_output_directly(pipeline, batch):
            replaced, written, dead_in_sink = 0, None, 0  # the Spark job appended them already
        else:
            staged = ledger.staged_read_stats(p.cur, pipeline, batch.batch_id, attempt)
            problems = check_read_coverage(batch.ranges, staged)
            if problems:
                raise CommitError(f"batch {batch.batch_id} staged rows do not match its ranges: " + "; ".join(problems))
            replaced = p.remove_published()
            wrote = p.sink.publish_staged(p.cur, batch, attempt)
            p.complete_dead_letters(wrote)
            written, dead_in_sink = wrote.published, wrote.dead_letters
        p.cur.execute(sql.INSERT_DEAD_LETTERS.format(staging=sql.staging_table(pipeline)), params)
        dead = p.cur.rowcount + dead_in_sink
        failpoints.hit("commit_after_publish")
        if written is None:
            written = (batch.records_read or 0) - dead
        return Published(batch, written, dead, replaced)


@dataclass
class Streamed(Publication):
    """An attempt's rows arriving as Arrow tables of a publish frame (batch/publish.publish_frame), streamed into the
    transactional sink's COPY as Spark produces them, with no staging copy; the batch is marked written in the same
    transaction. `started` is when the read began; `clock` (the attempt's) gets the stream's stages."""

    attempt: int
    tables: Iterable[Any]
    started: float
    clock: Stopwatch

    def publish(self, p: _Publishing) -> Published:
        # Arrow and NumPy load only where a batch streams (the connect runtime's task), not in every process that
        # imports this module: the DAG file, the plan task, the CLI.
        from kafka_ledger.sinks.postgres.copy import CopyStream

        batch = ledger.check_newest_attempt(p.batch, self.attempt, "publish")
        sink = p.sink
        if not isinstance(sink, TransactionalSink):
            raise CommitError(f"{sink.target} is not written by the commit: its rows cannot be streamed into it")
        replaced = p.remove_published()
        stream = CopyStream(self.tables, sink.published_columns(), batch.batch_id)
        try:
            wrote = sink.copy_rows(p.cur, batch, stream)
        except psycopg2.Error:
            if stream.error is not None:  # the read failed: say why, not that COPY was cancelled
                raise stream.error from None
            raise
        p.complete_dead_letters(wrote)
        written = wrote.published
        dead = wrote.dead_letters + p.copy_dead_letters(stream.dead_letter_lines())
        copied = time.monotonic()
        clock = self.clock
        if stream.first_rows_at is not None:
            clock.lap("to_first_rows", at=stream.first_rows_at)
            clock.record("waiting_for_spark", stream.waiting_seconds)
            clock.record("copying", copied - stream.first_rows_at - stream.waiting_seconds)
        clock.lap("stream", at=copied)
        read_seconds = copied - self.started
        failpoints.hit("after_staging")
        stats = stream.read_stats()
        problems = check_read_coverage(batch.ranges, stats)
        if problems:
            raise ledger.LedgerError(f"batch {batch.batch_id} was not read completely: " + "; ".join(problems))
        ledger.mark_written(p.cur, batch.batch_id, self.attempt, stats, read_seconds)
        log_read(p.services.observer, batch, self.attempt, stats, read_seconds)
        failpoints.hit("commit_after_publish")
        return Published(ledger.get_batch(p.cur, batch.batch_id), written, dead, replaced, self.attempt,
                         self.started, clock)


@dataclass
class Adopted(Publication):
    """An artifact sink's batch: Spark has written the attempt's rows as `artifact` (or found an earlier attempt's).
    The offsets move only if that artifact is in the output's current history now, and if its rows of the batch (read
    back without Spark) and the dead letters (topic, partition, offset, COPY line) together cover the ranges, each
    record once."""

    attempt: int
    artifact: Artifact
    dead_letters: list[tuple[str, int, int, str]]
    started: float
    clock: Stopwatch

    def publish(self, p: _Publishing) -> Published:
        batch = ledger.check_newest_attempt(p.batch, self.attempt, "publish")
        sink = p.sink
        if not isinstance(sink, ArtifactSink):
            raise CommitError(f"{sink.target} is written by the commit: it has no {type(self.artifact).__name__}")
        current = sink.current_artifact(batch.batch_id)
        if current is None or current.artifact_id != self.artifact.artifact_id:
            raise CommitError(f"batch {batch.batch_id}: {sink.artifact_noun} {self.artifact.artifact_id} is no longer "
                              f"the batch's {sink.artifact_noun} in {sink.target}'s current history (rolled back?): "
                              "nothing was published")
        replaced = p.remove_published()
        dead = p.copy_dead_letters("".join(d[3] for d in self.dead_letters).encode())
        failpoints.hit("after_staging")  # the transaction holds the dead letters, as a stream's holds its rows
        stats = sink.read_stats(self.artifact, (d[:3] for d in self.dead_letters))
        problems = check_read_coverage(batch.ranges, stats)
        if problems:
            raise CommitError(f"batch {batch.batch_id} {sink.artifact_noun} {self.artifact.artifact_id} and its dead "
                              "letters do not cover its ranges: " + "; ".join(problems))
        read_seconds = time.monotonic() - self.started
        ledger.mark_written(p.cur, batch.batch_id, self.attempt, stats, read_seconds)
        log_read(p.services.observer, batch, self.attempt, stats, read_seconds)
        sink.record(p.cur, self.artifact)
        failpoints.hit("commit_after_publish")
        written = sum(s.records - s.dead_letters for s in stats)
        return Published(ledger.get_batch(p.cur, batch.batch_id), written, dead, replaced, self.attempt,
                         self.started, self.clock, f"{sink.artifact_noun} {self.artifact.artifact_id}")


@contextmanager
def _publishing(services: Services, pipeline: PipelineConfig, batch_id: int) -> Iterator[_Publishing]:
    """The one transaction every commit runs in: the pipeline's lock, the batch locked, statements allowed as
    long as the batch's Spark task. Rolled back (nothing published, no offset moved) unless the block ends."""
    started = time.monotonic()
    with ledger.session(services.ledger) as conn, ledger.pipeline_transaction(conn, pipeline.name) as cur:
        ledger.allow_batch_duration(cur, pipeline)
        try:
            batch = ledger.pipeline_batch(cur, pipeline.name, batch_id, for_update=True)
        except ledger.LedgerError as exc:
            raise CommitError(str(exc)) from None
        sink = sink_for(pipeline)
        if isinstance(sink, TransactionalSink) and batch.status != "committed":
            # Columns the declaration added appear in the same transaction as the rows that fill them.
            sink.evolve(cur, batch_id)
            failpoints.hit("commit_after_evolve")
        yield _Publishing(cur, batch, pipeline, sink, services, started)


def commit(services: Services, pipeline: PipelineConfig, batch_id: int, publication: Publication) -> CommitResult:
    """In ONE transaction: publish the batch's rows and dead letters as `publication` says, record its ranges,
    advance the positions (compare-and-set: a position not at the batch's start fails the commit and nothing is
    written). Rewrite batches (replays, windows, backfills, explicit ranges) replace rows behind the positions and
    never move them. A refusal of a batch staged before is recorded on the batch."""
    pipeline = with_columns(services.ledger, pipeline)
    try:
        with _publishing(services, pipeline, batch_id) as p:
            published = publication.publish(p)
            if isinstance(published, CommitResult):
                services.observer.notify(BatchCommitted(
                    pipeline.name, batch_id, p.batch.kind, p.sink.target, published.records_written,
                    published.records_dead_lettered, 0, None, 0.0, already_committed=True))
                return published
            result = _finish(p, published)
    except CommitError as exc:
        if isinstance(publication, Written):
            with ledger.transaction(services.ledger) as cur:
                cur.execute(sql.RECORD_ERROR, {"batch_id": batch_id, "error": str(exc)[:4000]})
        raise
    clock = published.clock
    if clock is not None:
        clock.lap("commit")
        result = dataclasses.replace(result, stages=dict(clock.stages))
    batch = published.batch
    services.observer.notify(BatchCommitted(
        pipeline.name, batch_id, batch.kind, p.sink.target, result.records_written, result.records_dead_lettered,
        published.replaced, len(batch.ranges) if batch.moves_positions else None, result.seconds,
        attempt=published.attempt, stages=dict(result.stages),
        attempt_seconds=None if clock is None else time.monotonic() - clock.started, artifact=published.note))
    return result


def _finish(p: _Publishing, published: Published) -> CommitResult:
    """The end of every commit: topic ids and counts checked, coverage and positions recorded, batch committed."""
    batch, pipeline, written, dead = published.batch, p.pipeline, published.written, published.dead
    _check_topic_ids(p, batch)
    params = {"batch_id": batch.batch_id, "pipeline": pipeline.name}
    if written + dead != (batch.records_read or 0):
        raise CommitError(
            f"batch {batch.batch_id}: {written} rows + {dead} dead letters != {batch.records_read} records read"
        )
    if batch.moves_positions:
        _advance(p.cur, batch, params)
    else:
        _cover_rewrite(p.cur, pipeline, batch)
    seconds = time.monotonic() - (p.started if published.started is None else published.started)
    p.cur.execute(
        sql.MARK_COMMITTED,
        {**params, "records_written": written, "records_dead_lettered": dead, "commit_seconds": seconds},
    )
    p.cur.execute(sql.DELETE_STAGED.format(staging=sql.staging_table(pipeline)), params)
    failpoints.hit("commit_before_end")
    return CommitResult(batch.batch_id, False, written, dead, seconds)


def _check_topic_ids(p: _Publishing, batch: ledger.Batch) -> None:
    """Refuse to commit what was read from a topic that is no longer the one the batch was planned against.

    Checked once the read is over: Kafka's id now equal to the planned one means the read saw that topic
    throughout (a topic id is never reused). The commit's transaction rolls back: nothing published.
    """
    planned = ledger.batch_topic_ids(p.cur, batch.batch_id)
    changed = identity_changes(planned, kafka_offsets.topic_ids(p.services.kafka, sorted(planned)))
    if changed:
        raise TopicIdentityError(
            p.pipeline.name, changed,
            outcome=f"Batch {batch.batch_id} read from it: nothing was published and no position moved. Its ranges "
                    "name other records now, so it cannot be resumed: abandon it with the reset "
                    "(--abandon-open-batches).",
        )


def _advance(cur: ledger.Cursor, batch: ledger.Batch, params: dict[str, Any]) -> None:
    cur.execute(sql.INSERT_COMMITTED_RANGES, params)
    cur.execute(sql.ADVANCE_POSITIONS, params)
    if cur.rowcount != len(batch.ranges):
        cur.execute(sql.SELECT_POSITION_MISMATCHES, params)
        details = "; ".join(
            f"{topic}-{partition}: ledger position {position}, batch starts at {start}"
            for topic, partition, start, position in cur.fetchall()
        )
        raise CommitError(f"batch {batch.batch_id}: compare-and-set on positions failed ({details})")


def _cover_rewrite(cur: ledger.Cursor, pipeline: PipelineConfig, batch: ledger.Batch) -> None:
    positions = ledger.positions(cur, pipeline.name)
    ahead = [f"{r} (position {positions.get(r.topic_partition)})" for r in batch.ranges
             if r.until_offset > positions.get(r.topic_partition, -1)]
    if ahead:
        raise CommitError(f"batch {batch.batch_id} rewrites offsets that are no longer behind the position "
                          f"(reset since it was planned?): {', '.join(ahead)}")
    covered = ledger.coverage(cur, pipeline.name)
    for r in batch.ranges:
        removed, added = cover_with_read(covered.get(r.topic_partition, []), r.from_offset, r.until_offset,
                                         batch.batch_id)
        ledger.replace_coverage(cur, pipeline.name, r.topic_partition, removed, added)


def fail_batch(services: Services, pipeline: str, batch_id: int, error: str) -> None:
    """Record that reading the batch failed for good this run; the next run resumes the same ranges."""
    with ledger.transaction(services.ledger) as cur:
        ledger.mark_failed(cur, batch_id, error)
    services.observer.notify(BatchFailed(pipeline, batch_id, error))


def mirror_positions(services: Services, pipeline: PipelineConfig) -> bool:
    """The ledger's positions written to the pipeline's mirror consumer group, if it has one (never raises: see
    kafka/consumer_group.py)."""
    def positions() -> list[consumer_group.LedgerPosition]:
        with ledger.transaction(services.ledger) as cur:
            return [(r.topic_partition, r.position, r.last_batch_id) for r in ledger.position_rows(cur, pipeline.name)]

    return consumer_group.mirror_positions(services.kafka, pipeline, positions)


def after_commit(services: Services, pipeline: PipelineConfig, result: CommitResult) -> dict[str, Any]:
    """What follows every commit, wherever it ran (a DAG task, `kafka-ledger replay`): the positions mirrored into
    the pipeline's consumer group (never failing the commit), and the result as the task returns it."""
    return {**result.as_dict(), "mirrored": mirror_positions(services, pipeline)}
