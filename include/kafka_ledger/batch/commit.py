"""Committing a batch: ONE transaction publishes its rows and dead letters and advances its offsets; then the epilogue.

Two ways in, one transaction shape (`_publishing`): a batch whose rows stream into COPY
(`publish_stream`, the connect runtime), and a batch staged by spark-submit or with nothing to read, marked
written by its Spark work (`commit_batch`). Both end in `_finish`: counts checked, coverage and positions recorded
(compare-and-set), the batch committed. `after_commit` is what follows every commit, wherever it ran.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2

from kafka_ledger.config.pipeline import PipelineConfig
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
from kafka_ledger.observe.stages import Stopwatch, describe
from kafka_ledger.sinks import IcebergSink, Sink, sink_for
from kafka_ledger.sinks.iceberg.sink import BatchSnapshot
from kafka_ledger.sinks.postgres.sink import COPY_CHUNK_BYTES

log = logging.getLogger(__name__)


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
    batch: ledger.Batch, attempt: int, stats: list[PartitionReadStats], read_seconds: float
) -> dict[str, object]:
    """Log what an attempt read (records, rate, dead letters, offset gaps); returns the same as a dict."""
    total = sum(s.records for s in stats)
    dead = sum(s.dead_letters for s in stats)
    gaps = sum(r.span for r in batch.ranges) - total
    log.info(
        "batch %s read: %d records in %.1fs (%.0f records/s), %d to dead letters, %d offset gap(s) "
        "(transaction markers, aborted or compacted records)",
        batch.batch_id, total, read_seconds, total / read_seconds if read_seconds else 0.0, dead, gaps,
    )
    return {"batch_id": batch.batch_id, "attempt": attempt, "records_read": total,
            "read_seconds": round(read_seconds, 3), "offset_gaps": gaps}


@dataclass
class _Publishing:
    """The open commit transaction of one batch: its cursor, the batch (locked), the pipeline's sink, and the
    Kafka it was read from."""

    cur: ledger.Cursor
    batch: ledger.Batch
    sink: Sink
    servers: str
    started: float


@contextmanager
def _publishing(dsn: str, servers: str, pipeline: PipelineConfig, batch_id: int) -> Iterator[_Publishing]:
    """The one transaction every commit runs in: the pipeline's lock, the batch locked, statements allowed as
    long as the batch's Spark task. Rolled back (nothing published, no offset moved) unless the block ends."""
    started = time.monotonic()
    with ledger.session(dsn) as conn, ledger.pipeline_transaction(conn, pipeline.name) as cur:
        ledger.allow_batch_duration(cur, pipeline)
        try:
            batch = ledger.pipeline_batch(cur, pipeline.name, batch_id, for_update=True)
        except ledger.LedgerError as exc:
            raise CommitError(str(exc)) from None
        yield _Publishing(cur, batch, sink_for(pipeline), servers, started)


def commit_batch(dsn: str, servers: str, pipeline: PipelineConfig, batch_id: int) -> CommitResult:
    """In ONE transaction: replace the rows of the batch's offsets with what spark-submit staged, record its
    ranges, advance the positions.

    Committing a committed batch is a no-op. For a catch-up batch, a position that is not at the batch's
    start (compare-and-set) fails the commit and nothing is written. Rewrite batches (replays, windows,
    backfills, explicit ranges) replace rows behind the positions and never move them.
    """
    try:
        with _publishing(dsn, servers, pipeline, batch_id) as p:
            batch = p.batch
            if batch.status == "committed":
                log.info("batch %s was already committed at %s: nothing to do", batch_id, batch.committed_at)
                return CommitResult(batch_id, True, batch.records_written or 0, batch.records_dead_lettered or 0, 0.0)
            if batch.status != "written":
                raise CommitError(
                    f"batch {batch_id} is {batch.status}, not written: its Spark job has not staged it completely"
                )
            attempt = batch.staged_attempt
            params = {"batch_id": batch_id, "attempt": attempt, "pipeline": pipeline.name}
            if writes_output_directly(pipeline, batch):
                replaced = 0
                written = None  # the Spark job appended them already
            else:
                staged = ledger.staged_read_stats(p.cur, pipeline, batch_id, attempt)
                problems = check_read_coverage(batch.ranges, staged)
                if problems:
                    raise CommitError(f"batch {batch_id} staged rows do not match its ranges: " + "; ".join(problems))
                replaced = _remove_published(p, pipeline)
                written = p.sink.publish_staged(p.cur, batch_id, attempt)
            p.cur.execute(sql.INSERT_DEAD_LETTERS.format(staging=sql.staging_table(pipeline)), params)
            dead = p.cur.rowcount
            failpoints.hit("commit_after_publish")
            if written is None:
                written = (batch.records_read or 0) - dead
            result = _finish(p, pipeline, batch, written, dead)
        _log_commit(pipeline, batch, result, replaced)
        return result
    except CommitError as exc:
        with ledger.transaction(dsn) as cur:
            cur.execute(sql.RECORD_ERROR, {"batch_id": batch_id, "error": str(exc)[:4000]})
        raise


