"""Binary COPY of a batch's rows into Postgres: Arrow tables from Spark, encoded by pgpq, streamed into COPY.

Spark sends every record's Kafka coordinates and, for a publishable record, its decoded values as typed Arrow columns,
or, for a dead letter, its COPY line (batch/publish.publish_frame); the client encodes the output rows as Postgres
binary COPY (`OutputEncoder`, `CopyStream`), streams them into COPY inside the commit's transaction and summarises
what it read for the coverage check. No staging table, no second copy of any row.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime

import numpy as np
import pgpq
import pyarrow as pa
import pyarrow.compute as pc

from kafka_ledger.model import columns
from kafka_ledger.model.columns import DEAD_LETTER_LINE, PUBLISHED
from kafka_ledger.model.kinds import ColumnKind
from kafka_ledger.model.ranges import PartitionReadStats


def output_schema(published: dict[str, ColumnKind]) -> pa.Schema:
    """The Arrow schema of the published rows, each column in its kind's Arrow type. Binary COPY takes every value
    in its column's own wire form: 4 bytes for an integer, 8 for a bigint, a timestamptz as microseconds since 2000
    in UTC; so each column is cast to its kind's type (a value that does not fit fails the cast)."""
    return pa.schema([pa.field(name, kind.arrow_type()) for name, kind in published.items()])


def output_rows(table: pa.Table, schema: pa.Schema, batch_id: int,
                kinds: dict[str, ColumnKind] | None = None) -> pa.Table:
    """The publishable rows of a publish frame's table as output rows: the columns of `schema` (output_schema), in
    its order and types (each as its kind in `kinds` makes it, else cast), with the batch id.

    Timestamps keep their instant whatever their zone; one without a zone cannot be published as timestamptz.
    """
    fields = []
    for field in schema:
        if field.name == columns.BATCH_ID.name:
            fields.append(pa.array(np.full(table.num_rows, batch_id, dtype=np.int64)))
            continue
        column = table[field.name]
        if (pa.types.is_timestamp(column.type) and column.type.tz is None and pa.types.is_timestamp(field.type)
                and field.type.tz is not None):  # decode never gives one
            raise TypeError(f"a timestamp without time zone cannot be published as timestamptz ({column.type})")
        kind = (kinds or {}).get(field.name)
        fields.append(kind.copy_array(column) if kind is not None else column.cast(field.type))
    return pa.table(fields, schema=schema)


class OutputEncoder:
    """The output rows of a batch as binary COPY data: `header()` first, then `rows()` of each table of publishable
    rows, then `trailer()` once. `published`: the columns and their kinds (the sink's published_columns)."""

    def __init__(self, published: dict[str, ColumnKind], batch_id: int):
        self._schema, self._batch_id, self._kinds = output_schema(published), batch_id, dict(published)
        encoders = {field.name: kind.copy_encoder(field) for field, kind in zip(self._schema, published.values(),
                                                                               strict=True)}
        if any(encoder is not None for encoder in encoders.values()):
            encoders = {name: encoder or pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(self._schema.field(name))
                        for name, encoder in encoders.items()}
            self._encoder = pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(self._schema, encoders)
        else:
            self._encoder = pgpq.ArrowToPostgresBinaryEncoder(self._schema)

    def header(self) -> bytes:
        return self._encoder.write_header()

    def rows(self, table: pa.Table) -> Iterator[bytes]:
        """The rows of a publish frame's table holding publishable rows only (`output_rows`), batch by batch."""
        for batch in output_rows(table, self._schema, self._batch_id, self._kinds).to_batches():
            yield self._encoder.write_batch(batch)

    def trailer(self) -> bytes:
        return self._encoder.finish()


def _compact_coordinates(table: pa.Table) -> pa.Table:
    """A copy of the table's coordinates and dead-letter flags, in buffers of their own.

    Columns arriving from Spark Connect are slices of one message buffer: keeping a column as it is would
    keep every line of the message alive, and the whole batch would pile up in memory.
    """
    return pa.table({
        "kafka_topic": pc.dictionary_encode(table["kafka_topic"]).combine_chunks(),
        "kafka_partition": pa.array(table["kafka_partition"].to_numpy()),
        "kafka_offset": pa.array(table["kafka_offset"].to_numpy()),
        "dead": pa.array(pc.invert(table[PUBLISHED]).to_numpy(zero_copy_only=False).astype(np.int8)),
    })


def _newest_timestamps(table: pa.Table) -> dict[tuple[str, int], datetime]:
    """Per partition, the Kafka timestamp of the newest published record in a `publish_frame` table (a dead
    letter's is null: the frame carries output values for published rows only)."""
    newest = columns.KAFKA_TIMESTAMP.name
    grouped = table.select(["kafka_topic", "kafka_partition", newest]).group_by(
        ["kafka_topic", "kafka_partition"]).aggregate([(newest, "max")])
    return {(r["kafka_topic"], r["kafka_partition"]): r[f"{newest}_max"] for r in grouped.to_pylist()
            if r[f"{newest}_max"] is not None}


