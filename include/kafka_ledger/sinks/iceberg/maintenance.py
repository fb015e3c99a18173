"""The upkeep of an Iceberg sink's table: small files compacted, old snapshots expired, never one a batch needs.

Each batch commits one snapshot with one file per Kafka partition range: many small files over time, and a history
that grows by a snapshot a batch. Compaction (Iceberg's `rewrite_data_files`) rewrites small files into bigger ones
in a `replace` snapshot: the rows stay, and a batch's overwrite validates only appended and overwritten data, so a
batch being written beside it is not refused. Expiry (`expire_snapshots`) drops old snapshots and the files only
they referenced; it keeps the snapshot of every batch the ledger has not finished (a batch whose snapshot landed
before a crash adopts it when it resumes: commit.publish_snapshot) and every snapshot after it in the table's
history, since Iceberg keeps a branch's newest snapshots by age, not one by one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from kafka_ledger.config.pipeline import IcebergSinkSpec, PipelineConfig
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.ledger import db as ledger
from kafka_ledger.sinks.iceberg.snapshots import BATCH_KEY
from kafka_ledger.spark.sessions import SparkSessions

log = logging.getLogger(__name__)


class MaintainedTable(Protocol):
    """What the upkeep needs of its sink (sink.IcebergSink): the table read without Spark, and its declaration."""

    pipeline: PipelineConfig
    spec: IcebergSinkSpec

    @property
    def target(self) -> str: ...

    def table(self) -> Any: ...

# Finished batches: their snapshots are recorded in the ledger (or the batch was given up by a reset).
FINISHED = ("committed", "abandoned")


@dataclass(frozen=True)
class HistorySnapshot:
    """A snapshot of the table's current history, newest first, and the batch that stamped it if one did."""

    snapshot_id: int
    timestamp_ms: int
    batch_id: int | None


@dataclass(frozen=True)
class ExpiryBound:
    """What may expire: snapshots older than `older_than_ms`; `kept_for` the unfinished batches that lowered it."""

    older_than_ms: int
    kept_for: list[int]


def expiry_bound(history: Sequence[HistorySnapshot], statuses: Mapping[int, str], older_than_ms: int) -> ExpiryBound:
    """The expiry's bound on the snapshots' age: `older_than_ms`, lowered so that the oldest snapshot stamped by a
    batch the ledger has not finished (`statuses`: the ledger's, by batch id; an id it does not know counts as
    unfinished) and every snapshot newer than it in `history` (newest first) stay.

    Iceberg keeps a branch's snapshots from its head back to the first one older than the bound: the bound is the
    oldest timestamp among them all, not the protected snapshot's own (writers' clocks may disagree).
    """
    protected = [i for i, s in enumerate(history)
                 if s.batch_id is not None and statuses.get(s.batch_id) not in FINISHED]
    if not protected:
        return ExpiryBound(older_than_ms, [])
    oldest = max(protected)
    bound = min([older_than_ms, *(s.timestamp_ms for s in history[:oldest + 1])])
    return ExpiryBound(bound, sorted({history[i].batch_id for i in protected if history[i].batch_id is not None}))


@dataclass
class MaintenanceResult:
    """What one maintenance run did to a pipeline's table."""

    pipeline: str
    table: str
    compaction: dict[str, int] = field(default_factory=dict)
    expiry: dict[str, int] = field(default_factory=dict)
    expired_before: str | None = None
    kept_for_batches: list[int] = field(default_factory=list)
    snapshots_before: int = 0
    snapshots_after: int = 0
    data_files_before: int = 0
    data_files_after: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def history(sink: MaintainedTable) -> list[HistorySnapshot]:
    """The table's current history, newest first, read without Spark."""
    from pyiceberg.table.snapshots import ancestors_of

    table = sink.table()
    found = []
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        batch = summary.get(BATCH_KEY)
        found.append(HistorySnapshot(snapshot.snapshot_id, snapshot.timestamp_ms,
                                     int(batch) if batch is not None and batch.isdigit() else None))
    return found


def _counts(sink: MaintainedTable) -> tuple[int, int]:
    """(snapshots, live data files) of the table now."""
    table = sink.table()
    current = table.current_snapshot()
    files = int(current.summary.additional_properties.get("total-data-files", 0)) if current and current.summary \
        else 0
    return len(table.metadata.snapshots), files


def _timestamp_literal(ms: int) -> str:
    # An explicit offset: Spark reads a zone-less literal in the session's time zone.
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}+00:00'"


def maintain(db: LedgerDatabase, sink: MaintainedTable, sessions: SparkSessions, now: datetime | None = None
             ) -> MaintenanceResult:
    """Compact the sink's Iceberg table and expire its old snapshots, in a Spark session of its own from `sessions`
    (the pipeline's runtime's: a Spark Connect session, or a local one); logs what it did. Changes no row: a reader
    sees the same rows before, during and after."""
    pipeline, spec = sink.pipeline, sink.spec.maintenance
    started = time.monotonic()
    result = MaintenanceResult(pipeline.name, sink.target)
    result.snapshots_before, result.data_files_before = _counts(sink)
    target = f"{sink.spec.namespace}.{sink.spec.table}"
    procedures = f"{sink.spec.catalog}.system"
    with sessions.session(f"maintenance of {sink.target}") as spark:
        if spec.compact:
            log.info("compacting %s: small files rewritten in groups of at least %d", sink.target,
                     spec.min_input_files)
            (row,) = spark.sql(f"CALL {procedures}.rewrite_data_files(table => '{target}', options => "
                               f"map('min-input-files', '{spec.min_input_files}'))").collect()
            result.compaction = {k: int(v) for k, v in row.asDict().items() if v is not None}
            log.info("compacted %s: %s", sink.target, result.compaction)
        # The wanted bound before the history is read: a snapshot that lands after it is newer than it, and stays.
        wanted = int(((now or datetime.now(UTC)) - timedelta(hours=spec.expire_after_hours)).timestamp() * 1000)
        found = history(sink)
        with ledger.transaction(db) as cur:
            statuses = ledger.batch_statuses(cur, pipeline.name, [s.batch_id for s in found if s.batch_id is not None])
        bound = expiry_bound(found, statuses, wanted)
        result.kept_for_batches = bound.kept_for
        result.expired_before = datetime.fromtimestamp(bound.older_than_ms / 1000, tz=UTC).isoformat()
        if bound.kept_for:
            log.info("keeping every snapshot since that of unfinished batch(es) %s: they may still adopt it",
                     ", ".join(map(str, bound.kept_for)))
        (row,) = spark.sql(f"CALL {procedures}.expire_snapshots(table => '{target}', older_than => "
                           f"{_timestamp_literal(bound.older_than_ms)}, retain_last => {spec.retain_last})"
                           ).collect()
        result.expiry = {k: int(v) for k, v in row.asDict().items() if v is not None}
        log.info("expired snapshots of %s older than %s (keeping the newest %d): %s", sink.target,
                 result.expired_before, spec.retain_last, result.expiry)
    result.snapshots_after, result.data_files_after = _counts(sink)
    result.seconds = round(time.monotonic() - started, 3)
    log.info("maintained %s in %.1f s: %d -> %d snapshots, %d -> %d data files", sink.target, result.seconds,
             result.snapshots_before, result.snapshots_after, result.data_files_before, result.data_files_after)
    return result
