"""The Iceberg sink: a batch's rows become exactly one snapshot of an Iceberg table, written by Spark, and the
ledger's commit finds and checks that snapshot without Spark (pyiceberg) before it moves the offsets.

Every snapshot a batch commits carries the batch in its summary (`kafka-ledger.batch-id`, `.attempt`, `.pipeline`,
`.ranges`). A catch-up batch's write is an overwrite of exactly its own rows (`batch_id = B`), validated from the
table's snapshot when its attempt began: a racing or zombie attempt of the same batch conflicts instead of adding a
second copy, and a batch written again replaces its earlier rows in one snapshot. A rewrite of recorded ranges is
one MERGE on the records' coordinates, idempotent: its rows replace the ranges' rows in one snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from kafka_ledger.config.pipeline import IcebergSinkSpec, LakeMaintenanceSpec, PipelineConfig
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model import columns
from kafka_ledger.model.ranges import PartitionReadStats, TopicPartition
from kafka_ledger.sinks.base import ArtifactSink, OutputView
from kafka_ledger.sinks.iceberg import maintenance, write
from kafka_ledger.sinks.iceberg.snapshots import (
    ATTEMPT_KEY,
    BATCH_KEY,
    BatchSnapshot,
    IcebergSchemaError,
    IcebergSinkError,
)

if TYPE_CHECKING:
    from psycopg2.extensions import connection
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame

    from kafka_ledger.ledger.db import Batch
    from kafka_ledger.spark.sessions import SparkSessions

log = logging.getLogger(__name__)

# The table's properties kafka-ledger sets at creation (the pipeline's own come on top).
TABLE_PROPERTIES = {
    "format-version": "2",
    # The batch id's exact bounds in every file's metrics: a batch's overwrite finds its own files by them, and its
    # validation tells another batch's files from a racing attempt's.
    f"write.metadata.metrics.column.{columns.BATCH_ID.name}": "full",
    # The topic's exact bounds too (strings are cut to 16 characters by default): verify learns which partitions a
    # file holds from its metrics alone when both bounds are one topic and one partition.
    f"write.metadata.metrics.column.{columns.KAFKA_TOPIC.name}": "full",
}


def _first_line(exc: BaseException) -> str:
    # SQLAlchemy wraps the driver's error, whose own first line says what failed (never the connection's password).
    return (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]


class _SnapshotView(OutputView):
    """The table as of one snapshot (its current one when the verify began), read without Spark."""

    def __init__(self, sink: IcebergSink):
        from pyiceberg.exceptions import NoSuchTableError

        try:
            self._table: Table | None = sink.catalog().load_table(sink.identifier)
        except NoSuchTableError:
            self._table = None
        current = self._table.current_snapshot() if self._table is not None else None
        self._snapshot_id = current.snapshot_id if current else None

    def exists(self) -> bool:
        return self._table is not None

    def _scan(self, names: list[str], row_filter: Any = None) -> Any:
        from pyiceberg.expressions import AlwaysTrue

        assert self._table is not None and self._snapshot_id is not None
        return self._table.scan(row_filter=row_filter or AlwaysTrue(), selected_fields=tuple(names),
                                snapshot_id=self._snapshot_id).to_arrow()

    def partitions(self) -> set[TopicPartition]:
        """From the data files' metrics where they name one partition (a file of one Kafka partition's range, as an
        unpartitioned sink writes them); the other files' rows are read, a batch of rows at a time: the table is
        never held in memory, and most of it is never read."""
        if self._snapshot_id is None:
            return set()
        import pyarrow as pa
        from pyiceberg.conversions import from_bytes
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        assert self._table is not None
        topic, partition, _ = columns.names(columns.COORDINATES)
        schema = self._table.schema()
        fields = [schema.find_field(topic), schema.find_field(partition)]
        found: set[TopicPartition] = set()
        mixed = []
        scan = self._table.scan(selected_fields=(topic, partition), snapshot_id=self._snapshot_id)
        for task in scan.plan_files():
            lower, upper = task.file.lower_bounds or {}, task.file.upper_bounds or {}
            # A truncated string bound is never equal to its other bound (the upper one is rounded up): equal
            # bounds are every row's value. Delete files only take rows away.
            bounds = [(from_bytes(f.field_type, lower[f.field_id]), from_bytes(f.field_type, upper[f.field_id]))
                      if f.field_id in lower and f.field_id in upper else (None, None) for f in fields]
            if all(lo is not None and lo == hi for lo, hi in bounds):
                found.add(TopicPartition(bounds[0][0], bounds[1][0]))
            else:
                mixed.append(task)
        if mixed:
            reader = ArrowScan(self._table.metadata, self._table.io, scan.projection(), AlwaysTrue())
            for rows in reader.to_record_batches(mixed):
                pairs = pa.Table.from_batches([rows]).group_by([topic, partition]).aggregate([]).to_pylist()
                found.update(TopicPartition(r[topic], r[partition]) for r in pairs)
        return found

    def offsets(self, tp: TopicPartition, from_offset: int, until_offset: int) -> Iterator[int]:
        if self._snapshot_id is None:
            return iter(())
        import numpy as np
        from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

        topic, partition, offset = columns.names(columns.COORDINATES)
        # One scan per partition and span: the files' offset bounds skip every file outside it.
        rows = self._scan([offset], And(EqualTo(topic, tp.topic), EqualTo(partition, tp.partition),
                                        GreaterThanOrEqual(offset, from_offset), LessThan(offset, until_offset)))
        return iter(np.sort(rows[offset].to_numpy()).tolist())


class IcebergSink(ArtifactSink):
    """The pipeline's Iceberg table: Spark writes a batch's rows as one snapshot before the ledger's commit, which
    records that snapshot in the same transaction that moves the offsets."""

    # A catch-up batch's overwrite deletes whole files only: a file holding its batch id among others' ("some, but
    # not all, rows match") refuses it. A rewrite's MERGE rewrites files into ones holding the rewrite's (higher)
    # batch id beside older ones: committed below an unfinished catch-up batch's id, such a file's bounds would
    # straddle it and that batch could never be written. Rewrites planned while no catch-up batch is unfinished
    # only make files below every later catch-up batch's id (ids come from one sequence).
    rewrites_wait_for_catch_up = True
    rewrites_stamp_the_session = True
    artifact_noun = "snapshot"

    def __init__(self, pipeline: PipelineConfig):
        super().__init__(pipeline)
        if not isinstance(pipeline.sink, IcebergSinkSpec):
            raise TypeError(f"pipeline {pipeline.name!r} does not publish into Iceberg")
        self.spec: IcebergSinkSpec = pipeline.sink

    @property
    def target(self) -> str:
        return self.spec.qualified_table

    @property
    def identifier(self) -> tuple[str, str]:
        return self.spec.namespace, self.spec.table

    @property
    def asset_uri(self) -> str:
        return f"iceberg://{self.spec.catalog}/{self.spec.namespace}/{self.spec.table}"

    def maintenance(self) -> LakeMaintenanceSpec:
        return self.spec.maintenance

    def maintain(self, db: LedgerDatabase, sessions: SparkSessions) -> dict[str, Any]:
        return maintenance.maintain(db, self, sessions).as_dict()

    def drop(self, cur: ledger.Cursor) -> None:
        """Nothing in the ledger's database (the table is the catalog's: dropping it is the lake's owner's call)."""

    # --- the table, without Spark ------------------------------------------------------------------------------

    def catalog(self) -> Any:
        from kafka_ledger.sinks.iceberg import (
            catalogs as lake,  # reads Spark's settings file: only where a lake is used
        )

        try:
            return lake.reader(self.spec.catalog)
        except lake.LakeError as exc:
            raise IcebergSinkError(f"pipeline {self.pipeline.name!r}: {exc}") from exc
        except Exception as exc:  # the catalog's database or service: whatever its client raises
            raise IcebergSinkError(f"pipeline {self.pipeline.name!r}: catalog {self.spec.catalog!r} cannot be "
                                   f"reached ({_first_line(exc)}): nothing was read or published") from exc

    def table(self) -> Table:
        """The table as it is now (its metadata read again)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog().load_table(self.identifier)
        except NoSuchTableError:
            raise IcebergSinkError(f"pipeline {self.pipeline.name!r}: table {self.target} does not exist (its plan "
                                   "creates it)") from None

    def prepare(self, cur: ledger.Cursor) -> None:
        """Create the namespace and the table if missing; refuse, naming them, columns that differ from the
        declaration. (The ledger's staging table too: attempts clear it whatever their sink.)"""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

        ledger.ensure_staging_table(cur, self.pipeline, self.staged_extra())

        catalog = self.catalog()
        try:
            catalog.create_namespace(self.spec.namespace)
        except NamespaceAlreadyExistsError:
            pass
        try:
            table = catalog.load_table(self.identifier)
        except NoSuchTableError:
            try:
                table = catalog.create_table(self.identifier, schema=self._schema(),
                                             partition_spec=self._partition_spec(), properties=self._properties())
            except TableAlreadyExistsError:  # another plan made it meanwhile
                table = catalog.load_table(self.identifier)
        changes = self._check_schema(table)
        if changes:
            log.info("table %s: %s, by the next batch's write, before its snapshot", self.target, "; ".join(changes))

    def _schema(self) -> Any:
        from pyiceberg.schema import Schema
        from pyiceberg.types import NestedField

        # Optional fields: Spark's columns are nullable, and Iceberg refuses nullable data for a required field.
        return Schema(*[NestedField(i, name, kind.iceberg_type(), required=False)
                        for i, (name, kind) in enumerate(self.output_columns().items(), start=1)])

    def _partition_spec(self) -> Any:
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.transforms import (
            BucketTransform,
            DayTransform,
            HourTransform,
            IdentityTransform,
            MonthTransform,
            TruncateTransform,
            YearTransform,
        )

        from kafka_ledger.config.pipeline import PARTITION_TRANSFORM

        ids = {name: i for i, name in enumerate(self.output_columns(), start=1)}
        by_time = {"years": YearTransform, "months": MonthTransform, "days": DayTransform, "hours": HourTransform}
        fields = []
        for n, text in enumerate(self.spec.partition_by):
            match = PARTITION_TRANSFORM.match(text)
            assert match is not None  # validated with the pipeline
            if match["column"]:
                column, transform, name = match["column"], IdentityTransform(), match["column"]
            elif match["time_column"]:
                column = match["time_column"]
                kind = text.split("(")[0]
                transform, name = by_time[kind](), f"{column}_{kind.rstrip('s')}"
            else:
                column, width = match["sized_column"], int(match["width"])
                kind = text.split("(")[0]
                transform = BucketTransform(width) if kind == "bucket" else TruncateTransform(width)
                name = f"{column}_{'bucket' if kind == 'bucket' else 'trunc'}"
            fields.append(PartitionField(source_id=ids[column], field_id=1000 + n, transform=transform, name=name))
        return PartitionSpec(*fields)

    def _properties(self) -> dict[str, str]:
        size = ({"write.target-file-size-bytes": str(self.spec.target_file_size_mb << 20)}
                if self.spec.target_file_size_mb else {})
        # Unpartitioned: each Spark task (a Kafka partition's range) writes its own file, no shuffle before the write.
        layout = {} if self.spec.partition_by else {"write.distribution-mode": "none"}
        return {**TABLE_PROPERTIES, **layout, **size, **self.spec.properties}

    def _check_schema(self, table: Table) -> list[str]:
        """The schema changes the declared columns ask of the table (columns to add, types Iceberg promotes without
        loss: int to long, float to double, a decimal's precision up), made by the batch's write before its snapshot
        (`evolve_schema`); IcebergSchemaError naming any change that would lose data, and the deliberate way."""
        from pyiceberg.exceptions import ResolveError
        from pyiceberg.schema import promote

        fields = {f.name: f for f in table.schema().fields}
        output = self.output_columns()
        problems, changes = [], []
        for name, kind in output.items():
            field = fields.get(name)
            if field is None:
                changes.append(f"add {name} {kind.iceberg_type()}")
            elif field.field_type != kind.iceberg_type():
                try:
                    promote(field.field_type, kind.iceberg_type())
                    changes.append(f"widen {name} from {field.field_type} to {kind.iceberg_type()}")
                except ResolveError:
                    problems.append(f"column {name} is {field.field_type}, not {kind.iceberg_type()} ({kind}): declare "
                                    f"it as the table has it, or change the table deliberately first (Spark SQL: "
                                    f"ALTER TABLE {self.target} ALTER COLUMN {name} TYPE ..., where Iceberg allows "
                                    "it), or publish into a new table")
        for name in sorted(set(fields) - set(output)):
            problems.append(f"column {name} is no longer declared, and new rows would hold NULL there: declare it "
                            f"again, or drop it deliberately first (Spark SQL: ALTER TABLE {self.target} DROP COLUMN "
                            f"{name})")
        if problems:
            raise IcebergSchemaError(f"pipeline {self.pipeline.name!r}: table {self.target} does not fit the declared "
                                     f"columns: {'; '.join(problems)}. Nothing was read or published")
        return changes

    def evolve_schema(self) -> None:
        """Before a batch's snapshot: bring the table's schema to the declared columns (`_check_schema`), in one
        metadata commit; a racing attempt's identical change is no change."""
        table = self.table()
        changes = self._check_schema(table)
        if changes:
            with table.update_schema() as update:
                update.union_by_name(self._schema())
            log.info("table %s: %s, before the batch's snapshot", self.target, "; ".join(changes))

    def current_snapshot_id(self, table: Table | None = None) -> int | None:
        snapshot = (table or self.table()).current_snapshot()
        return snapshot.snapshot_id if snapshot else None

    def batch_snapshot(self, batch_id: int, table: Table | None = None) -> BatchSnapshot | None:
        """The newest snapshot in the table's current history that batch `batch_id` committed, if any."""
        from pyiceberg.table.snapshots import ancestors_of

        table = table or self.table()
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if summary.get(BATCH_KEY) == str(batch_id):
                return BatchSnapshot(snapshot.snapshot_id, batch_id, int(summary[ATTEMPT_KEY]))
        return None

    def read_stats(self, snapshot: BatchSnapshot, dead_letters: Iterable[tuple[str, int, int]]
                   ) -> list[PartitionReadStats]:
        """What the batch read, per partition, for the coverage check: the rows its snapshot holds, read back
        without Spark, and its dead letters (their coordinates) together. A record among both is read twice."""
        import pyarrow as pa
        from pyiceberg.expressions import EqualTo

        names = columns.names(columns.COORDINATES)
        topic, partition, offset = names
        newest = columns.KAFKA_TIMESTAMP.name
        rows = self.table().scan(row_filter=EqualTo(columns.BATCH_ID.name, snapshot.batch_id),
                                 selected_fields=(*names, newest), snapshot_id=snapshot.snapshot_id).to_arrow()
        # The newest published record's timestamp per partition (freshness): the rows', never a dead letter's.
        newest_by_partition = {(r[topic], r[partition]): r[f"{newest}_max"] for r in rows.group_by(
            [topic, partition]).aggregate([(newest, "max")]).to_pylist()}
        rows = rows.select(names).append_column("dead", pa.array([0] * rows.num_rows, pa.int64()))
        dead = list(dead_letters)
        dead_table = pa.table({**{name: pa.array([d[i] for d in dead], rows.schema.field(name).type)
                                  for i, name in enumerate(names)},
                               "dead": pa.array([1] * len(dead), pa.int64())}, schema=rows.schema)
        grouped = pa.concat_tables([rows, dead_table]).group_by([topic, partition]).aggregate([
            (offset, "count"), (offset, "count_distinct"), (offset, "min"), (offset, "max"), ("dead", "sum")])
        return [PartitionReadStats(r[topic], r[partition], r[f"{offset}_count"], r[f"{offset}_count_distinct"],
                                   r[f"{offset}_min"], r[f"{offset}_max"], r["dead_sum"],
                                   newest_by_partition.get((r[topic], r[partition])))
                for r in grouped.to_pylist()]

    def output_view(self, conn: connection) -> OutputView:
        return _SnapshotView(self)

    def output_record_ids(self, cur: ledger.Cursor) -> list[tuple[str, int, int]]:
        table = self.table()
        if table.current_snapshot() is None:
            return []
        rows = table.scan(selected_fields=tuple(columns.names(columns.COORDINATES))).to_arrow()
        return list(zip(*(rows.column(c).to_pylist() for c in columns.names(columns.COORDINATES)), strict=True))

    # --- the artifact: written in Spark, adopted by the commit -------------------------------------------------

    def write_attempt(self, rows: DataFrame, batch: Batch, attempt: int
                      ) -> tuple[BatchSnapshot, list[tuple[str, int, int, str]]]:
        return write.write_attempt(self, rows, batch, attempt)

    def current_artifact(self, batch_id: int) -> BatchSnapshot | None:
        return self.batch_snapshot(batch_id)

    def record(self, cur: ledger.Cursor, artifact: BatchSnapshot) -> None:  # type: ignore[override]
        ledger.record_snapshot(cur, artifact.batch_id, artifact.snapshot_id)
