"""Batch planning rules: from ledger positions and Kafka offsets to the exact ranges one batch reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from kafka_ledger.model.refusals import Refusal

# A record's place in Kafka: (topic, partition, offset).
RecordId = tuple[str, int, int]


@dataclass(frozen=True, order=True)
class TopicPartition:
    """A Kafka topic-partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [from_offset, until_offset) of one topic-partition; until is exclusive, as in Kafka.

    `skipped_from`, set only by latest_only planning, marks [skipped_from, from_offset) as deliberately
    not read: the batch moves the position over it and records it as skipped.
    """

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    skipped_from: int | None = None

    def __post_init__(self) -> None:
        if self.from_offset < 0 or self.until_offset < self.from_offset:
            raise ValueError(f"invalid offset range {self}")
        if self.skipped_from is not None and not 0 <= self.skipped_from < self.from_offset:
            raise ValueError(f"invalid skipped start {self.skipped_from} for {self}")

    @property
    def start(self) -> int:
        """Where the batch takes the partition's position from: the skipped start, else from_offset."""
        return self.from_offset if self.skipped_from is None else self.skipped_from

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def span(self) -> int:
        """Offsets covered. Records may be fewer: transaction markers, aborts and compaction leave gaps."""
        return self.until_offset - self.from_offset

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} [{self.from_offset}, {self.until_offset})"

    def as_dict(self) -> dict[str, str | int]:
        """The range as the CLI's JSON, the reports, the page and asset events show it (`until` exclusive)."""
        out: dict[str, str | int] = {"topic": self.topic, "partition": self.partition, "from": self.from_offset,
                                     "until": self.until_offset}
        if self.skipped_from is not None:
            out["skipped_from"] = self.skipped_from
        return out

    def describe(self) -> str:
        """One line for task logs and the CLI: the range, its offsets, and the stretch it skips if any."""
        skipping = (f"; skipping [{self.skipped_from}, {self.from_offset}), {self.from_offset - self.skipped_from} "
                    "offsets" if self.skipped_from is not None else "")
        return f"{self}  ({self.span} offsets{skipping})"


@dataclass(frozen=True)
class PartitionOffsets:
    """What Kafka holds for a partition: first offset still stored, and the read_committed end offset."""

    log_start: int
    end: int


class PlanError(RuntimeError):
    """A batch cannot be planned safely; nothing was written."""


class LostDataError(PlanError, Refusal):
    """Retention (or a topic reset) deleted offsets the pipeline had not read yet."""

    def __init__(self, lost: list[OffsetRange]):
        self.lost = lost
        details = "; ".join(str(r) for r in lost)
        super().__init__(
            f"data loss: {len(lost)} partition(s) lost offsets the pipeline never read "
            f"(deleted by retention before being ingested): {details}. Nothing was planned. "
            "Reset the positions of these partitions deliberately once the loss is accepted."
        )


NOTHING_PLANNED = "Nothing was planned and no position moved."


class TopicIdentityError(PlanError, Refusal):
    """A topic's Kafka id is not the one the pipeline's positions refer to (recreated, or another cluster's)."""

    def __init__(self, pipeline: str, changed: Mapping[str, tuple[str, str | None]], outcome: str = NOTHING_PLANNED):
        self.changed = dict(changed)
        details = "; ".join(
            f"topic {topic}: the ledger's positions refer to topic id {anchored}, "
            + (f"Kafka's {topic} has id {current}" if current else f"Kafka has no topic {topic} now")
            for topic, (anchored, current) in sorted(changed.items())
        )
        super().__init__(
            f"topic identity changed for {pipeline}: {details}. The topic was deleted and recreated, or this is "
            f"another cluster's topic of the same name: its offsets name other records. {outcome} Re-anchor "
            f"deliberately: `kafka-ledger reset {pipeline} --to-earliest` (or --to-latest, --to-datetime), dry run "
            "first, then --execute."
        )