def publish_stream(
    dsn: str, servers: str, pipeline: PipelineConfig, batch_id: int, attempt: int, tables: Iterable[Any], *,
    started: float, clock: Stopwatch | None = None,
) -> CommitResult:
    """In ONE transaction: copy an attempt's rows into the sink and the dead letters, then commit.

    The connect runtime's publish: `tables` are Arrow tables of decoded rows (publish.publish_frame), streamed into
    COPY as Spark produces them, with no staging copy. The rows are checked against the ranges, the batch is
    marked written and committed exactly as commit_batch does. Only the attempt that began last may publish:
    an older (zombie) attempt finds the batch moved on and writes nothing. `started` is when the read began;
    `clock` (the attempt's, with its earlier stages) gets the stream's and the commit's stages.
    """
    clock = clock or Stopwatch()
    # Arrow and NumPy load only where a batch streams (the connect runtime's task), not in every process that
    # imports this module: the DAG file, the plan task, the CLI.
    from kafka_ledger.batch.publish import CopyStream

    with _publishing(dsn, servers, pipeline, batch_id) as p:
        batch = _newest_attempt(p.batch, attempt)
        replaced = _remove_published(p, pipeline)
        stream = CopyStream(tables, pipeline, batch_id)
        try:
            written = p.sink.copy_rows(p.cur, stream)
        except psycopg2.Error:
            if stream.error is not None:  # the read failed: say why, not that COPY was cancelled
                raise stream.error from None
            raise
        dead_lines = stream.dead_letter_lines()
        dead = 0
        if dead_lines:
            p.cur.copy_expert(sql.COPY_DEAD_LETTERS, io.BytesIO(dead_lines), size=COPY_CHUNK_BYTES)
            dead = p.cur.rowcount
        copied = time.monotonic()
        if stream.first_rows_at is not None:
            clock.lap("to_first_rows", at=stream.first_rows_at)
            clock.record("waiting_for_spark", stream.waiting_seconds)
            clock.record("copying", copied - stream.first_rows_at - stream.waiting_seconds)
        clock.lap("stream", at=copied)
        read_seconds = copied - started
        failpoints.hit("after_staging")
        stats = stream.read_stats()
        problems = check_read_coverage(batch.ranges, stats)
        if problems:
            raise ledger.LedgerError(f"batch {batch_id} was not read completely: " + "; ".join(problems))
        ledger.mark_written(p.cur, batch_id, attempt, stats, read_seconds)
        log_read(batch, attempt, stats, read_seconds)
        failpoints.hit("commit_after_publish")
        result = _finish(p, pipeline, ledger.get_batch(p.cur, batch_id), written, dead, started)
    clock.lap("commit")
    _log_commit(pipeline, batch, result, replaced)
    log.info("batch %s attempt %d took %.2f s: %s", batch_id, attempt, time.monotonic() - clock.started,
             describe(clock.stages))
    return dataclasses.replace(result, stages=dict(clock.stages))


def publish_snapshot(
    dsn: str, servers: str, pipeline: PipelineConfig, batch_id: int, attempt: int, snapshot: BatchSnapshot,
    dead_letters: list[tuple[str, int, int, str]], *, started: float, clock: Stopwatch | None = None,
) -> CommitResult:
    """In ONE transaction: record the Iceberg snapshot that published an attempt's rows, publish its dead letters,
    move the offsets.

    An Iceberg sink's commit (sinks/iceberg.py): Spark has committed the batch's rows as `snapshot`. The offsets
    move only if that snapshot is in the table's current history now, and if its rows of the batch (read back
    without Spark) and the dead letters (topic, partition, offset, COPY line) together cover the ranges, each
    record once. Only the attempt that began last may publish, as with any sink.
    """
    clock = clock or Stopwatch()
    with _publishing(dsn, servers, pipeline, batch_id) as p:
        batch = _newest_attempt(p.batch, attempt)
        sink = p.sink
        assert isinstance(sink, IcebergSink)
        current = sink.batch_snapshot(batch_id)
        if current is None or current.snapshot_id != snapshot.snapshot_id:
            raise CommitError(f"batch {batch_id}: snapshot {snapshot.snapshot_id} is no longer the batch's snapshot in "
                              f"{sink.target}'s current history (rolled back?): nothing was published")
        replaced = _remove_published(p, pipeline)
        dead = 0
        if dead_letters:
            p.cur.copy_expert(sql.COPY_DEAD_LETTERS, io.BytesIO("".join(d[3] for d in dead_letters).encode()),
                              size=COPY_CHUNK_BYTES)
            dead = p.cur.rowcount
        failpoints.hit("after_staging")  # the transaction holds the dead letters, as a stream's holds its rows
        stats = sink.read_stats(snapshot, (d[:3] for d in dead_letters))
        problems = check_read_coverage(batch.ranges, stats)
        if problems:
            raise CommitError(f"batch {batch_id} snapshot {snapshot.snapshot_id} and its dead letters do not cover "
                              "its ranges: " + "; ".join(problems))
        read_seconds = time.monotonic() - started
        ledger.mark_written(p.cur, batch_id, attempt, stats, read_seconds)
        log_read(batch, attempt, stats, read_seconds)
        ledger.record_snapshot(p.cur, batch_id, snapshot.snapshot_id)
        failpoints.hit("commit_after_publish")
        written = sum(s.records - s.dead_letters for s in stats)
        result = _finish(p, pipeline, ledger.get_batch(p.cur, batch_id), written, dead, started)
    clock.lap("commit")
    _log_commit(pipeline, batch, result, replaced)
    log.info("batch %s attempt %d took %.2f s (snapshot %s): %s", batch_id, attempt, time.monotonic() - clock.started,
             snapshot.snapshot_id, describe(clock.stages))
    return dataclasses.replace(result, stages=dict(clock.stages))


