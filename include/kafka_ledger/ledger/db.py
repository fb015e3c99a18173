"""The offset ledger in Postgres: batches, their ranges and the committed positions of each pipeline."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.formats.base import SchemaPin
from kafka_ledger.ledger import replies as db_replies
from kafka_ledger.ledger import sql
from kafka_ledger.model.columns import Column
from kafka_ledger.model.ranges import Coverage, OffsetRange, PartitionReadStats, TopicPartition

log = logging.getLogger(__name__)

Cursor = psycopg2.extensions.cursor


class LedgerError(RuntimeError):
    """The ledger refuses an operation; the transaction was rolled back."""


# The exit code of a batch's Spark job whose attempt was fenced (AttemptFenced): not a failure of the batch.
EXIT_FENCED = 6


class AttemptFenced(LedgerError):
    """An attempt may no longer write or publish its batch: a newer attempt began after it (a second driver or task
    for the same batch), or the batch is no longer open. Nothing of this attempt was published."""

    def __init__(self, batch: Batch, attempt: int, action: str):
        self.batch_id, self.attempt = batch.batch_id, attempt
        if batch.attempts != attempt:
            why = (f"attempt {batch.attempts} of the same batch began after it (a second driver or task for this "
                   f"batch: a resubmission, a zombie, a racing retry); the batch is {batch.status}, carried by the "
                   "newest attempt")
        else:
            why = f"the batch is {batch.status}"
        super().__init__(f"batch {batch.batch_id} attempt {attempt} is fenced and may not {action}: {why}. "
                         "Nothing of this attempt was published")


def check_newest_attempt(batch: Batch, attempt: int, action: str) -> Batch:
    """`batch` if `attempt` is its newest and the batch is still planned; else AttemptFenced."""
    if batch.status != "planned" or batch.attempts != attempt:
        raise AttemptFenced(batch, attempt, action)
    return batch


@dataclass
class Batch:
    """One batch of a pipeline as recorded in the ledger."""

    batch_id: int
    pipeline: str
    status: str
    attempts: int
    staged_attempt: int | None
    dag_id: str | None
    run_id: str | None
    planned_at: datetime
    started_at: datetime | None = None
    written_at: datetime | None = None
    committed_at: datetime | None = None
    failed_at: datetime | None = None
    records_read: int | None = None
    records_written: int | None = None
    records_dead_lettered: int | None = None
    read_seconds: float | None = None
    commit_seconds: float | None = None
    last_error: str | None = None
    kind: str = "catch_up"
    replay_of: int | None = None
    requested_by: str | None = None
    reason: str | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    snapshot_id: int | None = None  # the Iceberg snapshot that published it (an Iceberg sink)
    ranges: list[OffsetRange] = field(default_factory=list)

    @property
    def unfinished(self) -> bool:
        return self.status not in ("committed", "abandoned")

    @property
    def moves_positions(self) -> bool:
        """Only catch-up batches advance positions; every other kind rewrites offsets behind them."""
        return self.kind == "catch_up"


def connect(db: LedgerDatabase) -> db_replies.WatchedConnection:
    """A connection to the ledger database, its statements and lock waits bounded (the database's timeouts), and
    the client's every wait on the server too (db_replies: a server that stops answering fails the call).

    Every `with conn:` block is one transaction.
    """
    conn = db_replies.connect(db.libpq(), application_name="kafka-ledger", connect_timeout=10)
    conn.lock_timeout = db.lock_timeout
    try:
        conn.autocommit = True  # a session setting, outside any transaction
        with conn.cursor() as cur:
            cur.execute(sql.SET_SESSION_TIMEOUTS, {"statement_timeout": f"{db.statement_timeout}s",
                                                   "lock_timeout": f"{db.lock_timeout}s"})
        conn.bound_replies(db.statement_timeout)
        conn.autocommit = False
    except BaseException:
        conn.close()
        raise
    return conn


# This thread's kept connections, by database, while a `keeping_connections` block runs in it.
_kept = threading.local()


@contextmanager
def keeping_connections() -> Iterator[None]:
    """Within the block, this thread's ledger sessions (`session`, `transaction`) reuse one connection per database,
    closed when the block ends: for work that runs many short transactions in a row (a carrier's members: a new
    connection each, over TLS and with a password exchange, cost more than the transactions themselves). A connection
    that raised, or that a block left inside a transaction, is closed and never reused; every lock the ledger takes
    ends with its transaction."""
    outer = getattr(_kept, "connections", None)
    _kept.connections = {}
    try:
        yield
    finally:
        for conn in _kept.connections.values():
            conn.close()
        _kept.connections = outer


@contextmanager
def session(db: LedgerDatabase) -> Iterator[db_replies.WatchedConnection]:
    """A ledger connection for the block, closed after it (inside `keeping_connections`: this thread's kept one);
    each `with conn:` inside is one transaction."""
    kept: dict[LedgerDatabase, db_replies.WatchedConnection] | None = getattr(_kept, "connections", None)
    if kept is None:
        conn = connect(db)
        try:
            yield conn
        finally:
            conn.close()
        return
    conn = kept.pop(db, None)
    if conn is None or conn.closed:
        conn = connect(db)
    try:
        yield conn
    except BaseException:
        conn.close()
        raise
    if conn.closed or conn.get_transaction_status() != psycopg2.extensions.TRANSACTION_STATUS_IDLE or db in kept:
        conn.close()  # left in a transaction; or a nested session's, the thread keeping another one already
    else:
        kept[db] = conn


@contextmanager
def transaction(db: LedgerDatabase) -> Iterator[Cursor]:
    """One ledger transaction on a connection of its own: committed when the block ends, rolled back on error."""
    with session(db) as conn, conn, conn.cursor() as cur:
        yield cur


@contextmanager
def pipeline_transaction(conn: db_replies.WatchedConnection, pipeline: str) -> Iterator[Cursor]:
    """One transaction holding the pipeline's lock: no other plan or commit of it runs meanwhile."""
    with conn, conn.cursor() as cur:
        try:
            cur.execute(sql.LOCK_PIPELINE, {"pipeline": pipeline})
        except psycopg2.errors.LockNotAvailable:
            conn.rollback()
            cur.execute(sql.PIPELINE_LOCK_HOLDERS, {"pipeline": pipeline})
            holders = "; ".join(f"pid {pid} ({app or 'no application name'}, {state}, transaction open {age})"
                                for pid, app, state, age in cur.fetchall()) or "a session that has ended since"
            raise LedgerError(
                f"pipeline {pipeline!r}: waited {conn.lock_timeout} s for its ledger lock, held by "
                f"{holders}. One plan, commit or reset of a pipeline runs at a time; if that one is hung, end it "
                "with SELECT pg_terminate_backend(<pid>) (its transaction rolls back); if batches legitimately take "
                "longer, raise KAFKA_LEDGER_DB_LOCK_TIMEOUT. Nothing was written."
            ) from None
        yield cur


def allow_batch_duration(cur: Cursor, pipeline: PipelineConfig) -> None:
    """Let this transaction's statements run as long as the pipeline's Spark task may (a whole batch's rows)."""
    cur.execute(sql.SET_TRANSACTION_STATEMENT_TIMEOUT, {"statement_timeout": f"{pipeline.spark_timeout_minutes}min"})
    cur.connection.widen_for_transaction(pipeline.spark_timeout_minutes * 60)  # the client waits as long (db_replies)


def _load_ranges(cur: Cursor, batch: Batch) -> Batch:
    cur.execute(sql.SELECT_BATCH_RANGES, {"batch_id": batch.batch_id})
    batch.ranges = [OffsetRange(*row) for row in cur.fetchall()]
    return batch


def get_batch(cur: Cursor, batch_id: int, for_update: bool = False) -> Batch:
    cur.execute(sql.SELECT_BATCH_FOR_UPDATE if for_update else sql.SELECT_BATCH, {"batch_id": batch_id})
    row = cur.fetchone()
    if row is None:
        raise LedgerError(f"batch {batch_id} does not exist in the ledger")
    return _load_ranges(cur, Batch(*row))


def pipeline_batch(cur: Cursor, pipeline: str, batch_id: int, for_update: bool = False) -> Batch:
    """A batch of `pipeline`; LedgerError when it does not exist or belongs to another pipeline."""
    batch = get_batch(cur, batch_id, for_update)
    if batch.pipeline != pipeline:
        raise LedgerError(f"batch {batch_id} belongs to pipeline {batch.pipeline!r}, not {pipeline!r}")
    return batch


def open_batch(cur: Cursor, pipeline: str) -> Batch | None:
    """The pipeline's unfinished batch (planned, written or failed), if any: there is at most one."""
    cur.execute(sql.SELECT_OPEN_BATCH, {"pipeline": pipeline})
    row = cur.fetchone()
    return _load_ranges(cur, Batch(*row)) if row else None


def create_batch(
    cur: Cursor,
    pipeline: str,
    ranges: list[OffsetRange],
    dag_id: str | None,
    run_id: str | None,
    kind: str = "catch_up",
    replay_of: int | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
    window: tuple[datetime, datetime] | None = None,
    end_offsets: Mapping[TopicPartition, int] | None = None,
) -> Batch:
    """Record a new batch and its exact ranges: this happens BEFORE anything is read.

    end_offsets: each partition's end offset in Kafka as planned (the lag of that moment, for the ledger page).
    """
    cur.execute(
        sql.INSERT_BATCH,
        {"pipeline": pipeline, "dag_id": dag_id, "run_id": run_id, "kind": kind, "replay_of": replay_of,
         "requested_by": requested_by, "reason": reason or None,
         "window_start": window[0] if window else None, "window_end": window[1] if window else None},
    )
    batch_id = cur.fetchone()[0]
    psycopg2.extras.execute_values(
        cur, sql.INSERT_BATCH_RANGES,
        [(batch_id, pipeline, r.topic, r.partition, r.from_offset, r.until_offset, r.skipped_from,
          (end_offsets or {}).get(r.topic_partition)) for r in ranges],
        template=sql.BATCH_RANGE_VALUES, page_size=len(ranges) or 1,
    )
    return get_batch(cur, batch_id)


def record_schema_pins(cur: Cursor, batch_id: int, schemas: list[SchemaPin]) -> None:
    """Pin the schemas of a batch's topics' values and keys (a registry format's: in the plan's transaction, before
    anything is read)."""
    psycopg2.extras.execute_batch(cur, sql.INSERT_BATCH_READER_SCHEMA, [
        {"batch_id": batch_id, "topic": s.topic, "subject": s.subject, "schema_id": s.schema_id,
         "version": s.version, "chosen": s.chosen, "part": s.part} for s in schemas])


def schema_pins(cur: Cursor, batch_id: int) -> dict[tuple[str, str], SchemaPin]:
    """The schemas pinned for a batch, by (part, topic): `value` and, where keys are read with a schema, `key` (none
    for a format whose values carry no schema id)."""
    cur.execute(sql.SELECT_BATCH_READER_SCHEMAS, {"batch_id": batch_id})
    return {(pin.part, pin.topic): pin for pin in (SchemaPin(*row) for row in cur.fetchall())}


@dataclass(frozen=True)
class RecordedColumns:
    """The columns a pipeline that leaves `columns:` out took from its reader schema (a subject's version) at its
    first plan: declarations as the pipelines file would hold them."""

    subject: str
    schema_id: int
    version: int | None
    columns: list[dict[str, Any]]


def record_pipeline_columns(cur: Cursor, pipeline: str, recorded: RecordedColumns) -> RecordedColumns:
    """Record a pipeline's columns unless a racing plan did first; the ones that stand."""
    cur.execute(sql.INSERT_PIPELINE_COLUMNS, {
        "pipeline": pipeline, "subject": recorded.subject, "schema_id": recorded.schema_id,
        "version": recorded.version, "columns": psycopg2.extras.Json(recorded.columns)})
    standing = pipeline_columns(cur, pipeline)
    assert standing is not None
    return standing


def extend_pipeline_columns(cur: Cursor, pipeline: str, recorded: RecordedColumns) -> RecordedColumns:
    """Record a newer version of a pipeline's subject and its columns (the earlier ones first, then those added)."""
    cur.execute(sql.UPDATE_PIPELINE_COLUMNS, {
        "pipeline": pipeline, "schema_id": recorded.schema_id, "version": recorded.version,
        "columns": psycopg2.extras.Json(recorded.columns)})
    return recorded


def pipeline_columns(cur: Cursor, pipeline: str) -> RecordedColumns | None:
    """The columns a pipeline took from its reader schema at its first plan (None: not recorded)."""
    cur.execute(sql.SELECT_PIPELINE_COLUMNS, {"pipeline": pipeline})
    row = cur.fetchone()
    return RecordedColumns(*row) if row else None


def batch_topic_ids(cur: Cursor, batch_id: int) -> dict[str, str | None]:
    """The Kafka topic id each topic of the batch was planned against (None: unknown, planned before ids)."""
    cur.execute(sql.SELECT_BATCH_TOPIC_IDS, {"batch_id": batch_id})
    return dict(cur.fetchall())


def read_coverage_topic_ids(cur: Cursor, pipeline: str) -> list[tuple[OffsetRange, str | None]]:
    """Every read stretch of the pipeline with the topic id its batch read it under (None: not recorded)."""
    cur.execute(sql.SELECT_READ_COVERAGE_TOPIC_IDS, {"pipeline": pipeline})
    return [(OffsetRange(topic, partition, lo, hi), topic_id) for topic, partition, lo, hi, topic_id in cur.fetchall()]


def in_flight_batches(cur: Cursor, pipeline: str) -> list[Batch]:
    """Every unfinished batch of the pipeline (the catch-up one and any rewrites)."""
    cur.execute(sql.SELECT_IN_FLIGHT_BATCH_IDS, {"pipeline": pipeline})
    return [get_batch(cur, batch_id) for (batch_id,) in cur.fetchall()]


def run_open_batch(cur: Cursor, pipeline: str, dag_id: str | None, run_id: str | None) -> Batch | None:
    """The unfinished batch this DAG run recorded earlier (its plan task is being retried), if any."""
    if not dag_id or not run_id:
        return None
    cur.execute(sql.SELECT_RUN_OPEN_BATCH, {"pipeline": pipeline, "dag_id": dag_id, "run_id": run_id})
    row = cur.fetchone()
    return get_batch(cur, row[0]) if row else None


def run_committed_batches(cur: Cursor, pipeline: str, dag_id: str | None, run_id: str | None) -> list[Batch]:
    """The batches this DAG run committed, oldest first (the run was cleared to run again)."""
    if not dag_id or not run_id:
        return []
    cur.execute(sql.SELECT_RUN_COMMITTED_BATCH_IDS, {"pipeline": pipeline, "dag_id": dag_id, "run_id": run_id})
    return [get_batch(cur, batch_id) for (batch_id,) in cur.fetchall()]


def list_batches(cur: Cursor, pipeline: str, limit: int = 20, status: str | None = None) -> list[Batch]:
    cur.execute(sql.LIST_BATCHES, {"pipeline": pipeline, "limit": limit, "status": status})
    return [_load_ranges(cur, Batch(*row)) for row in cur.fetchall()]


@dataclass(frozen=True)
class PositionRow:
    """A partition's committed position, where the pipeline began reading it, and what moved it last."""

    topic: str
    partition: int
    position: int
    start_offset: int
    last_batch_id: int | None
    updated_at: datetime
    # The Kafka timestamp of the newest record committed in the partition (None: none yet, or before 0011).
    newest_timestamp: datetime | None = None

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def pipelines_position_rows(cur: Cursor, pipelines: list[str]) -> dict[str, dict[TopicPartition, PositionRow]]:
    """Each of the pipelines' position rows by partition ({} for a pipeline with none yet), in one query."""
    cur.execute(sql.SELECT_POSITION_ROWS, {"pipelines": pipelines})
    found: dict[str, dict[TopicPartition, PositionRow]] = {name: {} for name in pipelines}
    for pipeline, *fields in cur.fetchall():
        row = PositionRow(*fields)
        found[pipeline][row.topic_partition] = row
    return found


def position_rows(cur: Cursor, pipeline: str) -> list[PositionRow]:
    """The pipeline's position rows, by topic and partition."""
    return list(pipelines_position_rows(cur, [pipeline])[pipeline].values())


def verified_point(cur: Cursor, pipeline: str) -> int | None:
    """The batch id through which the last clean verify checked the pipeline (None: never verified)."""
    cur.execute(sql.SELECT_VERIFIED_POINT, {"pipeline": pipeline})
    row = cur.fetchone()
    return row[0] if row else None


def coverage(cur: Cursor, pipeline: str) -> dict[TopicPartition, list[Coverage]]:
    """Committed coverage of each partition: ranges read and published, or skipped on purpose."""
    cur.execute(sql.SELECT_COVERAGE, {"pipeline": pipeline})
    result: dict[TopicPartition, list[Coverage]] = {}
    for topic, partition, lo, hi, disposition, batch_id, reset_id in cur.fetchall():
        result.setdefault(TopicPartition(topic, partition), []).append(
            Coverage(lo, hi, disposition, batch_id, reset_id)
        )
    return result


def replace_coverage(
    cur: Cursor, pipeline: str, tp: TopicPartition, removed: list[Coverage], added: list[Coverage]
) -> None:
    """Apply coverage changes of one partition (removals first: the no-overlap constraint is immediate)."""
    key = {"pipeline": pipeline, "topic": tp.topic, "partition": tp.partition}
    for c in removed:
        cur.execute(sql.DELETE_COVERAGE, {**key, "from_offset": c.from_offset})
    for c in added:
        cur.execute(
            sql.INSERT_COVERAGE,
            {**key, "from_offset": c.from_offset, "until_offset": c.until_offset, "disposition": c.disposition,
             "batch_id": c.batch_id, "reset_id": c.reset_id},
        )


def set_batch_owner(cur: Cursor, batch_id: int, dag_id: str | None, run_id: str | None) -> None:
    cur.execute(sql.UPDATE_BATCH_OWNER, {"batch_id": batch_id, "dag_id": dag_id, "run_id": run_id})


def positions(cur: Cursor, pipeline: str) -> dict[TopicPartition, int]:
    """The committed position of each partition the pipeline has seen."""
    cur.execute(sql.SELECT_POSITIONS, {"pipeline": pipeline})
    return {TopicPartition(topic, partition): position for topic, partition, position in cur.fetchall()}


def observe_log_starts(cur: Cursor, pipeline: str, log_starts: Mapping[TopicPartition, int]) -> None:
    """Record where each partition's log start is now (kept only when it moved)."""
    psycopg2.extras.execute_values(
        cur, sql.OBSERVE_LOG_STARTS,
        [(pipeline, tp.topic, tp.partition, log_start) for tp, log_start in sorted(log_starts.items())],
        template="(%s, %s, %s, %s, now())",
    )


def log_start_rates(cur: Cursor, pipeline: str) -> dict[TopicPartition, float]:
    """Offsets per second at which retention has been moving each partition's log start, where plans saw it move."""
    cur.execute(sql.SELECT_LOG_START_RATES, {"pipeline": pipeline})
    return {TopicPartition(topic, partition): float(rate) for topic, partition, rate in cur.fetchall()}


def topic_anchors(cur: Cursor, pipeline: str) -> dict[str, str]:
    """The Kafka topic id each of the pipeline's topics is anchored to."""
    cur.execute(sql.SELECT_TOPIC_ANCHORS, {"pipeline": pipeline})
    return dict(cur.fetchall())


def anchor_topics(cur: Cursor, pipeline: str, topic_ids: dict[str, str]) -> None:
    """Anchor (or re-anchor) topics of the pipeline to these Kafka topic ids."""
    psycopg2.extras.execute_batch(
        cur, sql.UPSERT_TOPIC_ANCHOR,
        [{"pipeline": pipeline, "topic": topic, "topic_id": topic_id} for topic, topic_id in topic_ids.items()],
    )


def batch_statuses(cur: Cursor, pipeline: str, batch_ids: Iterable[int]) -> dict[int, str]:
    """The status of each of the pipeline's batches among `batch_ids` (ids the ledger does not know are left out)."""
    cur.execute(sql.SELECT_BATCH_STATUSES, {"pipeline": pipeline, "batch_ids": sorted(set(batch_ids))})
    return dict(cur.fetchall())


def hold_carrying_lease(cur: Cursor, pipeline: str, dag_id: str, run_id: str, seconds: float) -> None:
    """Record that this DAG run carries the pipeline's batches for the next `seconds` (its doorbell keeps quiet)."""
    cur.execute(sql.HOLD_CARRYING_LEASE, {"pipeline": pipeline, "dag_id": dag_id, "run_id": run_id,
                                          "seconds": seconds})


def release_carrying_lease(cur: Cursor, pipeline: str, dag_id: str, run_id: str) -> None:
    cur.execute(sql.RELEASE_CARRYING_LEASE, {"pipeline": pipeline, "dag_id": dag_id, "run_id": run_id})


def carrying_run(cur: Cursor, pipeline: str) -> str | None:
    """The DAG run carrying the pipeline's batches now, if one holds an unexpired lease."""
    cur.execute(sql.SELECT_CARRYING_RUN, {"pipeline": pipeline})
    row = cur.fetchone()
    return row[0] if row else None


def carrying_pipelines(cur: Cursor, pipelines: list[str]) -> set[str]:
    """Those of the pipelines a DAG run carries the batches of now (an unexpired lease: carrying_run)."""
    cur.execute(sql.DOORBELL_CARRYING, {"pipelines": pipelines})
    return {row[0] for row in cur.fetchall()}


def spark_session(cur: Cursor, pipeline: str) -> str | None:
    """The Spark Connect session that replaced the pipeline's default one, if the server ever closed that."""
    cur.execute(sql.SELECT_SPARK_SESSION, {"pipeline": pipeline})
    row = cur.fetchone()
    return row[0] if row else None


def replace_spark_session(cur: Cursor, pipeline: str, closed: str, replacement: str) -> str:
    """Make `replacement` the pipeline's Spark Connect session in place of `closed`; returns the session the
    pipeline has now (another attempt's replacement, if one got there first)."""
    cur.execute(sql.REPLACE_SPARK_SESSION, {"pipeline": pipeline, "closed": closed, "replacement": replacement})
    row = cur.fetchone()
    if row is None:  # the row names another session already: that replacement won
        cur.execute(sql.SELECT_SPARK_SESSION, {"pipeline": pipeline})
        row = cur.fetchone()
    return row[0]


def insert_start_positions(cur: Cursor, pipeline: str, starts: dict[TopicPartition, int]) -> None:
    psycopg2.extras.execute_values(
        cur, sql.INSERT_START_POSITIONS,
        [(pipeline, tp.topic, tp.partition, pos) for tp, pos in starts.items()],
        template=sql.START_POSITION_VALUES, page_size=len(starts) or 1,
    )


def begin_attempt(cur: Cursor, batch_id: int) -> int:
    """Start a new read attempt of a planned or failed batch; returns its attempt number."""
    cur.execute(sql.BEGIN_ATTEMPT, {"batch_id": batch_id})
    row = cur.fetchone()
    if row is None:
        batch = get_batch(cur, batch_id)
        raise LedgerError(f"batch {batch_id} is {batch.status}: there is nothing to read")
    return row[0]


def mark_written(
    cur: Cursor, batch_id: int, attempt: int, stats: list[PartitionReadStats], read_seconds: float
) -> None:
    """Declare the batch's staged rows complete; refused if a newer attempt has started since."""
    records_read = sum(s.records for s in stats)
    cur.execute(
        sql.MARK_WRITTEN,
        {"batch_id": batch_id, "attempt": attempt, "records_read": records_read, "read_seconds": read_seconds},
    )
    if cur.rowcount != 1:
        check_newest_attempt(get_batch(cur, batch_id), attempt, "be marked written")
        raise LedgerError(f"batch {batch_id} attempt {attempt} could not be marked written")
    by_partition = {(s.topic, s.partition): s for s in stats}
    ranges = get_batch(cur, batch_id).ranges
    psycopg2.extras.execute_values(
        cur, sql.UPDATE_RANGES_RECORDS_READ,
        [(batch_id, r.topic, r.partition, read.records if (read := by_partition.get((r.topic, r.partition))) else 0,
          read.newest_timestamp if read else None) for r in ranges],
        template=sql.RANGE_RECORDS_READ_VALUES, page_size=len(ranges) or 1,
    )


def record_snapshot(cur: Cursor, batch_id: int, snapshot_id: int) -> None:
    """The Iceberg snapshot that published the batch (an Iceberg sink)."""
    cur.execute(sql.RECORD_BATCH_SNAPSHOT, {"batch_id": batch_id, "snapshot_id": snapshot_id})


def mark_failed(cur: Cursor, batch_id: int, error: str) -> None:
    """Record that the batch's read failed; it stays open and the next run resumes it unchanged."""
    cur.execute(sql.MARK_FAILED, {"batch_id": batch_id, "error": error[:4000]})
    if cur.rowcount == 0:
        cur.execute(sql.RECORD_ERROR, {"batch_id": batch_id, "error": error[:4000]})


def staged_read_stats(cur: Cursor, pipeline: PipelineConfig, batch_id: int, attempt: int) -> list[PartitionReadStats]:
    cur.execute(
        sql.STAGED_READ_STATS.format(staging=sql.staging_table(pipeline)),
        {"batch_id": batch_id, "attempt": attempt},
    )
    return [PartitionReadStats(*row) for row in cur.fetchall()]


def delete_older_staged(cur: Cursor, pipeline: PipelineConfig, batch_id: int, attempt: int) -> int:
    cur.execute(
        sql.DELETE_OLDER_STAGED.format(staging=sql.staging_table(pipeline)),
        {"batch_id": batch_id, "attempt": attempt},
    )
    return cur.rowcount


def delete_pipeline(cur: Cursor, pipeline: PipelineConfig) -> None:
    """Remove the pipeline's ledger rows and its staging table (its sink's tables are the sink's: Sink.drop)."""
    for statement in sql.DELETE_PIPELINE_LEDGER_ROWS:
        cur.execute(statement, {"pipeline": pipeline.name})
    cur.execute(sql.drop_staging_table(pipeline))


def _table_columns(cur: Cursor, schema: str, table: str) -> list[str]:
    cur.execute(sql.SELECT_TABLE_COLUMNS, {"schema": schema, "table": table})
    return [row[0] for row in cur.fetchall()]


def ensure_staging_table(cur: Cursor, pipeline: PipelineConfig, extra: tuple[Column, ...]) -> None:
    """Create the pipeline's staging table if missing (the declared columns and the sink's `extra` ones), rebuilt if
    they changed."""
    wanted = sql.staging_columns(pipeline, extra)
    staged = _table_columns(cur, sql.STAGING_SCHEMA, pipeline.name)
    if staged and sorted(staged) != sorted(wanted):
        # The declared columns changed: staging is ours to rebuild, but a batch whose staged rows
        # disappear with it must be read again rather than committed from nothing.
        log.warning("staging table for %s does not match the declared columns: rebuilding it", pipeline.name)
        cur.execute(sql.drop_staging_table(pipeline))
        cur.execute(sql.REOPEN_WRITTEN_BATCHES, {"pipeline": pipeline.name})
    cur.execute(sql.create_staging_table(pipeline, extra))