def topic_identity(
    anchored: Mapping[str, str], current: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Compare the ids the ledger anchored with Kafka's: (topics to anchor now, {topic: (anchored, current)} changed).

    A topic seen for the first time is anchored to the id it has now; a topic whose id differs is changed.
    """
    unseen = {topic: topic_id for topic, topic_id in current.items() if topic not in anchored}
    changed = {topic: (anchored[topic], topic_id) for topic, topic_id in current.items()
               if topic in anchored and anchored[topic] != topic_id}
    return unseen, changed


def identity_changes(
    planned: Mapping[str, str | None], current: Mapping[str, str]
) -> dict[str, tuple[str, str | None]]:
    """Topics whose Kafka id is no longer the one a batch was planned against: {topic: (planned, current or None)}.

    A topic missing from `current` was deleted; a topic planned without a known id is not compared.
    """
    return {topic: (topic_id, current.get(topic)) for topic, topic_id in sorted(planned.items())
            if topic_id is not None and current.get(topic) != topic_id}


def earlier_incarnations(
    read: Iterable[tuple[OffsetRange, str | None]], current: Mapping[str, str]
) -> tuple[dict[str, tuple[set[str], list[OffsetRange]]], int]:
    """Read stretches whose batch read them from another topic of the same name than Kafka's now.

    Returns ({topic: (the earlier ids, the stretches)}, offsets whose topic id was never recorded). Topics Kafka
    does not hold now are left out (their offsets cannot be compared at all).
    """
    earlier: dict[str, tuple[set[str], list[OffsetRange]]] = {}
    unrecorded = 0
    for r, topic_id in read:
        if topic_id is None:
            unrecorded += r.span
        elif r.topic in current and topic_id != current[r.topic]:
            ids, stretches = earlier.setdefault(r.topic, (set(), []))
            ids.add(topic_id)
            stretches.append(r)
    return earlier, unrecorded


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
    skip_lost: bool = False,
) -> list[OffsetRange]:
    """The next batch: for each partition, [position, min(end, position + cap)), non-empty ranges only.

    `positions` must hold every partition to read (new ones at their start position). Raises
    LostDataError when a position is below the log start (unless `skip_lost`: the range then starts at
    the log start and marks the lost offsets as skipped, possibly reading nothing), PlanError when a
    position is past the end or a partition has disappeared from Kafka.
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
    if lost and not skip_lost:
        raise LostDataError(lost)
    lost_from = {r.topic_partition: r.from_offset for r in lost}
    positions = {tp: max(position, offsets[tp].log_start) for tp, position in positions.items()}
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
        if until > position or tp in lost_from:
            ranges.append(OffsetRange(tp.topic, tp.partition, position, until, skipped_from=lost_from.get(tp)))
    return ranges


def plan_latest_ranges(
    positions: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    max_records_per_partition: int,
    skip_lost: bool = False,
) -> list[OffsetRange]:
    """latest_only: read at most the newest `max_records_per_partition` offsets of each partition.

    Older unread offsets are skipped on purpose (never lag) and marked with skipped_from so the ledger
    records them. Same safety checks as plan_ranges: a position below the log start still fails.
    """
    ranges = []
    for r in plan_ranges(positions, offsets, max_records_per_partition, skip_lost):
        end = offsets[r.topic_partition].end
        if end - r.from_offset > max_records_per_partition:
            r = OffsetRange(r.topic, r.partition, end - max_records_per_partition, end, skipped_from=r.start)
        ranges.append(r)
    return ranges


def check_rewrite_ranges(
    requested: list[OffsetRange],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    positions: Mapping[TopicPartition, int],
    in_flight: Mapping[int, list[OffsetRange]],
) -> list[str]:
    """Why explicit ranges cannot be re-read and rewritten; an empty list means they can.

    A rewrite covers offsets behind the committed position only: the offsets at and after it belong to
    the regular catch-up, which reads them exactly once. `in_flight` maps unfinished batch ids to ranges.
    """
    problems = []
    seen: set[TopicPartition] = set()
    for r in requested:
        tp = r.topic_partition
        if tp in seen:
            problems.append(f"{tp} is requested more than once")
        seen.add(tp)
        if tp not in offsets:
            problems.append(f"{tp} is not a partition of the pipeline's subscription in Kafka")
            continue
        if r.span == 0:
            problems.append(f"{r} is empty")
        if r.from_offset < offsets[tp].log_start:
            problems.append(f"{r} starts below the log start offset {offsets[tp].log_start}: Kafka deleted those")
        if r.until_offset > offsets[tp].end:
            problems.append(f"{r} ends beyond the high watermark {offsets[tp].end}")
        position = positions.get(tp)
        if position is None:
            problems.append(f"{tp} has never been read by the pipeline: the next catch_up run reads it")
        elif r.until_offset > position:
            problems.append(
                f"{r} reaches past the committed position {position}: offsets from {position} on are not "
                "ingested yet and the next catch_up run reads them"
            )
        for batch_id, ranges in sorted(in_flight.items()):
            for other in ranges:
                if other.topic_partition == tp and other.start < r.until_offset and r.from_offset < other.until_offset:
                    problems.append(f"{r} overlaps {other} of batch {batch_id}, which is still in flight")
    return problems


def window_ranges(
    window_start: Mapping[TopicPartition, int | None],
    window_end: Mapping[TopicPartition, int | None],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    positions: Mapping[TopicPartition, int],
) -> tuple[list[OffsetRange], list[OffsetRange]]:
    """A time window as offsets: (ranges behind the positions, to rewrite; ranges not ingested yet).

    `window_start`/`window_end` are Kafka's first offsets at or after each bound (None: no record that
    late, i.e. the end offset). The part at or after a partition's position is left to the catch-up.
    """
    behind, pending = [], []
    for tp in sorted(offsets):
        end = offsets[tp].end
        lo = window_start.get(tp)
        hi = window_end.get(tp)
        lo = end if lo is None else max(lo, offsets[tp].log_start)
        hi = end if hi is None else min(hi, end)
        if hi <= lo:
            continue
        position = positions.get(tp, lo)
        if min(hi, position) > lo:
            behind.append(OffsetRange(tp.topic, tp.partition, lo, min(hi, position)))
        if hi > max(lo, position):
            pending.append(OffsetRange(tp.topic, tp.partition, max(lo, position), hi))
    return behind, pending


@dataclass(frozen=True)
class Coverage:
    """A committed stretch of a partition: read and published, or skipped on purpose."""

    from_offset: int
    until_offset: int
    disposition: Literal["read", "skipped"]
    batch_id: int | None = None
    reset_id: int | None = None


def cover_with_read(
    existing: list[Coverage], from_offset: int, until_offset: int, batch_id: int
) -> tuple[list[Coverage], list[Coverage]]:
    """Coverage changes when a rewrite batch publishes [from, until): (rows to remove, rows to add).

    The rewrite replaced every row of its range, so the range becomes one read stretch of the rewrite batch
    (coverage tells which batch published an offset's row last, and from which topic id it read it). Stretches
    reaching out of the range keep their outer parts; offsets covered by nothing before (history before the
    pipeline began) become read as well.
    """
    removed, added = [], []
    for c in existing:
        if c.until_offset <= from_offset or c.from_offset >= until_offset:
            continue
        removed.append(c)
        if c.from_offset < from_offset:
            added.append(replace(c, until_offset=from_offset))
        if c.until_offset > until_offset:
            added.append(replace(c, from_offset=until_offset))
    added.append(Coverage(from_offset, until_offset, "read", batch_id))
    return removed, added


def truncate_coverage(existing: list[Coverage], at: int) -> tuple[list[Coverage], list[Coverage]]:
    """Coverage changes when a position moves back to `at`: everything from `at` on is uncommitted."""
    removed, added = [], []
    for c in existing:
        if c.until_offset <= at:
            continue
        removed.append(c)
        if c.from_offset < at:
            added.append(replace(c, until_offset=at))
    return removed, added


def coverage_problems(tp: TopicPartition, coverage: list[Coverage], start_offset: int, position: int) -> list[str]:
    """Ledger invariants of one partition: no overlap, [start_offset, position) tiled, nothing beyond."""
    problems = []
    ordered = sorted(coverage, key=lambda c: c.from_offset)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.from_offset < a.until_offset:
            problems.append(f"{tp}: committed ranges [{a.from_offset}, {a.until_offset}) and "
                            f"[{b.from_offset}, {b.until_offset}) overlap")
    cursor = start_offset
    for c in ordered:
        if c.until_offset <= cursor:
            continue
        if c.from_offset > cursor and cursor < position:
            problems.append(f"{tp}: gap [{cursor}, {min(c.from_offset, position)}) between committed ranges")
        cursor = max(cursor, c.until_offset)
    if cursor < position:
        problems.append(f"{tp}: gap [{cursor}, {position}) before the position (nothing committed there)")
    beyond = [c for c in ordered if c.until_offset > position]
    if beyond:
        problems.append(f"{tp}: committed range [{beyond[0].from_offset}, {beyond[0].until_offset}) reaches past "
                        f"the position {position}")
    return problems


@dataclass(frozen=True)
class PositionChange:
    """One partition's position before and after a reset."""

    topic: str
    partition: int
    before: int | None  # None: the ledger has not seen the partition yet
    after: int

    @property
    def skipped(self) -> OffsetRange | None:
        """Offsets jumped over (never read) by a forward reset."""
        if self.before is not None and self.after > self.before:
            return OffsetRange(self.topic, self.partition, self.before, self.after)
        return None

    @property
    def reread(self) -> OffsetRange | None:
        """Offsets that a backward reset makes the pipeline read again (their rows get replaced)."""
        if self.before is not None and self.after < self.before:
            return OffsetRange(self.topic, self.partition, self.after, self.before)
        return None


def plan_reset(
    positions: Mapping[TopicPartition, int],
    targets: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
) -> list[PositionChange]:
    """Validate reset targets against Kafka and describe each partition's change."""
    problems = []
    for tp, target in sorted(targets.items()):
        if tp not in offsets:
            problems.append(f"{tp} is not a partition of the pipeline's subscription in Kafka")
        elif not offsets[tp].log_start <= target <= offsets[tp].end:
            problems.append(f"{tp}: offset {target} is outside [{offsets[tp].log_start}, {offsets[tp].end}] "
                            "(log start, end offset)")
    if problems:
        raise PlanError("cannot reset positions: " + "; ".join(problems))
    return [PositionChange(tp.topic, tp.partition, positions.get(tp), target) for tp, target in sorted(targets.items())]


def lost_ranges(ranges: Iterable[OffsetRange], log_starts: Mapping[TopicPartition, int]) -> list[OffsetRange]:
    """The parts of planned ranges that Kafka no longer holds (log start moved past their from-offset)."""
    gone = sorted(str(r) for r in ranges if r.topic_partition not in log_starts)
    if gone:
        raise PlanError(f"partitions of the batch no longer exist in Kafka: {', '.join(gone)}")
    return [
        OffsetRange(r.topic, r.partition, r.from_offset, min(log_starts[r.topic_partition], r.until_offset))
        for r in ranges
        if log_starts[r.topic_partition] > r.from_offset
    ]


def join_consecutive(batches: Iterable[Iterable[OffsetRange]]) -> tuple[list[OffsetRange], list[str]]:
    """The ranges of consecutive batches (oldest first) joined into one range per partition, and why they cannot
    be (a partition whose next range does not start where its previous one ended: offsets skipped on purpose, or
    read by a batch in between); the ranges are only good when there is no problem."""
    joined: dict[TopicPartition, OffsetRange] = {}
    problems = []
    for ranges in batches:
        for r in ranges:
            tp = TopicPartition(r.topic, r.partition)
            earlier = joined.get(tp)
            if earlier is None:
                joined[tp] = OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset)
            elif r.from_offset != earlier.until_offset:
                problems.append(f"{tp}: [{r.from_offset}, {r.until_offset}) does not follow {earlier}")
            else:
                joined[tp] = OffsetRange(r.topic, r.partition, earlier.from_offset, r.until_offset)
    return sorted(joined.values(), key=lambda r: (r.topic, r.partition)), problems


