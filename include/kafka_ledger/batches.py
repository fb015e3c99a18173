"""A batch's life: plan (or resume) it, then commit it in one transaction, or record its failure."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg2

from kafka_ledger import failpoints, kafka_offsets, ledger, sql
from kafka_ledger.batch_requests import BatchRequest, RequestError
from kafka_ledger.config import PipelineConfig
from kafka_ledger.planning import (
    LostDataError,
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    backlog,
    check_read_coverage,
    check_rewrite_ranges,
    cover_with_read,
    lost_ranges,
    plan_latest_ranges,
    plan_ranges,
    start_positions,
    window_ranges,
)

log = logging.getLogger(__name__)


class CommitError(ledger.LedgerError):
    """The batch cannot be committed; nothing was written and no offset moved."""


# Bytes handed to COPY per read of the row stream.
COPY_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class PlannedBatch:
    """What the plan step decided: a batch to read (new or resumed), or nothing to do."""

    batch_id: int | None
    resumed: bool
    ranges: list[OffsetRange]
    backlog_after: int  # offsets still unread after this batch (gaps included): > 0 means "run again"
    kind: str = "catch_up"
    pending: list[OffsetRange] = field(default_factory=list)  # a window's offsets not ingested yet
    dry_run: bool = False

    @property
    def offsets(self) -> int:
        return sum(r.span for r in self.ranges)

    @property
    def skipped(self) -> int:
        return sum(r.from_offset - r.skipped_from for r in self.ranges if r.skipped_from is not None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id, "kind": self.kind, "resumed": self.resumed, "dry_run": self.dry_run,
            "offsets": self.offsets, "skipped_offsets": self.skipped, "backlog_after": self.backlog_after,
            "ranges": [_range_dict(r) for r in self.ranges], "pending": [_range_dict(r) for r in self.pending],
        }


def _range_dict(r: OffsetRange) -> dict[str, Any]:
    out = {"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
    if r.skipped_from is not None:
        out["skipped_from"] = r.skipped_from
    return out


def _format_ranges(ranges: list[OffsetRange]) -> str:
    return "\n".join(
        f"  {r}  ({r.span} offsets"
        + (f"; skipping [{r.skipped_from}, {r.from_offset}), {r.from_offset - r.skipped_from} offsets" if
           r.skipped_from is not None else "")
        + ")"
        for r in ranges
    )


def plan_next_batch(
    dsn: str,
    bootstrap_servers: str,
    pipeline: PipelineConfig,
    dag_id: str | None = None,
    run_id: str | None = None,
) -> PlannedBatch:
    """Resume the pipeline's unfinished batch, or record the next capped batch before anything is read."""
    return plan_batch(dsn, bootstrap_servers, pipeline, BatchRequest(), dag_id=dag_id, run_id=run_id)


def plan_batch(
    dsn: str,
    bootstrap_servers: str,
    pipeline: PipelineConfig,
    request: BatchRequest | None = None,
    *,
    dag_id: str | None = None,
    run_id: str | None = None,
    requested_by: str | None = None,
    backfill_window: tuple[datetime, datetime] | None = None,
    dry_run: bool = False,
) -> PlannedBatch:
    """Record the batch a run will read (or find the one to resume), BEFORE anything is read.

    `request` says what to read (catch_up by default); `backfill_window` makes this an Airflow backfill
    run of that data interval. With `dry_run` the same decisions are made and logged, then rolled back.
    Invalid requests raise RequestError and write nothing.
    """
    request = request or BatchRequest()
    conn = ledger.connect(dsn)
    try:
        with ledger.pipeline_transaction(conn, pipeline.name) as cur:
            planned = _plan(cur, bootstrap_servers, pipeline, request, dag_id, run_id, requested_by,
                            backfill_window)
            if dry_run:
                conn.rollback()
                planned = replace(planned, dry_run=True, batch_id=None if not planned.resumed else planned.batch_id)
        failpoints.hit("after_plan")
        return planned
    finally:
        conn.close()


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _subscribed_positions(
    cur: ledger.Cursor, pipeline: PipelineConfig, offsets: dict[TopicPartition, PartitionOffsets]
) -> dict[TopicPartition, int]:
    """Positions of the subscribed partitions; partitions seen for the first time get their start position."""
    known = ledger.positions(cur, pipeline.name)
    new = [tp for tp in offsets if tp not in known]
    if new:
        starts = start_positions(new, offsets, pipeline.start_position)
        for assigned in pipeline.assignment or []:
            tp = TopicPartition(assigned.topic, assigned.partition)
            if tp in starts and assigned.start_offset is not None:
                starts[tp] = assigned.start_offset
        ledger.insert_start_positions(cur, pipeline.name, starts)
        log.info("%d new partition(s) start at: %s", len(new),
                 ", ".join(f"{tp}@{pos}" for tp, pos in sorted(starts.items())))
        known = {**known, **starts}
    if pipeline.topic_pattern:
        # A matching topic that was deleted simply stops being read.
        return {tp: pos for tp, pos in known.items() if tp in offsets}
    if pipeline.assignment:
        return {tp: known[tp] for tp in offsets}
    # Listed topics must stay: a vanished partition of one fails the plan (see plan_ranges).
    return {tp: pos for tp, pos in known.items() if tp.topic in pipeline.topics}


