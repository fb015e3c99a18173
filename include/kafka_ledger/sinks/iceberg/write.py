"""An Iceberg sink's write of one attempt, in Spark (either runtime's session): one snapshot per batch, adopted if it
landed already.

The attempt's Spark session (a Spark Connect client's, or spark-submit's own) writes the rows as the batch's snapshot,
unless the batch's snapshot is in the table already (an earlier attempt died between that snapshot and the ledger's
commit, or a racing one committed it first): then it is adopted, not written again. The ledger's transaction
(batch/commit.py) then checks and records the snapshot and moves the offsets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.model.columns import BATCH_ID, COORDINATES, DEAD_LETTER_LINE, PUBLISHED, names
from kafka_ledger.model.ranges import OffsetRange, PartitionReadStats, check_read_coverage
from kafka_ledger.sinks.iceberg.snapshots import BatchSnapshot, IcebergSinkError, stamp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from kafka_ledger.ledger.db import Batch

log = logging.getLogger(__name__)

DeadLetters = list[tuple[str, int, int, str]]


class SnapshotTable(Protocol):
    """What the write needs of its sink (sink.IcebergSink)."""

    pipeline: PipelineConfig

    @property
    def target(self) -> str: ...

    def table(self) -> Any: ...

    def evolve_schema(self) -> None: ...

    def output_columns(self) -> dict[str, Any]: ...

    def current_snapshot_id(self, table: Any = None) -> int | None: ...

    def batch_snapshot(self, batch_id: int, table: Any = None) -> BatchSnapshot | None: ...

    def read_stats(self, snapshot: BatchSnapshot, dead_letters: Iterable[tuple[str, int, int]]
                   ) -> list[PartitionReadStats]: ...


def write_attempt(sink: SnapshotTable, rows: DataFrame, batch: Batch, number: int) -> tuple[BatchSnapshot, DeadLetters]:
    """Write an attempt's rows (batch/publish.publish_frame) as the batch's snapshot, or adopt the batch's snapshot
    the table holds if it covers the ranges; returns the snapshot and the dead letters (topic, partition, offset,
    COPY line). A catch-up batch's write is an overwrite of its own rows; a rewrite's, one MERGE on the records'
    coordinates (`merge`)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    coordinates = names(COORDINATES)

    def dead_letters() -> DeadLetters:
        return [tuple(r) for r in rows.where(~F.col(PUBLISHED)).select(*coordinates, DEAD_LETTER_LINE).collect()]

    def adoptable(snapshot: BatchSnapshot | None) -> tuple[BatchSnapshot | None, DeadLetters]:
        """The batch's snapshot and the dead letters (read again), if together they cover the ranges as a write
        would; else (None, [])."""
        if snapshot is None:
            return None, []
        dead = dead_letters()
        problems = check_read_coverage(batch.ranges, sink.read_stats(snapshot, (d[:3] for d in dead)))
        log.warning("batch %s has snapshot %s in %s already, from attempt %s: %s", batch.batch_id,
                    snapshot.snapshot_id, sink.target, snapshot.attempt,
                    f"writing the batch again, since it does not cover the ranges ({'; '.join(problems)})"
                    if problems else "adopting it, not writing the rows again")
        return (None, []) if problems else (snapshot, dead)

    table = sink.table()
    snapshot, dead = adoptable(sink.batch_snapshot(batch.batch_id, table))
    if snapshot is None:
        # Columns the declaration added or widened: in the table's schema before the snapshot that fills them.
        sink.evolve_schema()
        table = sink.table()
        try:
            if not batch.moves_positions:
                # A rewrite's MERGE: its dead letters read on their own (rewrites are an operator's, and rarer).
                dead = dead_letters()
                merge(sink, rows.where(F.col(PUBLISHED)), batch.batch_id, number, batch.ranges)
            else:
                dead_letter = F.struct(*coordinates, F.col(DEAD_LETTER_LINE).alias("line"))
                # The dead letters come back with the write, observed on its way: the records are read once. As one
                # JSON text: Spark Connect 4.0 sends no observed array of structs.
                observed = Observation(f"dead letters of batch {batch.batch_id} attempt {number}")
                write(sink, rows.observe(observed, F.to_json(F.collect_list(F.when(~F.col(PUBLISHED), dead_letter)))
                                         .alias("dead")).where(F.col(PUBLISHED)),
                      batch.batch_id, number, batch.ranges, sink.current_snapshot_id(table))
                dead = [(d[coordinates[0]], d[coordinates[1]], d[coordinates[2]], d["line"])
                        for d in json.loads(observed.get["dead"])]
        except Exception as exc:
            # Refused because another attempt of the batch committed its rows since this one began: theirs are
            # the batch's, adopted (this attempt is the newest: the other one cannot commit the ledger).
            if "ValidationException" not in str(exc):
                raise
            snapshot, dead = adoptable(sink.batch_snapshot(batch.batch_id))
            if snapshot is None:
                raise
        else:
            snapshot = sink.batch_snapshot(batch.batch_id)
            if snapshot is None or snapshot.attempt != number:
                raise IcebergSinkError(f"batch {batch.batch_id} attempt {number}: its snapshot is not in "
                                       f"{sink.target}'s current history after its write (found {snapshot}): "
                                       "nothing was published")
    return snapshot, dead