def partition_lag(
    positions: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    start_position: Literal["earliest", "latest"],
) -> dict[TopicPartition, int]:
    """The lag of every partition Kafka holds, in offsets (gaps included): from its committed position, or for a
    partition the ledger has never seen from where the pipeline would start it, to the end offset. The one
    definition behind `status`, the page, the demo's figures and planning's backlog."""
    starts = start_positions([tp for tp in offsets if tp not in positions], offsets, start_position)
    return {tp: max(0, offsets[tp].end - positions.get(tp, starts.get(tp, 0))) for tp in offsets}


def unread_positions(positions: Mapping[TopicPartition, int],
                     offsets: Mapping[TopicPartition, PartitionOffsets]) -> dict[TopicPartition, int]:
    """The positions at which a record waits to be read: within Kafka's log (at or after its start, before its end)."""
    return {tp: position for tp, position in positions.items()
            if tp in offsets and offsets[tp].log_start <= position < offsets[tp].end}


def backlog(positions: Mapping[TopicPartition, int], offsets: Mapping[TopicPartition, PartitionOffsets]) -> int:
    """Offsets between the given positions and the end offsets, summed (partitions not in `positions` left out)."""
    lags = partition_lag(positions, offsets, "earliest")
    return sum(lags[tp] for tp in positions if tp in lags)


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
    # The Kafka timestamp of the newest record published (freshness): None when every record was a dead letter.
    newest_timestamp: datetime | None = None


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
