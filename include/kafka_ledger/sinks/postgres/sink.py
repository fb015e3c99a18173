"""The Postgres sink: rows go into the pipeline's output table in the ledger database, inside the commit's
transaction; an entity table (write: upsert) merges them by key."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import IO

from psycopg2.extensions import connection

from kafka_ledger.config.pipeline import ConfigError, PipelineConfig
from kafka_ledger.formats.envelope import DebeziumChanges, Envelope, KeyedChanges
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql as ledger_sql
from kafka_ledger.ledger.db import Cursor
from kafka_ledger.model.columns import COORDINATES, OUTPUT_TRAILER, names
from kafka_ledger.model.ranges import OffsetRange, RecordId, TopicPartition
from kafka_ledger.sinks.base import OutputView, SinkWrite, TransactionalSink
from kafka_ledger.sinks.postgres import evolution, sql

log = logging.getLogger(__name__)

# Bytes handed to COPY per read of the row stream.
COPY_CHUNK_BYTES = 1 << 20
# Rows fetched per round trip of a server-side cursor.
FETCH_ROWS = 50_000


class _TableView(OutputView):
    """The output table in the verify's own transaction: the same snapshot as the ledger it reads."""

    def __init__(self, conn: connection, pipeline: PipelineConfig):
        self._conn, self._pipeline = conn, pipeline

    def exists(self) -> bool:
        with self._conn.cursor() as cur:
            cur.execute(ledger_sql.SELECT_TABLE_COLUMNS, {"schema": self._pipeline.output_schema,
                                                          "table": self._pipeline.output_table})
            return cur.fetchone() is not None

    def partitions(self) -> set[TopicPartition]:
        with self._conn.cursor() as cur:
            cur.execute(sql.select_output_partitions(self._pipeline))
            return {TopicPartition(t, p) for t, p in cur.fetchall()}

    def offsets(self, tp: TopicPartition, from_offset: int, until_offset: int) -> Iterator[int]:
        # A server-side cursor, an ordered scan of the primary key: streamed, never held whole.
        with self._conn.cursor(name=f"verify_{uuid.uuid4().hex}") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(sql.select_output_offsets(self._pipeline), {
                "topic": tp.topic, "partition": tp.partition, "from_offset": from_offset,
                "until_offset": until_offset})
            for (offset,) in cur:
                yield offset

    def offsets_within(self, ranges: Sequence[OffsetRange]) -> Iterator[tuple[int, int]]:
        # One statement for all the ranges, streamed from a server-side cursor.
        with self._conn.cursor(name=f"verify_{uuid.uuid4().hex}") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(sql.select_output_offsets_within_ranges(self._pipeline), ledger_sql.ranges_params(ranges))
            for range_no, offset in cur:
                yield range_no - 1, offset


class _EntityView(_TableView):
    """An entity table holds one row per key, not one per record: verify checks its ledger only."""

    holds_every_record = False


def ensure_schema(cur: Cursor, schema: str) -> None:
    """Create the schema if it is missing, safe against another transaction creating it at the same time (the lock of
    sql.LOCK_SCHEMA_CREATION, taken only while the schema is missing)."""
    cur.execute(sql.SCHEMA_EXISTS, {"schema": schema})
    if not cur.fetchone()[0]:
        cur.execute(sql.LOCK_SCHEMA_CREATION, {"schema": schema})
        cur.execute(sql.create_schema(schema))


def _table_columns(cur: Cursor, schema: str, table: str) -> list[str]:
    cur.execute(ledger_sql.SELECT_TABLE_COLUMNS, {"schema": schema, "table": table})
    return [row[0] for row in cur.fetchall()]


