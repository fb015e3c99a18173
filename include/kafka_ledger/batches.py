"""A batch's life: plan (or resume) it, then commit it in one transaction, or record its failure."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kafka_ledger import kafka_offsets, ledger, sql
from kafka_ledger.config import PipelineConfig
from kafka_ledger.planning import (
    LostDataError,
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    backlog,
    check_read_coverage,
    lost_ranges,
    plan_ranges,
    start_positions,
)

log = logging.getLogger(__name__)


class CommitError(ledger.LedgerError):
    """The batch cannot be committed; nothing was written and no offset moved."""


@dataclass(frozen=True)
class PlannedBatch:
    """What the plan step decided: a batch to read (new or resumed), or nothing to do."""

    batch_id: int | None
    resumed: bool
    ranges: list[OffsetRange]
    backlog_after: int  # offsets still unread after this batch (gaps included): > 0 means "run again"

    @property
    def offsets(self) -> int:
        return sum(r.span for r in self.ranges)


def _format_ranges(ranges: list[OffsetRange]) -> str:
    return "\n".join(f"  {r}  ({r.span} offsets)" for r in ranges)


def plan_next_batch(
    dsn: str,
    bootstrap_servers: str,
    pipeline: PipelineConfig,
    dag_id: str | None = None,
    run_id: str | None = None,
) -> PlannedBatch:
    """Resume the pipeline's unfinished batch, or record the next capped batch before anything is read."""
    conn = ledger.connect(dsn)
    try:
        with ledger.pipeline_transaction(conn, pipeline.name) as cur:
            ledger.ensure_pipeline_tables(cur, pipeline)
            unfinished = ledger.open_batch(cur, pipeline.name)
            offsets = kafka_offsets.partition_offsets(bootstrap_servers, pipeline.topics)
            known = ledger.positions(cur, pipeline.name)
            new = [tp for tp in offsets if tp not in known]
            if new:
                starts = start_positions(new, offsets, pipeline.start_position)
                ledger.insert_start_positions(cur, pipeline.name, starts)
                log.info("%d new partition(s) start at %s: %s", len(new), pipeline.start_position,
                         ", ".join(f"{tp}@{pos}" for tp, pos in sorted(starts.items())))
                known = {**known, **starts}
            positions = {tp: pos for tp, pos in known.items() if tp.topic in pipeline.topics}

            if unfinished is not None:
                lost = lost_ranges(unfinished.ranges, offsets)
                if lost:
                    raise LostDataError(lost)
                ledger.set_batch_owner(cur, unfinished.batch_id, dag_id, run_id)
                remaining = _backlog_after(positions, offsets, unfinished.ranges)
                log.info(
                    "resuming batch %s of %s (status %s, %s attempt(s) so far%s) with its recorded ranges:\n%s",
                    unfinished.batch_id, pipeline.name, unfinished.status, unfinished.attempts,
                    f", last error: {unfinished.last_error}" if unfinished.last_error else "",
                    _format_ranges(unfinished.ranges),
                )
                return PlannedBatch(unfinished.batch_id, True, unfinished.ranges, backlog_after=remaining)

            ranges = plan_ranges(positions, offsets, pipeline.max_records_per_partition)
            remaining = _backlog_after(positions, offsets, ranges)
            if not ranges:
                log.info("no new data in %s for %s: nothing planned, no Spark job", ", ".join(pipeline.topics),
                         pipeline.name)
                return PlannedBatch(None, False, [], backlog_after=0)
            batch = ledger.create_batch(cur, pipeline.name, ranges, dag_id, run_id)
            log.info(
                "planned batch %s of %s: %d partition(s), %d offsets (cap %d per partition), "
                "%d offsets left for later batches:\n%s",
                batch.batch_id, pipeline.name, len(ranges), sum(r.span for r in ranges),
                pipeline.max_records_per_partition, remaining, _format_ranges(ranges),
            )
            return PlannedBatch(batch.batch_id, False, ranges, backlog_after=remaining)
    finally:
        conn.close()


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
    """In ONE transaction: publish staged rows and dead letters, record the ranges, advance positions.

    Committing a committed batch is a no-op. A position that is not at the batch's from-offset
    (compare-and-set) fails the commit and nothing is written.
    """
    started = time.monotonic()
    conn = ledger.connect(dsn)
    try:
        with ledger.pipeline_transaction(conn, pipeline.name) as cur:
            batch = ledger.get_batch(cur, batch_id, for_update=True)
            if batch.pipeline != pipeline.name:
                raise CommitError(f"batch {batch_id} belongs to pipeline {batch.pipeline!r}, not {pipeline.name!r}")
            if batch.status == "committed":
                log.info("batch %s was already committed at %s: nothing to do", batch_id, batch.committed_at)
                return CommitResult(batch_id, True, batch.records_written or 0, batch.records_dead_lettered or 0, 0.0)
            if batch.status != "written":
                raise CommitError(
                    f"batch {batch_id} is {batch.status}, not written: its Spark job has not staged it completely"
                )
            attempt = batch.staged_attempt
            problems = check_read_coverage(batch.ranges, ledger.staged_read_stats(cur, pipeline, batch_id, attempt))
            if problems:
                raise CommitError(f"batch {batch_id} staged rows do not match its ranges: " + "; ".join(problems))
            params = {"batch_id": batch_id, "attempt": attempt, "pipeline": pipeline.name}
            cur.execute(sql.publish_output(pipeline), params)
            written = cur.rowcount
            cur.execute(sql.INSERT_DEAD_LETTERS.format(staging=sql.staging_table(pipeline)), params)
            dead = cur.rowcount
            if written + dead != (batch.records_read or 0):
                raise CommitError(
                    f"batch {batch_id}: {written} rows + {dead} dead letters != {batch.records_read} records read"
                )
            cur.execute(sql.INSERT_COMMITTED_RANGES, params)
            cur.execute(sql.ADVANCE_POSITIONS, params)
            if cur.rowcount != len(batch.ranges):
                cur.execute(sql.SELECT_POSITION_MISMATCHES, params)
                details = "; ".join(
                    f"{topic}-{partition}: ledger position {position}, batch starts at {from_offset}"
                    for topic, partition, from_offset, position in cur.fetchall()
                )
                raise CommitError(f"batch {batch_id}: compare-and-set on positions failed ({details})")
            seconds = time.monotonic() - started
            cur.execute(
                sql.MARK_COMMITTED,
                {**params, "records_written": written, "records_dead_lettered": dead, "commit_seconds": seconds},
            )
            cur.execute(sql.DELETE_STAGED.format(staging=sql.staging_table(pipeline)), params)
        log.info(
            "committed batch %s of %s: %d rows into %s, %d dead letters, %d partition position(s) advanced "
            "in %.2fs", batch_id, pipeline.name, written, pipeline.qualified_output_table, dead,
            len(batch.ranges), seconds,
        )
        return CommitResult(batch_id, False, written, dead, seconds)
    except CommitError as exc:
        with conn, conn.cursor() as cur:
            cur.execute(sql.RECORD_ERROR, {"batch_id": batch_id, "error": str(exc)[:4000]})
        raise
    finally:
        conn.close()


def fail_batch(dsn: str, batch_id: int, error: str) -> None:
    """Record that reading the batch failed for good this run; the next run resumes the same ranges."""
    conn = ledger.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            ledger.mark_failed(cur, batch_id, error)
    finally:
        conn.close()