def _resume(
    cur: ledger.Cursor,
    batch: ledger.Batch,
    offsets: dict[TopicPartition, PartitionOffsets],
    positions: dict[TopicPartition, int],
    dag_id: str | None,
    run_id: str | None,
) -> PlannedBatch:
    lost = lost_ranges(batch.ranges, offsets)
    if lost:
        raise LostDataError(lost)
    ledger.set_batch_owner(cur, batch.batch_id, dag_id, run_id)
    remaining = _backlog_after(positions, offsets, batch.ranges) if batch.moves_positions else 0
    log.info(
        "resuming %s batch %s of %s (status %s, %s attempt(s) so far%s) with its recorded ranges:\n%s",
        batch.kind, batch.batch_id, batch.pipeline, batch.status, batch.attempts,
        f", last error: {batch.last_error}" if batch.last_error else "", _format_ranges(batch.ranges),
    )
    return PlannedBatch(batch.batch_id, True, batch.ranges, backlog_after=remaining, kind=batch.kind)


def _refuse(problems: list[str]) -> None:
    if problems:
        raise RequestError("; ".join(problems))


def _plan(
    cur: ledger.Cursor,
    bootstrap_servers: str,
    pipeline: PipelineConfig,
    request: BatchRequest,
    dag_id: str | None,
    run_id: str | None,
    requested_by: str | None,
    backfill_window: tuple[datetime, datetime] | None,
) -> PlannedBatch:
    ledger.ensure_pipeline_tables(cur, pipeline)
    offsets = kafka_offsets.subscribed_offsets(bootstrap_servers, pipeline)
    positions = _subscribed_positions(cur, pipeline, offsets)
    mine = ledger.run_open_batch(cur, pipeline.name, dag_id, run_id)
    if mine is not None:
        return _resume(cur, mine, offsets, positions, dag_id, run_id)
    # A backfill run always rewrites its data interval, also when it reuses a run that committed before.
    committed = None if backfill_window else ledger.run_committed_batch(cur, pipeline.name, dag_id, run_id)
    if committed is not None:
        # Clearing a run is how Airflow users reprocess it: the run re-reads the ranges it recorded and replaces
        # their output (positions untouched). Planning anew would read whatever is new under the old run's name.
        log.info("run %s already committed batch %s: clearing it replays that batch's ranges", run_id, committed)
        request = BatchRequest(mode="replay_batch", batch_id=committed,
                               reason=request.reason or f"run {run_id} cleared in Airflow")

    def record(ranges: list[OffsetRange], kind: str, **extra: Any) -> ledger.Batch:
        return ledger.create_batch(cur, pipeline.name, ranges, dag_id, run_id, kind=kind,
                                   requested_by=requested_by, reason=request.reason,
                                   end_offsets={tp: o.end for tp, o in offsets.items()}, **extra)

    in_flight = {b.batch_id: b.ranges for b in ledger.in_flight_batches(cur, pipeline.name)}

    if backfill_window is not None or request.mode == "time_window":
        kind = "backfill" if backfill_window is not None else "time_window"
        window = backfill_window or (request.window_from, request.window_to)
        tps = sorted(offsets)
        behind, pending = window_ranges(
            kafka_offsets.offsets_for_time(bootstrap_servers, tps, _ms(window[0])),
            kafka_offsets.offsets_for_time(bootstrap_servers, tps, _ms(window[1])),
            offsets, positions,
        )
        if pending:
            log.info("%d offsets of the window [%s, %s) are not ingested yet; the catch-up runs read them:\n%s",
                     sum(r.span for r in pending), window[0], window[1], _format_ranges(pending))
        if not behind:
            log.info("window [%s, %s) holds no ingested offsets to rewrite: nothing to read", *window)
            return PlannedBatch(None, False, [], 0, kind=kind, pending=pending)
        _refuse(check_rewrite_ranges(behind, offsets, positions, in_flight))
        batch = record(behind, kind, window=window)
        log.info("planned %s batch %s of %s for [%s, %s): %d offsets to re-read and replace:\n%s", kind,
                 batch.batch_id, pipeline.name, window[0], window[1], sum(r.span for r in behind),
                 _format_ranges(behind))
        return PlannedBatch(batch.batch_id, False, behind, 0, kind=kind, pending=pending)

    if request.mode == "offset_ranges":
        ranges = sorted(request.offset_ranges)
        _refuse(check_rewrite_ranges(ranges, offsets, positions, in_flight))
        batch = record(ranges, "offset_ranges")
        log.info("planned offset_ranges batch %s of %s: %d offsets to re-read and replace:\n%s",
                 batch.batch_id, pipeline.name, sum(r.span for r in ranges), _format_ranges(ranges))
        return PlannedBatch(batch.batch_id, False, ranges, 0, kind="offset_ranges")

    if request.mode == "replay_batch":
        try:
            target = ledger.get_batch(cur, request.batch_id)
        except ledger.LedgerError as exc:
            raise RequestError(str(exc)) from exc
        if target.pipeline != pipeline.name:
            raise RequestError(f"batch {target.batch_id} belongs to pipeline {target.pipeline!r}, "
                               f"not {pipeline.name!r}")
        if target.status == "abandoned":
            raise RequestError(f"batch {target.batch_id} was abandoned by a position reset; "
                               "replay its offsets with mode offset_ranges if they are behind the position")
        if target.unfinished:
            # Replaying an unfinished batch is resuming it: same ranges, and a catch-up batch then
            # moves the positions when it commits.
            return _resume(cur, target, offsets, positions, dag_id, run_id)
        ranges = [OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset) for r in target.ranges]
        _refuse(check_rewrite_ranges(ranges, offsets, positions, in_flight))
        batch = record(ranges, "replay", replay_of=target.batch_id)
        log.info("planned replay batch %s of %s batch %s (%s): %d offsets to re-read and replace:\n%s",
                 batch.batch_id, target.kind, target.batch_id, pipeline.name, sum(r.span for r in ranges),
                 _format_ranges(ranges))
        return PlannedBatch(batch.batch_id, False, ranges, 0, kind="replay")

    unfinished = ledger.open_batch(cur, pipeline.name)
    if unfinished is not None:
        return _resume(cur, unfinished, offsets, positions, dag_id, run_id)
    skip_lost = pipeline.on_data_loss == "skip"
    if pipeline.delivery_mode == "latest_only":
        ranges = plan_latest_ranges(positions, offsets, pipeline.max_records_per_partition, skip_lost)
    else:
        ranges = plan_ranges(positions, offsets, pipeline.max_records_per_partition, skip_lost)
    lost = [r for r in ranges if r.skipped_from is not None and r.skipped_from < offsets[r.topic_partition].log_start]
    if lost:
        log.warning(
            "DATA LOSS accepted (on_data_loss: skip): retention deleted offsets %s never read; they are recorded "
            "as skipped in the ledger", ", ".join(
                f"{r.topic}-{r.partition} [{r.skipped_from}, {offsets[r.topic_partition].log_start})" for r in lost),
        )
    remaining = _backlog_after(positions, offsets, ranges)
    if not ranges:
        log.info("no new data in %s for %s: nothing planned, no Spark job", pipeline.subscription, pipeline.name)
        return PlannedBatch(None, False, [], backlog_after=0)
    batch = record(ranges, "catch_up")
    log.info(
        "planned batch %s of %s (%s): %d partition(s), %d offsets (cap %d per partition), "
        "%d offsets left for later batches:\n%s",
        batch.batch_id, pipeline.name, pipeline.delivery_mode, len(ranges), sum(r.span for r in ranges),
        pipeline.max_records_per_partition, remaining, _format_ranges(ranges),
    )
    planned = PlannedBatch(batch.batch_id, False, ranges, backlog_after=remaining)
    if planned.skipped:
        log.warning("latest_only: %d older offsets skipped on purpose and recorded as skipped in the ledger",
                    planned.skipped)
    return planned


