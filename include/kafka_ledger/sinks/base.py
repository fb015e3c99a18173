"""The two kinds of sink, chosen by what they can do, and what every sink answers.

- A `TransactionalSink` is written by the commit itself, inside the one Postgres transaction that moves the offsets
  (the Postgres output table, an entity table): the rows arrive as a COPY stream or from the staging table.
- An `ArtifactSink` is written by the engine (Spark), as an artifact stamped with its batch (an Iceberg snapshot);
  the commit then finds the artifact, checks it against the batch's ranges and adopts it in that transaction.

Either way the offsets move only in the transaction that makes the rows the batch's (batch/commit.py). Code outside
sinks/ asks a sink what it can do (its class of the two, `envelope`, `maintenance`, ...), never which sink it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, ClassVar

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.formats.envelope import AppendRecords, Envelope
from kafka_ledger.ledger.db import Cursor
from kafka_ledger.model import columns
from kafka_ledger.model.kinds import ColumnKind
from kafka_ledger.model.ranges import OffsetRange, PartitionReadStats, RecordId, TopicPartition

if TYPE_CHECKING:
    from psycopg2.extensions import connection
    from pyspark.sql import DataFrame

    from kafka_ledger.config.pipeline import LakeMaintenanceSpec
    from kafka_ledger.ledger.db import Batch
    from kafka_ledger.spark.sessions import SparkSessions


class OutputView(ABC):
    """The output as `kafka-ledger verify` reads it: one consistent view for the whole verify."""

    # Whether the output holds a row for every published record, to be compared with Kafka record by record (an
    # entity table holds one row per key: verify checks its ledger only).
    holds_every_record: ClassVar[bool] = True

    @abstractmethod
    def exists(self) -> bool:
        """Whether the output exists yet (its table is made by the first plan)."""

    @abstractmethod
    def partitions(self) -> set[TopicPartition]:
        """Every partition with a row in the output."""

    @abstractmethod
    def offsets(self, tp: TopicPartition, from_offset: int, until_offset: int) -> Iterator[int]:
        """The offsets of the partition's rows in [from, until), ascending, as they stream."""

    def offsets_within(self, ranges: Sequence[OffsetRange]) -> Iterator[tuple[int, int]]:
        """(i, offset) of the rows inside ranges[i], by i and then ascending offset, as they stream: many small
        ranges at once (a sink may answer them all with one read; this one reads range by range)."""
        for i, r in enumerate(ranges):
            for offset in self.offsets(r.topic_partition, r.from_offset, r.until_offset):
                yield i, offset


class Sink(ABC):
    """Where a pipeline's rows are published."""

    # Whether a rewrite (replay, offset ranges, time window, backfill) must wait until the pipeline's unfinished
    # catch-up batch has committed: see IcebergSink.
    rewrites_wait_for_catch_up: ClassVar[bool] = False
    # Whether a rewrite stamps its artifact through its Spark session's settings (Iceberg's MERGE takes no write
    # options), so that it needs a session no other batch of the pipeline uses meanwhile.
    rewrites_stamp_the_session: ClassVar[bool] = False
    def __init__(self, pipeline: PipelineConfig):
        self.pipeline = pipeline

    @property
    def envelope(self) -> Envelope:
        """What the sink makes of records (a row each, or changes to entities)."""
        return AppendRecords()

    @property
    @abstractmethod
    def target(self) -> str:
        """Where the rows go, in words for logs (e.g. the qualified table name)."""

    @property
    @abstractmethod
    def asset_uri(self) -> str:
        """The URI of the output as an Airflow asset (`kafka-ledger://schema/table`, `iceberg://catalog/ns/table`)."""

    def describe(self) -> str:
        """What the output holds, when it is more than a row per record (for `status`)."""
        return ""

    @abstractmethod
    def prepare(self, cur: Cursor) -> None:
        """Create what the sink needs if missing; refuse, naming it, a target that cannot take the declared columns."""

    @abstractmethod
    def drop(self, cur: Cursor) -> None:
        """Remove what `prepare` made in the ledger's database (the pipeline is being removed)."""

    @abstractmethod
    def output_view(self, conn: connection) -> OutputView:
        """The output for verify, consistent with the ledger's snapshot that `conn` (a read-only, repeatable-read
        transaction) reads."""

    @abstractmethod
    def output_record_ids(self, cur: Cursor) -> list[tuple[str, int, int]]:
        """The (topic, partition, offset) of every row the output holds now, read back without Spark."""

    def output_columns(self) -> dict[str, ColumnKind]:
        """An output row's columns and their kinds: the declared ones, then the Kafka coordinates and the batch."""
        return {**{c.name: c.type for c in self.pipeline.columns},
                **{c.name: c.kind for c in columns.OUTPUT_TRAILER}}

    def published_columns(self) -> dict[str, ColumnKind]:
        """The columns of the rows a batch publishes: an output row's, and the envelope's own (a tombstone flag, a
        change event's unavailable values)."""
        return {**self.output_columns(), **{c.name: c.kind for c in self.envelope.extra_columns}}

    def staged_extra(self) -> tuple[columns.Column, ...]:
        """The envelope's columns, as the staging table holds them."""
        return self.envelope.extra_columns

    def maintenance(self) -> LakeMaintenanceSpec | None:
        """The upkeep the output needs on a schedule (compaction, expiry), if any."""
        return None

    def maintain(self, db: LedgerDatabase, sessions: SparkSessions) -> dict[str, Any]:
        """Run that upkeep now, in a Spark session from `sessions` (the pipeline's runtime's); only for a sink whose
        `maintenance` is set."""
        raise NotImplementedError(f"{self.target} needs no maintenance")