def write(sink: SnapshotTable, rows: DataFrame, batch_id: int, attempt: int, ranges: Iterable[OffsetRange],
          validate_from: int | None) -> None:
    """Commit `rows` (the output columns but the batch id) as ONE snapshot replacing the batch's earlier rows,
    stamped with the batch; refused (Iceberg's ValidationException) if another attempt committed rows of the
    batch after `validate_from`, the snapshot the attempt began at."""
    from pyspark.sql import functions as F

    batch = BATCH_ID.name
    writer = rows.select(*[F.col(c) for c in sink.output_columns() if c != batch],
                         F.lit(batch_id).cast("long").alias(batch)).writeTo(sink.target)
    for key, value in stamp(sink.pipeline.name, batch_id, attempt, ranges).items():
        writer = writer.option(f"snapshot-property.{key}", value)
    writer = writer.option("isolation-level", "serializable")
    if validate_from is not None:
        writer = writer.option("validate-from-snapshot-id", str(validate_from))
    writer.overwrite(F.col(batch) == F.lit(batch_id).cast("long"))


def merge(sink: SnapshotTable, rows: DataFrame, batch_id: int, attempt: int, ranges: list[OffsetRange]) -> None:
    """A rewrite's snapshot (a replay, a time window, a backfill, offset ranges): ONE MERGE that replaces exactly
    the ranges' rows with `rows` (the output columns but the batch id): a record read again updates its row, a
    new one is inserted, a row of the ranges whose record is not among `rows` (a dead letter now) is deleted. A
    reader never sees the ranges twice or not at all. Stamped through the session's settings (a MERGE takes no
    write options): the session must be the batch's own (runtimes/connect/)."""
    from pyspark.sql import functions as F

    spark = rows.sparkSession
    batch = BATCH_ID.name
    view = f"kafka_ledger_rewrite_{batch_id}_{attempt}"
    rows.select(*[F.col(c) for c in sink.output_columns() if c != batch],
                F.lit(batch_id).cast("long").alias(batch)).createOrReplaceTempView(view)
    topic, partition, offset = names(COORDINATES)
    same_record = " AND ".join(f"t.{c} = s.{c}" for c in (topic, partition, offset))
    # Topic names are [A-Za-z0-9._-] (config.TOPIC_NAME), partitions and offsets integers: nothing to escape.
    in_ranges = " OR ".join(f"(t.{topic} = '{r.topic}' AND t.{partition} = {r.partition} AND t.{offset} >= "
                            f"{r.from_offset} AND t.{offset} < {r.until_offset})" for r in ranges)
    stamped = {f"spark.sql.iceberg.snapshot-property.{key}": value
               for key, value in stamp(sink.pipeline.name, batch_id, attempt, ranges).items()}
    try:
        for key, value in stamped.items():
            spark.conf.set(key, value)
        spark.sql(f"MERGE INTO {sink.target} t USING {view} s ON {same_record} "
                  "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT * "
                  f"WHEN NOT MATCHED BY SOURCE AND ({in_ranges}) THEN DELETE")
    finally:
        for key in stamped:
            spark.conf.unset(key)
        spark.catalog.dropTempView(view)