def _backlog_after(
    positions: dict[TopicPartition, int], offsets: dict[TopicPartition, PartitionOffsets], ranges: list[OffsetRange]
) -> int:
    after = {tp: pos for tp, pos in positions.items() if tp in offsets}
    for r in ranges:
        after[r.topic_partition] = r.until_offset
    return backlog(after, offsets)


@dataclass(frozen=True)
class CommitResult:
    """The outcome of a commit: counts published, or that the batch was already committed."""

    batch_id: int
    already_committed: bool
    records_written: int
    records_dead_lettered: int
    seconds: float


def commit_batch(dsn: str, pipeline: PipelineConfig, batch_id: int) -> CommitResult:
    """In ONE transaction: replace the rows of the batch's offsets, record its ranges, advance positions.

    Publishes what spark-submit's job staged. Committing a committed batch is a no-op. For a catch-up
    batch, a position that is not at the batch's start (compare-and-set) fails the commit and nothing is
    written. Rewrite batches (replays, windows, backfills, explicit ranges) replace rows behind the
    positions and never move them.
    """
    started = time.monotonic()
    conn = ledger.connect(dsn)
    try:
        with ledger.pipeline_transaction(conn, pipeline.name) as cur:
            ledger.allow_batch_duration(cur, pipeline)
            batch = _lock_batch(cur, pipeline, batch_id)
            if batch.status == "committed":
                log.info("batch %s was already committed at %s: nothing to do", batch_id, batch.committed_at)
                return CommitResult(batch_id, True, batch.records_written or 0, batch.records_dead_lettered or 0, 0.0)
            if batch.status != "written":
                raise CommitError(
                    f"batch {batch_id} is {batch.status}, not written: its Spark job has not staged it completely"
                )
            attempt = batch.staged_attempt
            params = {"batch_id": batch_id, "attempt": attempt, "pipeline": pipeline.name}
            direct = writes_output_directly(pipeline, batch)
            if not direct:
                problems = check_read_coverage(batch.ranges, ledger.staged_read_stats(cur, pipeline, batch_id, attempt))
                if problems:
                    raise CommitError(f"batch {batch_id} staged rows do not match its ranges: " + "; ".join(problems))
            replaced = 0 if direct else _remove_published(cur, pipeline, batch.ranges)
            if direct:
                written = None  # the Spark job appended them already
            else:
                cur.execute(sql.publish_output(pipeline), params)
                written = cur.rowcount
            cur.execute(sql.INSERT_DEAD_LETTERS.format(staging=sql.staging_table(pipeline)), params)
            dead = cur.rowcount
            failpoints.hit("commit_after_publish")
            if written is None:
                written = (batch.records_read or 0) - dead
            result = _finish_commit(cur, pipeline, batch, written, dead, started)
        _log_commit(pipeline, batch, result, replaced)
        return result
    except CommitError as exc:
        with conn, conn.cursor() as cur:
            cur.execute(sql.RECORD_ERROR, {"batch_id": batch_id, "error": str(exc)[:4000]})
        raise
    finally:
        conn.close()