@dataclass(frozen=True)
class SinkWrite:
    """What a transactional sink made of a batch's rows: how many it published, and how many it wrote as dead letters
    itself, finding only then that it cannot publish them (an entity table's change event lacking a value the entity
    has no earlier copy of); `records_to_read`: the coordinates of the dead letters it wrote without their raw key and
    value (its rows do not carry them; some may be of records earlier batches parked), which the commit reads again
    from Kafka."""

    published: int
    dead_letters: int = 0
    records_to_read: tuple[RecordId, ...] = ()


class TransactionalSink(Sink):
    """A sink the commit writes inside its transaction: what it writes becomes visible exactly when the offsets move,
    or never."""

    @abstractmethod
    def remove(self, cur: Cursor, ranges: Iterable[OffsetRange]) -> int:
        """Delete the rows published earlier for these offsets (a rewrite replaces, never appends); returns how many."""

    @abstractmethod
    def copy_rows(self, cur: Cursor, batch: Batch, data: IO[bytes]) -> SinkWrite:
        """Publish the batch's rows arriving as binary COPY data of `published_columns()` (the connect runtime's
        stream)."""

    @abstractmethod
    def publish_staged(self, cur: Cursor, batch: Batch, attempt: int) -> SinkWrite:
        """Publish the decoded rows one attempt of the batch staged (the submit runtime)."""

    @property
    @abstractmethod
    def jdbc_table(self) -> str:
        """The table Spark's JDBC writer appends an at_least_once batch's rows to directly."""

    def evolve(self, cur: Cursor, batch_id: int) -> None:  # noqa: B027 - a sink without schema changes does nothing
        """In the commit's transaction, before the batch's rows: bring the output to the declared columns."""


class Artifact(ABC):
    """What an artifact sink's engine wrote for one attempt of a batch, found again by its stamp."""

    artifact_id: int
    batch_id: int
    attempt: int


class ArtifactSink(Sink):
    """A sink Spark writes as one artifact per batch, stamped with the batch; the commit adopts the artifact it finds
    in the output's current history, in the transaction that moves the offsets."""

    # What the artifact is called, in logs, the ledger's batch listings and the page (`snapshot`).
    artifact_noun: ClassVar[str]

    @abstractmethod
    def write_attempt(self, rows: DataFrame, batch: Batch, attempt: int
                      ) -> tuple[Artifact, list[tuple[str, int, int, str]]]:
        """In Spark: write the attempt's rows (batch/publish.publish_frame) as the batch's artifact, or adopt the one
        an earlier or racing attempt of the batch left, if it covers the ranges; returns it and the dead letters
        (topic, partition, offset, COPY line)."""

    @abstractmethod
    def current_artifact(self, batch_id: int) -> Artifact | None:
        """The batch's artifact in the output's current history now, if any (read without Spark)."""

    @abstractmethod
    def read_stats(self, artifact: Artifact, dead_letters: Iterable[tuple[str, int, int]]) -> list[PartitionReadStats]:
        """What the batch read, per partition, for the coverage check: the artifact's rows and its dead letters."""

    @abstractmethod
    def record(self, cur: Cursor, artifact: Artifact) -> None:
        """Record the adopted artifact in the ledger's batch (in the commit's transaction)."""