class PostgresSink(TransactionalSink):
    """The output table `output_schema.output_table`, written in the same transaction as the offsets."""

    @property
    def target(self) -> str:
        return self.pipeline.qualified_output_table

    @property
    def asset_uri(self) -> str:
        return f"kafka-ledger://{self.pipeline.output_schema}/{self.pipeline.output_table}"

    @property
    def jdbc_table(self) -> str:
        return self.pipeline.qualified_output_table

    def _create(self, cur: Cursor) -> None:
        ensure_schema(cur, self.pipeline.output_schema)
        cur.execute(sql.create_output_table(self.pipeline, entity=False))

    def prepare(self, cur: Cursor) -> None:
        """Create the output and staging tables if missing; refuse an output table lacking one of the Kafka columns,
        or whose columns the declaration changes in a way that would lose data (the columns it adds or widens are
        the commit's: `evolve`); warn of an appending table without an index leading with the Kafka coordinates."""
        self._create(cur)
        existing = self._column_types(cur)
        missing = [c.name for c in OUTPUT_TRAILER if c.name not in existing]
        if missing:
            raise ConfigError(
                f"pipeline {self.pipeline.name!r}: output table {self.target} lacks column(s) "
                f"{', '.join(missing)}; add them with ALTER TABLE before running the pipeline"
            )
        changes = self._schema_changes(cur, existing)
        if changes and self.pipeline.delivery_mode == "at_least_once":
            # Spark appends a catch-up batch itself, before any commit: the table must have its columns first.
            self._apply(cur, changes, batch_id=None)
        elif changes:
            log.info("output table %s: %s, by the commit of the pipeline's next batch (with its first rows)",
                     self.target, changes.describe())
        if not self.pipeline.is_entity_table:
            self._check_record_index(cur)
        ledger.ensure_staging_table(cur, self.pipeline, self.staged_extra())

    def evolve(self, cur: Cursor, batch_id: int) -> None:
        """In the commit's transaction, before its rows: add the declared columns the table lacks and widen those
        declared wider (a reader sees them with the rows that fill them, or not at all)."""
        changes = self._schema_changes(cur, self._column_types(cur))
        if changes:
            self._apply(cur, changes, batch_id)

    def _column_types(self, cur: Cursor) -> dict[str, str]:
        cur.execute(ledger_sql.SELECT_COLUMN_TYPES, {"table": sql.output_table(self.pipeline).as_string(cur)})
        return dict(cur.fetchall())

    def _schema_changes(self, cur: Cursor, existing: dict[str, str]) -> evolution.SchemaChanges:
        """What the declaration asks of the table (ConfigError when it would lose data). The columns the pipeline
        published are recorded from its first look at the table on; one it stopped declaring and that the table no
        longer has was dropped deliberately, and is forgotten."""
        params = {"pipeline": self.pipeline.name}
        cur.execute(ledger_sql.SELECT_OUTPUT_COLUMNS, params)
        published = dict(cur.fetchall())
        if not published:
            for column in self.pipeline.columns:
                if column.name in existing:
                    cur.execute(ledger_sql.UPSERT_OUTPUT_COLUMN, {**params, "name": column.name,
                                                                  "type": existing[column.name], "batch_id": None})
                    published[column.name] = existing[column.name]
        declared = {c.name for c in self.pipeline.columns}
        for name in sorted(set(published) - declared - set(existing)):
            cur.execute(ledger_sql.DELETE_OUTPUT_COLUMN, {**params, "name": name})
            del published[name]
        try:
            return evolution.schema_changes(self.pipeline, self.target, existing, set(published))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _apply(self, cur: Cursor, changes: evolution.SchemaChanges, batch_id: int | None) -> None:
        for statement in sql.alter_output_table(self.pipeline, changes):
            cur.execute(statement)
        for column in [*changes.add, *(c for c, _ in changes.widen)]:
            cur.execute(ledger_sql.UPSERT_OUTPUT_COLUMN, {"pipeline": self.pipeline.name, "name": column.name,
                                                          "type": evolution.catalog_type(column.type),
                                                          "batch_id": batch_id})
        log.info("output table %s: %s%s", self.target, changes.describe(),
                 f", in the commit of batch {batch_id}" if batch_id is not None else "")

    def _check_record_index(self, cur: Cursor) -> None:
        """Warn when a table made by hand has no index leading with the Kafka coordinates: a rewrite deletes its
        ranges' rows before publishing them again, and each range would scan the whole table."""
        table = sql.output_table(self.pipeline).as_string(cur)
        cur.execute(ledger_sql.SELECT_INDEX_COLUMNS, {"table": table})
        coordinates = names(COORDINATES)
        if not any(list(columns[:len(coordinates)]) == coordinates for _, columns in cur.fetchall()):
            log.warning("output table %s has no index leading with (%s): a replay, backfill or window deletes the "
                        "rows of its ranges with a scan of the whole table each; add one: CREATE INDEX ON %s (%s)",
                        self.target, ", ".join(coordinates), table, ", ".join(coordinates))

    def drop(self, cur: Cursor) -> None:
        cur.execute(sql.drop_output_tables(self.pipeline))

    def output_view(self, conn: connection) -> OutputView:
        return _TableView(conn, self.pipeline)

    def output_record_ids(self, cur: Cursor) -> list[tuple[str, int, int]]:
        cur.execute(sql.select_output_record_ids(self.pipeline))
        return [tuple(row) for row in cur.fetchall()]

    def remove(self, cur: Cursor, ranges: Iterable[OffsetRange]) -> int:
        cur.execute(sql.delete_output_ranges(self.pipeline), ledger_sql.ranges_params(ranges))
        return cur.rowcount

    def copy_rows(self, cur: Cursor, batch: ledger.Batch, data: IO[bytes]) -> SinkWrite:
        cur.copy_expert(sql.copy_rows(sql.output_table(self.pipeline), list(self.published_columns())), data,
                        size=COPY_CHUNK_BYTES)
        return SinkWrite(cur.rowcount)

    def publish_staged(self, cur: Cursor, batch: ledger.Batch, attempt: int) -> SinkWrite:
        cur.execute(sql.publish_staged(self.pipeline, sql.output_table(self.pipeline), list(self.published_columns())),
                    {"batch_id": batch.batch_id, "attempt": attempt})
        return SinkWrite(cur.rowcount)