def publish_batch(
    dsn: str, pipeline: PipelineConfig, batch_id: int, attempt: int, tables: Iterable[Any], *, started: float
) -> CommitResult:
    """In ONE transaction: copy an attempt's rows into the output table and the dead letters, then commit.

    The Spark Connect runtime's publish: `tables` are Arrow tables of COPY lines (publish.copy_lines),
    streamed into COPY as Spark produces them, with no staging copy. The rows are checked against the
    ranges, the batch is marked written and committed exactly as commit_batch does. Only the attempt that
    began last may publish: an older (zombie) attempt finds the batch moved on and writes nothing.
    """
    from kafka_ledger.ingest import log_read
    from kafka_ledger.publish import CopyStream

    conn = ledger.connect(dsn)
    try:
        with ledger.pipeline_transaction(conn, pipeline.name) as cur:
            ledger.allow_batch_duration(cur, pipeline)
            batch = _lock_batch(cur, pipeline, batch_id)
            if batch.status != "planned" or batch.attempts != attempt:
                raise ledger.LedgerError(
                    f"batch {batch_id} attempt {attempt} may not publish: the batch is {batch.status} with "
                    f"{batch.attempts} attempts (superseded by a newer attempt?); nothing was written"
                )
            replaced = _remove_published(cur, pipeline, batch.ranges)
            stream = CopyStream(tables)
            try:
                cur.copy_expert(sql.copy_output(pipeline), stream, size=COPY_CHUNK_BYTES)
            except psycopg2.Error:
                if stream.error is not None:  # the read failed: say why, not that COPY was cancelled
                    raise stream.error from None
                raise
            written = cur.rowcount
            dead_lines = stream.dead_letter_lines()
            dead = 0
            if dead_lines:
                cur.copy_expert(sql.COPY_DEAD_LETTERS, io.BytesIO(dead_lines), size=COPY_CHUNK_BYTES)
                dead = cur.rowcount
            read_seconds = time.monotonic() - started
            failpoints.hit("after_staging")
            stats = stream.read_stats()
            problems = check_read_coverage(batch.ranges, stats)
            if problems:
                raise ledger.LedgerError(f"batch {batch_id} was not read completely: " + "; ".join(problems))
            ledger.mark_written(cur, batch_id, attempt, stats, read_seconds)
            log_read(batch, attempt, stats, read_seconds)
            failpoints.hit("commit_after_publish")
            result = _finish_commit(cur, pipeline, ledger.get_batch(cur, batch_id), written, dead, started)
        _log_commit(pipeline, batch, result, replaced)
        return result
    finally:
        conn.close()