def _text(lines: pa.ChunkedArray) -> Iterator[memoryview]:
    """The bytes of an Arrow string column's values, back to back, without copying them."""
    for chunk in lines.chunks:
        if len(chunk):
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32, count=len(chunk) + 1, offset=chunk.offset * 4)
            yield memoryview(chunk.buffers()[2])[offsets[0]:offsets[-1]]


class CopyStream:
    """A file for psycopg2's copy_expert reading the output rows of a stream of publish frame Arrow tables as
    binary COPY data (`OutputEncoder`): a header, the rows as they come, a trailer.

    While the rows flow into COPY, it keeps the dead letters' lines, every record's coordinates and each
    partition's newest published timestamp, for `dead_letter_lines()` and `read_stats()` once the stream is
    drained, and times the stream: when its first rows came (`first_rows_at`, monotonic) and how long COPY then
    waited for more (`waiting_seconds`).
    """

    def __init__(self, tables: Iterable[pa.Table], published: dict[str, ColumnKind], batch_id: int):
        self._encoder = OutputEncoder(published, batch_id)
        self._finished = False
        self._tables = self._timed(iter(tables))
        self.first_rows_at: float | None = None
        self.waiting_seconds = 0.0
        self._pending: Iterator[memoryview] = iter([memoryview(self._encoder.header())])
        self._current = memoryview(b"")
        self._coordinates: list[pa.Table] = []
        self._newest: dict[tuple[str, int], datetime] = {}
        self._dead: list[pa.ChunkedArray] = []
        self.records = 0
        self.error: BaseException | None = None  # what broke the row stream, if anything

    def _timed(self, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
        while True:
            asked = time.monotonic()
            table = next(tables, None)
            now = time.monotonic()
            if self.first_rows_at is not None:
                self.waiting_seconds += now - asked
            elif table is not None and table.num_rows:
                self.first_rows_at = now
            if table is None:
                return
            yield table

    def _next_table(self) -> bool:
        try:
            return self._take(next(self._tables, None))
        except BaseException as exc:
            self.error = exc
            raise

    def _take(self, table: pa.Table | None) -> bool:
        while table is not None:
            if table.num_rows == 0:
                table = next(self._tables, None)
                continue
            self.records += table.num_rows
            published = table[PUBLISHED]
            self._coordinates.append(_compact_coordinates(table))
            for key, newest in _newest_timestamps(table).items():
                self._newest[key] = max(newest, self._newest.get(key, newest))
            dead = pc.invert(published)
            if pc.any(dead).as_py():
                self._dead.append(pc.filter(table[DEAD_LETTER_LINE], dead))
                table = table.filter(published)
            self._pending = map(memoryview, self._encoder.rows(table))
            return True
        return False

    def read(self, size: int = -1) -> bytes:
        while not self._current:
            self._current = next(self._pending, None)
            if self._current is None:
                self._current = memoryview(b"")
                if self._next_table():
                    continue
                if self._finished:
                    return b""
                self._finished = True
                self._pending = iter([memoryview(self._encoder.trailer())])
        if size < 0 or size >= len(self._current):
            out, self._current = self._current, memoryview(b"")
        else:
            out, self._current = self._current[:size], self._current[size:]
        return out.tobytes()

    readline = read  # psycopg2 only asks for read(); text-mode callers may probe readline

    def dead_letter_lines(self) -> bytes:
        return b"".join(bytes(view) for lines in self._dead for view in _text(lines))

    def read_stats(self) -> list[PartitionReadStats]:
        """Per-partition counts of what was read, for planning.check_read_coverage."""
        if not self._coordinates:
            return []
        table = pa.concat_tables(self._coordinates)
        table = table.set_column(0, "kafka_topic", pc.cast(table["kafka_topic"], pa.string()))
        grouped = table.group_by(["kafka_topic", "kafka_partition"]).aggregate([
            ("kafka_offset", "count"), ("kafka_offset", "count_distinct"), ("kafka_offset", "min"),
            ("kafka_offset", "max"), ("dead", "sum"),
        ])
        return [
            PartitionReadStats(row["kafka_topic"], row["kafka_partition"], row["kafka_offset_count"],
                               row["kafka_offset_count_distinct"], row["kafka_offset_min"], row["kafka_offset_max"],
                               row["dead_sum"], self._newest.get((row["kafka_topic"], row["kafka_partition"])))
            for row in grouped.to_pylist()
        ]