def _newest_attempt(batch: ledger.Batch, attempt: int) -> ledger.Batch:
    if batch.status != "planned" or batch.attempts != attempt:
        raise ledger.LedgerError(
            f"batch {batch.batch_id} attempt {attempt} may not publish: the batch is {batch.status} with "
            f"{batch.attempts} attempts (superseded by a newer attempt?); nothing was written"
        )
    return batch


def _finish(
    p: _Publishing, pipeline: PipelineConfig, batch: ledger.Batch, written: int, dead: int,
    started: float | None = None,
) -> CommitResult:
    """The end of every commit: topic ids and counts checked, coverage and positions recorded, batch committed."""
    _check_topic_ids(p, pipeline, batch)
    params = {"batch_id": batch.batch_id, "pipeline": pipeline.name}
    if written + dead != (batch.records_read or 0):
        raise CommitError(
            f"batch {batch.batch_id}: {written} rows + {dead} dead letters != {batch.records_read} records read"
        )
    if batch.moves_positions:
        _advance(p.cur, batch, params)
    else:
        _cover_rewrite(p.cur, pipeline, batch)
    seconds = time.monotonic() - (p.started if started is None else started)
    p.cur.execute(
        sql.MARK_COMMITTED,
        {**params, "records_written": written, "records_dead_lettered": dead, "commit_seconds": seconds},
    )
    p.cur.execute(sql.DELETE_STAGED.format(staging=sql.staging_table(pipeline)), params)
    failpoints.hit("commit_before_end")
    return CommitResult(batch.batch_id, False, written, dead, seconds)


def _check_topic_ids(p: _Publishing, pipeline: PipelineConfig, batch: ledger.Batch) -> None:
    """Refuse to commit what was read from a topic that is no longer the one the batch was planned against.

    Checked once the read is over: Kafka's id now equal to the planned one means the read saw that topic
    throughout (a topic id is never reused). The commit's transaction rolls back: nothing published.
    """
    planned = ledger.batch_topic_ids(p.cur, batch.batch_id)
    changed = identity_changes(planned, kafka_offsets.topic_ids(p.servers, sorted(planned)))
    if changed:
        raise TopicIdentityError(
            pipeline.name, changed,
            outcome=f"Batch {batch.batch_id} read from it: nothing was published and no position moved. Its ranges "
                    "name other records now, so it cannot be resumed: abandon it with the reset "
                    "(--abandon-open-batches).",
        )


def _log_commit(pipeline: PipelineConfig, batch: ledger.Batch, result: CommitResult, replaced: int) -> None:
    log.info(
        "committed %s batch %s of %s: %d rows into %s (%d rows of earlier runs replaced), %d dead letters, "
        "%s in %.2fs", batch.kind, batch.batch_id, pipeline.name, result.records_written,
        sink_for(pipeline).target, replaced, result.records_dead_lettered,
        f"{len(batch.ranges)} partition position(s) advanced" if batch.moves_positions else "positions unchanged",
        result.seconds,
    )


def _remove_published(p: _Publishing, pipeline: PipelineConfig) -> int:
    """Replace, not append: what the batch's offsets published before (rows and dead letters) goes first."""
    removed = p.sink.remove(p.cur, p.batch.ranges)
    p.cur.execute(sql.DELETE_DEAD_LETTER_RANGES, {"pipeline": pipeline.name, **sql.ranges_params(p.batch.ranges)})
    return removed + p.cur.rowcount


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


def fail_batch(dsn: str, batch_id: int, error: str) -> None:
    """Record that reading the batch failed for good this run; the next run resumes the same ranges."""
    with ledger.transaction(dsn) as cur:
        ledger.mark_failed(cur, batch_id, error)


def after_commit(dsn: str, servers: str, pipeline: PipelineConfig, result: CommitResult) -> dict[str, Any]:
    """What follows every commit, wherever it ran (a DAG task, `kafka-ledger replay`): the positions mirrored into
    the pipeline's consumer group (never failing the commit), and the result as the task returns it."""
    return {**result.as_dict(), "mirrored": consumer_group.mirror_positions(dsn, servers, pipeline)}