def _lock_batch(cur: ledger.Cursor, pipeline: PipelineConfig, batch_id: int) -> ledger.Batch:
    """The batch, locked until the transaction ends: no attempt can start or commit it meanwhile."""
    batch = ledger.get_batch(cur, batch_id, for_update=True)
    if batch.pipeline != pipeline.name:
        raise CommitError(f"batch {batch_id} belongs to pipeline {batch.pipeline!r}, not {pipeline.name!r}")
    return batch


def _finish_commit(
    cur: ledger.Cursor, pipeline: PipelineConfig, batch: ledger.Batch, written: int, dead: int, started: float
) -> CommitResult:
    """The end of every commit: counts checked, coverage and positions recorded, batch committed."""
    params = {"batch_id": batch.batch_id, "pipeline": pipeline.name}
    if written + dead != (batch.records_read or 0):
        raise CommitError(
            f"batch {batch.batch_id}: {written} rows + {dead} dead letters != {batch.records_read} records read"
        )
    if batch.moves_positions:
        _advance(cur, batch, params)
    else:
        _cover_rewrite(cur, pipeline, batch)
    seconds = time.monotonic() - started
    cur.execute(
        sql.MARK_COMMITTED,
        {**params, "records_written": written, "records_dead_lettered": dead, "commit_seconds": seconds},
    )
    cur.execute(sql.DELETE_STAGED.format(staging=sql.staging_table(pipeline)), params)
    failpoints.hit("commit_before_end")
    return CommitResult(batch.batch_id, False, written, dead, seconds)


def _log_commit(pipeline: PipelineConfig, batch: ledger.Batch, result: CommitResult, replaced: int) -> None:
    log.info(
        "committed %s batch %s of %s: %d rows into %s (%d rows of earlier runs replaced), %d dead letters, "
        "%s in %.2fs", batch.kind, batch.batch_id, pipeline.name, result.records_written,
        pipeline.qualified_output_table, replaced, result.records_dead_lettered,
        f"{len(batch.ranges)} partition position(s) advanced" if batch.moves_positions else "positions unchanged",
        result.seconds,
    )


def writes_output_directly(pipeline: PipelineConfig, batch: ledger.Batch) -> bool:
    """at_least_once catch-up batches are appended by the Spark job itself; everything else is staged."""
    return pipeline.delivery_mode == "at_least_once" and batch.kind == "catch_up"


def _remove_published(cur: ledger.Cursor, pipeline: PipelineConfig, ranges: list[OffsetRange]) -> int:
    removed = 0
    for r in ranges:
        params = {"pipeline": pipeline.name, "topic": r.topic, "partition": r.partition,
                  "from_offset": r.from_offset, "until_offset": r.until_offset}
        cur.execute(sql.delete_output_range(pipeline), params)
        removed += cur.rowcount
        cur.execute(sql.DELETE_DEAD_LETTER_RANGE, params)
        removed += cur.rowcount
    return removed


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
    conn = ledger.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            ledger.mark_failed(cur, batch_id, error)
    finally:
        conn.close()
