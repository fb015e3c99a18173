"""An Iceberg sink's publish of one attempt, in either Spark runtime: one snapshot per batch, adopted if it landed.

The attempt's Spark session (a Spark Connect client's, or spark-submit's own) writes the rows; the ledger's
transaction (commit.publish_snapshot) then records the snapshot and moves the offsets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kafka_ledger.batch import commit, read
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.model.ranges import check_read_coverage
from kafka_ledger.observe import failpoints
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.sinks.iceberg.sink import BatchSnapshot, IcebergSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


def publish_attempt(sink: IcebergSink, rows: DataFrame, attempt: read.Attempt, dsn: str, servers: str, *,
                    started: float, clock: Stopwatch, check_interrupted: Callable[[], None] | None = None
                    ) -> CommitResult:
    """An Iceberg sink's publish of an attempt's rows (publish.publish_frame): Spark writes the batch's rows as one
    snapshot, unless the batch's snapshot is in the table already (an earlier attempt died between that snapshot
    and the ledger's commit, or a racing one committed it first: it is adopted, not written again); then the
    ledger's transaction records it, with the dead letters, and moves the offsets. `check_interrupted` raises if
    the attempt was interrupted meanwhile: then nothing is committed."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from kafka_ledger.batch.publish import COORDINATES, DEAD_LETTER_LINE, PUBLISHED

    batch, number = attempt.batch, attempt.number

    def dead_letters() -> list[tuple[str, int, int, str]]:
        return [tuple(r) for r in rows.where(~F.col(PUBLISHED)).select(*COORDINATES, DEAD_LETTER_LINE).collect()]

    def adoptable(snapshot: BatchSnapshot | None) -> tuple[BatchSnapshot | None, list[tuple[str, int, int, str]]]:
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
        try:
            if not batch.moves_positions:
                # A rewrite's MERGE: its dead letters read on their own (rewrites are an operator's, and rarer).
                dead = dead_letters()
                sink.merge(rows.where(F.col(PUBLISHED)), batch.batch_id, number, batch.ranges)
            else:
                dead_letter = F.struct(*COORDINATES, F.col(DEAD_LETTER_LINE).alias("line"))
                # The dead letters come back with the write, observed on its way: the records are read once. As one
                # JSON text: Spark Connect 4.0 sends no observed array of structs.
                observed = Observation(f"dead letters of batch {batch.batch_id} attempt {number}")
                sink.write(rows.observe(observed, F.to_json(F.collect_list(F.when(~F.col(PUBLISHED), dead_letter)))
                                        .alias("dead")).where(F.col(PUBLISHED)),
                           batch.batch_id, number, batch.ranges, sink.current_snapshot_id(table))
                dead = [(d[COORDINATES[0]], d[COORDINATES[1]], d[COORDINATES[2]], d["line"])
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
                raise commit.CommitError(f"batch {batch.batch_id} attempt {number}: its snapshot is not in "
                                         f"{sink.target}'s current history after its write (found {snapshot}): "
                                         "nothing was published")
    clock.lap("snapshot")
    failpoints.hit("after_snapshot")
    if check_interrupted is not None:
        check_interrupted()
    return commit.publish_snapshot(dsn, servers, sink.pipeline, batch.batch_id, number, snapshot, dead,
                                   started=started, clock=clock)