class PostgresEntitySink(PostgresSink):
    """An entity table (write: upsert): one row per key, the newest record by Kafka order; a tombstone deletes its key
    (with `envelope: debezium`, each record is a change event: formats/envelope.DebeziumChanges).

    A batch's rows go into a temporary table first and are merged from there (sql.merge_entities), in the commit's
    transaction. A rewrite (replay, window, backfill) removes nothing: the merge keeps whichever record is newer,
    so an older range read again never moves an entity backwards.
    """

    @property
    def envelope(self) -> Envelope:
        return DebeziumChanges() if self.pipeline.value.envelope == "debezium" else KeyedChanges()

    def describe(self) -> str:
        return f"one row per {', '.join(self.pipeline.key)}"

    def _create(self, cur: Cursor) -> None:
        ensure_schema(cur, self.pipeline.output_schema)
        cur.execute(sql.create_output_table(self.pipeline, entity=True))
        ensure_schema(cur, sql.TOMBSTONES_SCHEMA)
        cur.execute(sql.create_tombstone_table(self.pipeline))
        if self._change_events:
            for statement in sql.create_change_tables(self.pipeline):
                cur.execute(statement)

    @property
    def _change_events(self) -> bool:
        """Whether the records are change events, whose row images may lack values (sql.fill_from_earlier)."""
        return isinstance(self.envelope, DebeziumChanges)

    def prepare(self, cur: Cursor) -> None:
        """As the append table's, and refuse a table whose primary key is not the declared key."""
        super().prepare(cur)
        cur.execute(ledger_sql.SELECT_PRIMARY_KEY_COLUMNS, {"table": sql.output_table(self.pipeline).as_string(cur)})
        primary_key = [name for (name,) in cur.fetchall()]
        if set(primary_key) != set(self.pipeline.key):
            raise ConfigError(
                f"pipeline {self.pipeline.name!r} (write: upsert, key {', '.join(self.pipeline.key)}): output table "
                f"{self.target} has primary key ({', '.join(primary_key) or 'none'}); an entity table's primary key "
                "is its key: publish into a new table, or change the table's key"
            )

    def output_view(self, conn: connection) -> OutputView:
        return _EntityView(conn, self.pipeline)

    def remove(self, cur: Cursor, ranges: Iterable[OffsetRange]) -> int:
        return 0

    def copy_rows(self, cur: Cursor, batch: ledger.Batch, data: IO[bytes]) -> SinkWrite:
        cur.execute(sql.create_incoming_table(self.pipeline, self.envelope.extra_columns))
        cur.copy_expert(sql.copy_rows(sql.INCOMING, list(self.published_columns())), data, size=COPY_CHUNK_BYTES)
        return self._merge(cur, batch, cur.rowcount)

    def publish_staged(self, cur: Cursor, batch: ledger.Batch, attempt: int) -> SinkWrite:
        cur.execute(sql.create_incoming_table(self.pipeline, self.envelope.extra_columns))
        cur.execute(sql.publish_staged(self.pipeline, sql.INCOMING, list(self.published_columns())),
                    {"batch_id": batch.batch_id, "attempt": attempt})
        return self._merge(cur, batch, cur.rowcount)

    def _merge(self, cur: Cursor, batch: ledger.Batch, records: int) -> SinkWrite:
        dead, to_read = self._fill_lacking(cur, batch) if self._change_events else (0, ())
        counts = {}
        for name, statement in sql.merge_entities(self.pipeline):
            cur.execute(statement)
            counts[name] = cur.rowcount
        log.info("%s: %d records, %d keys: %d rows inserted or updated, %d deleted by tombstones (%d tombstones "
                 "kept), %d tombstones lifted by newer records; older records than the table's left unchanged",
                 self.target, records - dead, counts["newest"], counts["upserted"], counts["deleted"],
                 counts["buried"], counts["revived"])
        return SinkWrite(records - dead, dead, to_read)

    def _fill_lacking(self, cur: Cursor, batch: ledger.Batch) -> tuple[int, tuple[RecordId, ...]]:
        """Fill the values the batch's change events lack (sql.fill_from_earlier and what follows it), with the
        parked rows taken back first, round after round while a round fills any (a value a primary-key change moved
        is found only once its old key's row is); then park the rows that wait for a change's delete (not in a
        rewrite of offsets behind the positions: their entities hold newer records already), and make those still
        lacking a value dead letters. Returns how many of the batch's own records became dead letters, and every
        dead letter's coordinates (written without the record's key and value)."""
        pipeline = self.pipeline
        cur.execute(sql.unpark(pipeline))
        unparked = {tuple(row) for row in cur.fetchall()}
        cur.execute(sql.SELECT_LACKING)
        lacking, moving = cur.fetchone()
        if not lacking and not moving:
            return 0, ()
        names: set[str] = set()
        if lacking:
            cur.execute(sql.SELECT_LACKING_COLUMNS)
            names = {name for (name,) in cur.fetchall()}
        columns = [c for c in pipeline.columns if c.name in names]
        # A rewrite reads offsets behind the positions: its entities hold their newest records already, and the
        # moves it reads again were settled when first read. It records no move and parks nothing.
        records_moves = moving and batch.moves_positions
        # A round fills from earlier rows, records the moved rows those complete, and fills from moved rows. Only a
        # moved row recorded or a value filled from one gives the next round anything new: a value filled from an
        # earlier row came from the row its group's others take theirs from, in the same round.
        filled = rounds = 0
        while True:
            rounds += 1
            for column in columns:
                cur.execute(sql.fill_from_earlier(pipeline, column))
                filled += cur.rowcount
            moved = 0
            if records_moves:
                cur.execute(sql.record_moved(pipeline))
                moved += cur.rowcount
            if moving:
                for column in columns:
                    cur.execute(sql.fill_from_moved(pipeline, column))
                    moved += cur.rowcount
            filled += moved
            if not moved:
                break
        parked = 0
        if records_moves:
            cur.execute(sql.record_unknown_moves(pipeline))
            for statement in sql.settle_moves(pipeline):
                cur.execute(statement)
            cur.execute(sql.park_waiting(pipeline))
            parked = cur.rowcount
        dead_letters: list[RecordId] = []
        if columns:
            reading = self.envelope.reading(pipeline)
            labels = {c.name: c.label for c in reading.columns if c.name in names}
            cur.execute(sql.dead_letter_lacking(pipeline, labels), {"pipeline": pipeline.name})
            dead_letters = [tuple(row) for row in cur.fetchall()]
        dead_unparked = sum(1 for record in dead_letters if record in unparked)
        dead = len(dead_letters) - dead_unparked
        log.info("%s: values the change events lacked (unchanged TOASTed values: %s) filled from the entities' earlier "
                 "rows and moved keys in %d round(s) (%d fills and moved rows recorded); %d record(s) parked until "
                 "their primary-key change's delete is read (%d taken back from earlier batches); %d record(s) "
                 "lacking a value found nowhere are dead letters (%d of them parked by earlier batches)", self.target,
                 ", ".join(c.name for c in columns) or "none", rounds, filled, parked, len(unparked),
                 dead + dead_unparked, dead_unparked)
        return dead, tuple(dead_letters)
