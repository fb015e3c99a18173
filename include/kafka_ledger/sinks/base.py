"""What every sink does: publish a batch's rows inside the transaction that commits the batch's offsets."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import IO

from psycopg2.extensions import connection

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.ledger.db import Cursor
from kafka_ledger.model.ranges import OffsetRange, TopicPartition


class OutputView(ABC):
    """The output as `kafka-ledger verify` reads it: one consistent view for the whole verify."""

    @abstractmethod
    def exists(self) -> bool:
        """Whether the output exists yet (its table is made by the first plan)."""

    @abstractmethod
    def partitions(self) -> set[TopicPartition]:
        """Every partition with a row in the output."""

    @abstractmethod
    def offsets(self, tp: TopicPartition, from_offset: int, until_offset: int) -> Iterator[int]:
        """The offsets of the partition's rows in [from, until), ascending, as they stream."""


class Sink(ABC):
    """Where a pipeline's rows are published. Every method runs in the ledger transaction that commits the
    batch (commit.py): what a sink writes becomes visible exactly when the offsets move, or never."""

    # Whether a rewrite (replay, offset ranges, time window, backfill) must wait until the pipeline's unfinished
    # catch-up batch has committed: see IcebergSink.
    rewrites_wait_for_catch_up = False

    def __init__(self, pipeline: PipelineConfig):
        self.pipeline = pipeline

    @property
    @abstractmethod
    def target(self) -> str:
        """Where the rows go, in words for logs (e.g. the qualified table name)."""

    @abstractmethod
    def prepare(self, cur: Cursor) -> None:
        """Create what the sink needs if missing; refuse, naming it, a target that cannot take the declared columns."""

    @abstractmethod
    def output_view(self, conn: connection) -> OutputView:
        """The output for verify, consistent with the ledger's snapshot that `conn` (a read-only, repeatable-read
        transaction) reads."""

    @abstractmethod
    def output_record_ids(self, cur: Cursor) -> list[tuple[str, int, int]]:
        """The (topic, partition, offset) of every row the output holds now, read back without Spark."""

    @abstractmethod
    def remove(self, cur: Cursor, ranges: Iterable[OffsetRange]) -> int:
        """Delete the rows published earlier for these offsets (a rewrite replaces, never appends); returns how many."""

    @abstractmethod
    def copy_rows(self, cur: Cursor, data: IO[bytes]) -> int:
        """Publish rows arriving as binary COPY data (the connect runtime's stream); returns how many."""

    @abstractmethod
    def publish_staged(self, cur: Cursor, batch_id: int, attempt: int) -> int:
        """Publish the decoded rows one attempt staged (the submit runtime); returns how many."""
