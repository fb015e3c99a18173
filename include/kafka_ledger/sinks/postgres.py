"""The Postgres sink: rows go into the pipeline's output table in the ledger database."""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO

from kafka_ledger import ledger, sql
from kafka_ledger.ledger import Cursor
from kafka_ledger.planning import OffsetRange
from kafka_ledger.sinks.base import Sink

# Bytes handed to COPY per read of the row stream.
COPY_CHUNK_BYTES = 1 << 20


class PostgresSink(Sink):
    """The output table `output_schema.output_table`, written in the same transaction as the offsets."""

    @property
    def target(self) -> str:
        return self.pipeline.qualified_output_table

    def prepare(self, cur: Cursor) -> None:
        ledger.ensure_output_table(cur, self.pipeline)
        ledger.ensure_staging_table(cur, self.pipeline)

    def output_record_ids(self, cur: Cursor) -> list[tuple[str, int, int]]:
        cur.execute(sql.select_output_record_ids(self.pipeline))
        return [tuple(row) for row in cur.fetchall()]

    def remove(self, cur: Cursor, ranges: Iterable[OffsetRange]) -> int:
        cur.execute(sql.delete_output_ranges(self.pipeline), sql.ranges_params(ranges))
        return cur.rowcount

    def copy_rows(self, cur: Cursor, data: IO[bytes]) -> int:
        cur.copy_expert(sql.copy_output(self.pipeline), data, size=COPY_CHUNK_BYTES)
        return cur.rowcount

    def publish_staged(self, cur: Cursor, batch_id: int, attempt: int) -> int:
        cur.execute(sql.publish_output(self.pipeline), {"batch_id": batch_id, "attempt": attempt})
        return cur.rowcount
