"""Direct publish: decoded rows as COPY lines from Spark, copied into their tables by the committing client.

Spark renders every record as one line of Postgres COPY CSV, for the output table or for the dead letters
(`copy_lines`); the client streams those lines into COPY inside the commit's transaction (`CopyStream`)
and summarises what it read for the coverage check. No staging table, no second copy of any row.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafka_ledger import columns, sql
from kafka_ledger.config import PipelineConfig
from kafka_ledger.planning import PartitionReadStats

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Columns of the frame `copy_lines` returns; `published` is false for a dead letter.
COORDINATES = columns.names(columns.COORDINATES)
LINE_COLUMNS = [*COORDINATES, "published", "line"]

# The kind of every column a line holds, which says how it is written as CSV.
_LEDGER_KINDS = {c.name: c.kind for c in (*columns.OUTPUT_TRAILER, *columns.DEAD_LETTER)}


def _csv_field(value: Column, kind: str) -> Column:
    """One field of a COPY CSV line; NULL stays NULL (an unquoted empty field, which COPY reads as NULL)."""
    from pyspark.sql import functions as F

    if kind == "string":
        # Always quoted, so an empty string is "" and never NULL; quotes doubled, the CSV way.
        return F.concat(F.lit('"'), F.replace(value, F.lit('"'), F.lit('""')), F.lit('"'))
    if kind == "timestamp":
        # Explicit UTC offset: the session time zone is UTC (see spark_runtime.SESSION_CONF).
        return F.date_format(value, "yyyy-MM-dd HH:mm:ss.SSSSSSXXX")
    if kind == "bytes":
        return F.concat(F.lit("\\x"), F.hex(value))
    # Numbers and booleans: Spark's text form (doubles round-trip exactly) is Postgres input syntax.
    return value.cast("string")


def _csv_line(fields: list[Column]) -> Column:
    from pyspark.sql import functions as F

    return F.concat(F.concat_ws(",", *[F.coalesce(f, F.lit("")) for f in fields]), F.lit("\n"))


def copy_lines(decoded: DataFrame, pipeline: PipelineConfig, batch_id: int) -> DataFrame:
    """Decoded records (decode.decode_records) -> Kafka coordinates, `published` and the record's COPY line.

    A publishable record's line fits sql.copy_output(pipeline); a dead letter's fits sql.COPY_DEAD_LETTERS.
    """
    from pyspark.sql import functions as F

    types = {**_LEDGER_KINDS, **{c.name: c.type for c in pipeline.columns}}
    values = {"batch_id": F.lit(batch_id).cast("long"), "pipeline": F.lit(pipeline.name)}
    published = F.col("error").isNull()

    def line(columns: list[str], kinds: dict[str, str]) -> Column:
        return _csv_line([_csv_field(values.get(name, F.col(name)), kinds[name]) for name in columns])

    return decoded.select(
        *COORDINATES,
        published.alias("published"),
        F.when(published, line(sql.output_columns(pipeline), types))
        .otherwise(line(sql.DEAD_LETTER_COLUMNS, _LEDGER_KINDS)).alias("line"),
    )


def _compact_coordinates(table: pa.Table) -> pa.Table:
    """A copy of the table's coordinates and dead-letter flags, in buffers of their own.

    Columns arriving from Spark Connect are slices of one message buffer: keeping a column as it is would
    keep every line of the message alive, and the whole batch would pile up in memory.
    """
    return pa.table({
        "kafka_topic": pc.dictionary_encode(table["kafka_topic"]).combine_chunks(),
        "kafka_partition": pa.array(table["kafka_partition"].to_numpy()),
        "kafka_offset": pa.array(table["kafka_offset"].to_numpy()),
        "dead": pa.array(pc.invert(table["published"]).to_numpy(zero_copy_only=False).astype(np.int8)),
    })


def _text(lines: pa.ChunkedArray) -> Iterator[memoryview]:
    """The bytes of an Arrow string column's values, back to back, without copying them."""
    for chunk in lines.chunks:
        if len(chunk):
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32, count=len(chunk) + 1, offset=chunk.offset * 4)
            yield memoryview(chunk.buffers()[2])[offsets[0]:offsets[-1]]


class CopyStream:
    """A file for psycopg2's copy_expert reading the output lines of a stream of Arrow tables.

    While the output lines flow into COPY, it keeps the dead letters' lines and every record's
    coordinates, for `dead_letter_lines()` and `read_stats()` once the stream is drained, and times the
    stream: when its first rows came (`first_rows_at`, monotonic) and how long COPY then waited for more
    (`waiting_seconds`).
    """

    def __init__(self, tables: Iterable[pa.Table]):
        self._tables = self._timed(iter(tables))
        self.first_rows_at: float | None = None
        self.waiting_seconds = 0.0
        self._pending: Iterator[memoryview] = iter(())
        self._current = memoryview(b"")
        self._coordinates: list[pa.Table] = []
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
            published = table["published"]
            self._coordinates.append(_compact_coordinates(table))
            dead = pc.invert(published)
            if pc.any(dead).as_py():
                self._dead.append(pc.filter(table["line"], dead))
                self._pending = _text(pc.filter(table["line"], published))
            else:
                self._pending = _text(table["line"])
            return True
        return False

    def read(self, size: int = -1) -> bytes:
        while not self._current:
            self._current = next(self._pending, None)
            if self._current is None:
                self._current = memoryview(b"")
                if not self._next_table():
                    return b""
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
                               row["dead_sum"])
            for row in grouped.to_pylist()
        ]
