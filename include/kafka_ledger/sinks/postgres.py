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
        ledger.ensure_pipeline_tables(cur, self.pipeline)

    def remove(self, cur: Cursor, ranges: Iterable[OffsetRange]) -> int:
        removed = 0
        for r in ranges:
            cur.execute(sql.delete_output_range(self.pipeline), {"topic": r.topic, "partition": r.partition,
                                                                 "from_offset": r.from_offset,
                                                                 "until_offset": r.until_offset})
            removed += cur.rowcount
        return removed

    def copy_lines(self, cur: Cursor, lines: IO[bytes]) -> int:
        cur.copy_expert(sql.copy_output(self.pipeline), lines, size=COPY_CHUNK_BYTES)
        return cur.rowcount

    def publish_staged(self, cur: Cursor, batch_id: int, attempt: int) -> int:
        cur.execute(sql.publish_output(self.pipeline), {"batch_id": batch_id, "attempt": attempt})
        return cur.rowcount
