"""Batch planning rules: from ledger positions and Kafka offsets to the exact ranges one batch reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, order=True)
class TopicPartition:
    """A Kafka topic-partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [from_offset, until_offset) of one topic-partition; until is exclusive, as in Kafka."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    def __post_init__(self) -> None:
        if self.from_offset < 0 or self.until_offset < self.from_offset:
            raise ValueError(f"invalid offset range {self}")

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def span(self) -> int:
        """Offsets covered. Records may be fewer: transaction markers, aborts and compaction leave gaps."""
        return self.until_offset - self.from_offset

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} [{self.from_offset}, {self.until_offset})"


@dataclass(frozen=True)
class PartitionOffsets:
    """What Kafka holds for a partition: first offset still stored, and the read_committed end offset."""

    log_start: int
    end: int


class PlanError(RuntimeError):
    """A batch cannot be planned safely; nothing was written."""


class LostDataError(PlanError):
    """Retention (or a topic reset) deleted offsets the pipeline had not read yet."""

    def __init__(self, lost: list[OffsetRange]):
        self.lost = lost
        details = "; ".join(str(r) for r in lost)
        super().__init__(
            f"data loss: {len(lost)} partition(s) lost offsets the pipeline never read "
            f"(deleted by retention before being ingested): {details}. Nothing was planned. "
            "Reset the positions of these partitions deliberately once the loss is accepted."
        )


def start_positions(
    new_partitions: Iterable[TopicPartition],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    start_position: Literal["earliest", "latest"],
) -> dict[TopicPartition, int]:
    """Where partitions the ledger has never seen begin: the log start (earliest) or the end (latest)."""
    return {
        tp: offsets[tp].log_start if start_position == "earliest" else offsets[tp].end
        for tp in new_partitions
    }


def plan_ranges(
    positions: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    max_records_per_partition: int,
) -> list[OffsetRange]:
    """The next batch: for each partition, [position, min(end, position + cap)), non-empty ranges only.

    `positions` must hold every partition to read (new ones at their start position). Raises
    LostDataError when a position is below the log start, PlanError when a position is past the end
    or a partition has disappeared from Kafka.
    """
    if max_records_per_partition < 1:
        raise ValueError("max_records_per_partition must be at least 1")
    missing = sorted(tp for tp in positions if tp not in offsets)
    if missing:
        raise PlanError(
            "partitions in the ledger no longer exist in Kafka (topic deleted or recreated?): "
            + ", ".join(str(tp) for tp in missing)
        )
    lost = [
        OffsetRange(tp.topic, tp.partition, position, offsets[tp].log_start)
        for tp, position in sorted(positions.items())
        if position < offsets[tp].log_start
    ]
    if lost:
        raise LostDataError(lost)
    ahead = [
        f"{tp} position {position} > end offset {offsets[tp].end}"
        for tp, position in sorted(positions.items())
        if position > offsets[tp].end
    ]
    if ahead:
        raise PlanError(
            "ledger positions are beyond the end of the log (topic recreated or truncated?): " + "; ".join(ahead)
        )
    ranges = []
    for tp, position in sorted(positions.items()):
        until = min(offsets[tp].end, position + max_records_per_partition)
        if until > position:
            ranges.append(OffsetRange(tp.topic, tp.partition, position, until))
    return ranges


def lost_ranges(ranges: Iterable[OffsetRange], offsets: Mapping[TopicPartition, PartitionOffsets]) -> list[OffsetRange]:
    """The parts of planned ranges that Kafka no longer holds (log start moved past their from-offset)."""
    gone = sorted(str(r) for r in ranges if r.topic_partition not in offsets)
    if gone:
        raise PlanError(f"partitions of the batch no longer exist in Kafka: {', '.join(gone)}")
    return [
        OffsetRange(r.topic, r.partition, r.from_offset, min(offsets[r.topic_partition].log_start, r.until_offset))
        for r in ranges
        if offsets[r.topic_partition].log_start > r.from_offset
    ]


def backlog(positions: Mapping[TopicPartition, int], offsets: Mapping[TopicPartition, PartitionOffsets]) -> int:
    """Offsets between the positions and the end offsets: the lag, in offsets (gaps included)."""
    return sum(max(0, offsets[tp].end - position) for tp, position in positions.items() if tp in offsets)


@dataclass(frozen=True)
class PartitionReadStats:
    """What a batch actually read from one partition, summarised from the staged rows."""

    topic: str
    partition: int
    records: int
    distinct_offsets: int
    min_offset: int | None
    max_offset: int | None
    dead_letters: int = 0


def check_read_coverage(ranges: Iterable[OffsetRange], stats: Iterable[PartitionReadStats]) -> list[str]:
    """Problems with what was read against the planned ranges; an empty list means complete.

    Gap-aware: a range may hold fewer records than offsets (or none), so the check is that every record
    read lies inside its planned range, no offset was read twice and no unplanned partition was read.
    Deleted offsets are caught by the reader (failOnDataLoss) and by the log-start check around the read.
    """
    planned = {r.topic_partition: r for r in ranges}
    problems = []
    for s in stats:
        tp = TopicPartition(s.topic, s.partition)
        r = planned.get(tp)
        if r is None:
            problems.append(f"{tp}: {s.records} records read from a partition outside the batch")
            continue
        if s.records > r.span:
            problems.append(f"{r}: {s.records} records read, more than the {r.span} offsets in the range")
        if s.distinct_offsets != s.records:
            problems.append(f"{r}: {s.records - s.distinct_offsets} offsets read more than once")
        if s.min_offset is not None and s.min_offset < r.from_offset:
            problems.append(f"{r}: offset {s.min_offset} read, before the range")
        if s.max_offset is not None and s.max_offset >= r.until_offset:
            problems.append(f"{r}: offset {s.max_offset} read, past the range")
    return problems
