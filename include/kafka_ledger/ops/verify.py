"""Ledger invariants and exactly-once accounting of a pipeline, checked against Kafka itself.

Incremental by default. The ledger records, per pipeline, a verified point: a batch id through which every
batch of the pipeline was finished and checked by a verify that found no problem. The next verify checks
the ranges of every batch COMMITTED AFTER that point, whatever its kind, so:

- a catch-up batch brings new offsets: checked;
- a rewrite (replay, offset ranges, time window, backfill) replaces rows of ranges verified before: it is
  a batch of its own with a new id, so its ranges are checked again after it commits;
- a batch still running when a verify looks (a replay planned before a newer catch-up committed) keeps
  the point below its id (sql.SELECT_FINISHED_THROUGH), so its commit is checked next time;
- a backward reset moves no row: the rows past the moved position, and every other offset outside the
  committed read ranges (below where the pipeline began, skipped stretches, partitions the ledger never
  read), are scanned on every verify, each an index range scan that finds nothing when all is well; the
  re-read that replaces those rows is a new catch-up batch, checked after it commits.

Batch ids come from one sequence, and a pipeline's batches are planned under its advisory lock, so a batch
that commits after a verify's snapshot always has an id above any batch that snapshot saw finished.
What an incremental verify does not see: changes to already verified ranges made outside the pipeline
(rows edited or deleted by hand) and Kafka-side changes there (compaction, retention): `full=True`
(`kafka-ledger verify --full`) compares everything. The ledger's invariants are cheap and always checked
in full, and so is the identity of every read range's topic: a range read from a topic since deleted and
recreated under the same name holds rows whose offsets name other records now (one Kafka look-up of the topic
ids; no per-row cost).

Bounded in memory: Kafka's offsets (ascending as they are read) are merged against the rows and dead letters
streamed in offset order from server-side cursors; only counts and a few examples are kept. A partition with
much to read is checked on its own, streamed; small ones (a few new records, or only the offsets outside the read
ranges, which hold no row when all is well) are checked many at a time, with one query for their rows, one for
their dead letters and one consumer assignment for their records (held: at most GROUP_OFFSETS offsets), so that a
verify of thousands of partitions costs a few round trips, not thousands.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg2.extensions
from confluent_kafka import KafkaException

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient, Services
from kafka_ledger.kafka import consumer_group
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model.ranges import (
    Coverage,
    OffsetRange,
    PartitionOffsets,
    PlanError,
    RecordId,
    TopicPartition,
    coverage_problems,
    earlier_incarnations,
)
from kafka_ledger.observe.events import VerifyFinished
from kafka_ledger.ops import readback
from kafka_ledger.sinks import sink_for
from kafka_ledger.sinks.base import OutputView

log = logging.getLogger(__name__)

Span = tuple[int, int]  # [from, until)

# A deadline for the Kafka read that only a stalled read reaches: a floor, plus time at a rate far below
# what the read attains (several hundred thousand records per second here).
DEADLINE_FLOOR_SECONDS = 60.0
DEADLINE_OFFSETS_PER_SECOND = 20_000
OPEN_END = 2**63 - 1  # the largest bigint: "to the end of the partition"
EXAMPLES = 5
FETCH_ROWS = 50_000
# A partition whose check reads at most this many Kafka offsets (in one stretch) is checked together with others,
# up to GROUP_PARTITIONS partitions and GROUP_OFFSETS offsets a group (their Kafka offsets held meanwhile).
SMALL_PARTITION_OFFSETS = 10_000
GROUP_OFFSETS = 100_000
GROUP_PARTITIONS = 2_000

READ, AWAITING, OUTSIDE = "read", "awaiting", "outside"


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """Sorted, disjoint spans covering the same offsets (overlapping and adjacent spans joined)."""
    merged: list[Span] = []
    for lo, hi in sorted(s for s in spans if s[0] < s[1]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def subtract_spans(whole: Span, holes: Iterable[Span]) -> list[Span]:
    """The parts of `whole` outside every span of `holes`."""
    result, cursor = [], whole[0]
    for lo, hi in merge_spans(holes):
        if lo > cursor:
            result.append((cursor, min(lo, whole[1])))
        cursor = max(cursor, hi)
        if cursor >= whole[1]:
            break
    if cursor < whole[1]:
        result.append((cursor, whole[1]))
    return [s for s in result if s[0] < s[1]]


class _Where:
    """Where an offset of one partition lies: in a committed read range, at or past the position (rows a
    reset left to be replaced), or outside. Offsets must be asked in ascending order (the merge does)."""

    def __init__(self, read: list[Span], position: int | None):
        self.read, self.position, self.i = read, position, 0

    def __call__(self, offset: int) -> str:
        while self.i < len(self.read) and self.read[self.i][1] <= offset:
            self.i += 1
        if self.i < len(self.read) and self.read[self.i][0] <= offset:
            return READ
        return AWAITING if self.position is not None and offset >= self.position else OUTSIDE


@dataclass
class Tally:
    """Counts of one comparison over any number of partitions, with the first few examples of each kind
    (partitions compared in sorted order, offsets ascending: the examples are the smallest ids)."""

    kafka_records: int = 0
    output_rows: int = 0
    dead_letters: int = 0
    missing: int = 0
    duplicates: int = 0
    doubled: int = 0
    unexpected: int = 0
    compacted_away: int = 0
    outside: int = 0
    awaiting: int = 0
    examples: dict[str, list[RecordId]] = field(default_factory=dict)

    def note(self, kind: str, rid: RecordId) -> None:
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES:
            shown.append(rid)

    def example_text(self, kind: str, total: int) -> str:
        shown = ", ".join(f"{t}-{p}@{o}" for t, p, o in self.examples.get(kind, []))
        return shown + (f" and {total - EXAMPLES} more" if total > EXAMPLES else "")


def compare_partition(
    tally: Tally,
    tp: TopicPartition,
    kafka: Iterable[int],
    stored: Iterable[tuple[int, bool]],
    where: _Where,
    log_start: int | None,
    compacted: bool,
) -> None:
    """Merge one partition's Kafka record offsets with its stored rows, both ascending, into `tally`.

    `stored` holds (offset, is_dead_letter) per row. A Kafka record in a read range must be stored exactly
    once; a row in a read range needs its record in Kafka (unless below the log start: not comparable; or
    on a compacted topic: compacted away); a row past the position awaits its re-read; any other is outside.
    """
    kafka_it = iter(kafka)
    k = next(kafka_it, None)

    def kafka_only(offset: int) -> None:
        if where(offset) == READ:
            tally.kafka_records += 1
            tally.missing += 1
            tally.note("missing", (tp.topic, tp.partition, offset))

    def settle(offset: int, rows: int) -> None:
        nonlocal k
        while k is not None and k < offset:
            kafka_only(k)
            k = next(kafka_it, None)
        in_kafka = k == offset
        if in_kafka:
            k = next(kafka_it, None)
        rid = (tp.topic, tp.partition, offset)
        if rows > 1:
            tally.duplicates += rows - 1
            tally.doubled += 1
            tally.note("doubled", rid)
        kind = where(offset)
        if kind == READ:
            if in_kafka:
                tally.kafka_records += 1
            elif log_start is not None and offset >= log_start:
                # A compacted topic drops older records of a key after they were read: not a problem.
                tally.compacted_away += compacted
                tally.unexpected += not compacted
                tally.note("compacted_away" if compacted else "unexpected", rid)
        elif kind == AWAITING:
            tally.awaiting += 1
        else:
            tally.outside += 1
            tally.note("outside", rid)

    current, rows = None, 0
    for offset, dead in stored:
        if dead:
            tally.dead_letters += 1
        else:
            tally.output_rows += 1
        if offset == current:
            rows += 1
            continue
        if current is not None:
            settle(current, rows)
        current, rows = offset, 1
    if current is not None:
        settle(current, rows)
    while k is not None:
        kafka_only(k)
        k = next(kafka_it, None)


@dataclass
class VerifyReport:
    """Everything verify found for one pipeline.

    `ok` only when the check completed and found no problem; `unverified` says why a check could not be
    completed (Kafka unreachable, a topic gone, the deadline passed): nothing is concluded about the data.
    """

    pipeline: str
    mode: str = "incremental"
    partitions: int = 0
    committed_offsets: int = 0
    skipped_offsets: int = 0
    kafka_records: int = 0
    output_rows: int = 0
    dead_letters: int = 0
    missing: int = 0
    duplicates: int = 0
    unexpected: int = 0
    outside_committed: int = 0
    awaiting_reread: int = 0
    unverifiable_offsets: int = 0
    compacted_away: int = 0
    # Committed offsets read from an earlier topic of the same name (deleted and recreated since), and offsets
    # committed before kafka-ledger recorded topic ids (their topic's identity cannot be checked).
    earlier_topic_offsets: int = 0
    unrecorded_topic_id_offsets: int = 0
    # Incremental: ranges of the batches committed after `checked_after_batch`; full: every read range.
    checked_after_batch: int | None = None
    checked_batches: int = 0
    checked_ranges: list[dict[str, Any]] = field(default_factory=list)
    verified_point: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    unverified: str | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Partitions where the pipeline's mirror consumer group differs from the ledger (not a problem: the
    # ledger is authoritative and the next commit rewrites the group).
    mirror_differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.unverified is None

    @property
    def result(self) -> str:
        """One of ledger.sql.VERIFY_RESULTS: what the ledger records of this verify."""
        return "problems" if self.problems else "unverified" if self.unverified is not None else "ok"

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


@dataclass(frozen=True)
class _PartitionWork:
    """What one partition's check reads: stored rows in `spans`, Kafka's records in `kafka_spans`."""

    tp: TopicPartition
    read: list[Span]
    position: int | None
    spans: list[Span]
    kafka_spans: list[Span]


def _kafka_spans(spans: list[Span], read: list[Span], offsets: PartitionOffsets | None) -> list[Span]:
    """Per span, the stretch Kafka must be read over: from the first to the last read offset in it, within
    what Kafka holds (rows in a read range are compared against exactly this stretch)."""
    if offsets is None:
        return []
    result = []
    for lo, hi in spans:
        inside = [(max(lo, a), min(hi, b)) for a, b in read if a < hi and b > lo]
        if inside:
            start, end = max(inside[0][0], offsets.log_start), min(inside[-1][1], offsets.end)
            if start < end:
                result.append((start, end))
    return result


def _stored_offsets(conn: psycopg2.extensions.connection, pipeline: PipelineConfig, output: OutputView,
                    tp: TopicPartition, span: Span) -> Iterator[tuple[int, bool]]:
    """The partition's rows (in the sink's output) and dead letters (in the ledger) in `span` as (offset,
    is_dead_letter), in offset order, merged here as they stream (Postgres 15 would plan an ORDER BY over a
    UNION ALL of the two as a full sort, spilling to disk for a big partition)."""
    params = {"pipeline": pipeline.name, "topic": tp.topic, "partition": tp.partition,
              "from_offset": span[0], "until_offset": span[1]}

    def dead_letters() -> Iterator[tuple[int, bool]]:
        with conn.cursor(name=f"verify_{uuid.uuid4().hex}") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(sql.SELECT_DEAD_LETTER_OFFSETS, params)
            for (offset,) in cur:
                yield offset, True

    return heapq.merge(((offset, False) for offset in output.offsets(tp, *span)), dead_letters())


def _kafka_offsets(consumer: Any, tp: TopicPartition, spans: list[Span], deadline: float) -> Iterator[int]:
    for lo, hi in spans:
        yield from readback.partition_record_offsets(consumer, tp, lo, hi, deadline)


def _small(w: _PartitionWork) -> bool:
    """Whether the partition's check is checked together with others' (its Kafka records held meanwhile)."""
    return len(w.kafka_spans) <= 1 and sum(hi - lo for lo, hi in w.kafka_spans) <= SMALL_PARTITION_OFFSETS


def _groups(work: list[_PartitionWork]) -> Iterator[list[_PartitionWork]]:
    """The partitions in their order, small ones gathered into groups of at most GROUP_PARTITIONS partitions and
    GROUP_OFFSETS Kafka offsets, every other one alone."""
    group: list[_PartitionWork] = []
    held = 0
    for w in work:
        if not _small(w):
            if group:
                yield group
            group, held = [], 0
            yield [w]
            continue
        size = sum(hi - lo for lo, hi in w.kafka_spans)
        if group and (len(group) >= GROUP_PARTITIONS or held + size > GROUP_OFFSETS):
            yield group
            group, held = [], 0
        group.append(w)
        held += size
    if group:
        yield group


@dataclass
class _Check:
    """Compares partitions' Kafka records with their stored rows into one tally: one partition streamed span by
    span, or many small ones together (one query for their rows, one for their dead letters, one assignment of
    their partitions: a verify of thousands of partitions is not thousands of round trips each)."""

    tally: Tally
    conn: psycopg2.extensions.connection
    pipeline: PipelineConfig
    output: OutputView
    has_output: bool
    consumer: Any
    offsets: dict[TopicPartition, PartitionOffsets]
    compacted: set[str]
    deadline: float

    def _compare(self, w: _PartitionWork, kafka: Iterable[int], stored: Iterable[tuple[int, bool]]) -> None:
        log_start = self.offsets[w.tp].log_start if w.tp in self.offsets else None
        compare_partition(self.tally, w.tp, kafka, stored, _Where(w.read, w.position), log_start,
                          w.tp.topic in self.compacted)

    def partition(self, w: _PartitionWork) -> None:
        for span in w.spans:
            kafka_spans = [s for s in w.kafka_spans if span[0] <= s[0] < span[1]]
            self._compare(
                w,
                _kafka_offsets(self.consumer, w.tp, kafka_spans, self.deadline) if kafka_spans else (),
                _stored_offsets(self.conn, self.pipeline, self.output, w.tp, span) if self.has_output else (),
            )

    def together(self, group: list[_PartitionWork]) -> None:
        kafka = readback.ranges_record_offsets(
            self.consumer, [OffsetRange(w.tp.topic, w.tp.partition, *w.kafka_spans[0]) for w in group if w.kafka_spans],
            self.deadline) if any(w.kafka_spans for w in group) else {}
        # Each span's rows come back in the spans' order, so the partitions' rows arrive one partition after another.
        spans = [OffsetRange(w.tp.topic, w.tp.partition, lo, hi) for w in group for lo, hi in w.spans]
        owner = [i for i, w in enumerate(group) for _ in w.spans]
        stored = _stored_within(self.conn, self.pipeline, self.output, spans) if self.has_output else iter(())
        rows_by_partition = itertools.groupby(stored, key=lambda row: owner[row[0]])
        current = next(rows_by_partition, None)
        for i, w in enumerate(group):
            if current is not None and current[0] == i:
                self._compare(w, kafka.get(w.tp, ()), ((offset, dead) for _, offset, dead in current[1]))
                current = next(rows_by_partition, None)
            else:
                self._compare(w, kafka.get(w.tp, ()), ())


def _stored_within(conn: psycopg2.extensions.connection, pipeline: PipelineConfig, output: OutputView,
                   spans: list[OffsetRange]) -> Iterator[tuple[int, int, bool]]:
    """(i, offset, is_dead_letter) of the rows and dead letters inside spans[i], by i and then offset: both read by
    one statement each and merged as they stream."""
    def dead_letters() -> Iterator[tuple[int, int, bool]]:
        with conn.cursor(name=f"verify_{uuid.uuid4().hex}") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(sql.SELECT_DEAD_LETTER_OFFSETS_WITHIN_RANGES,
                        {"pipeline": pipeline.name, **sql.ranges_params(spans)})
            for range_no, offset in cur:
                yield range_no - 1, offset, True

    return heapq.merge(((i, offset, False) for i, offset in output.offsets_within(spans)), dead_letters())


def _ledger_checks(report: VerifyReport, positions: dict[TopicPartition, ledger.PositionRow],
                   coverage: dict[TopicPartition, list[Coverage]]) -> None:
    for tp, row in sorted(positions.items()):
        report.problems += coverage_problems(tp, coverage.get(tp, []), row.start_offset, row.position)
    for tp in sorted(set(coverage) - set(positions)):
        report.problems.append(f"{tp}: committed ranges without a position")
    for ranges in coverage.values():
        report.committed_offsets += sum(c.until_offset - c.from_offset for c in ranges if c.disposition == "read")
        report.skipped_offsets += sum(c.until_offset - c.from_offset for c in ranges if c.disposition == "skipped")
    if report.skipped_offsets:
        report.warnings.append(f"{report.skipped_offsets} offsets were skipped on purpose (latest_only or a reset)")


def _unverifiable(report: VerifyReport, coverage: dict[TopicPartition, list[Coverage]],
                  offsets: dict[TopicPartition, PartitionOffsets]) -> None:
    """Offsets Kafka has deleted since they were committed can no longer be compared."""
    for tp, ranges in coverage.items():
        log_start = offsets[tp].log_start if tp in offsets else None
        for c in ranges:
            if c.disposition == "read":
                stop = c.until_offset if log_start is None else min(c.until_offset, log_start)
                report.unverifiable_offsets += max(0, stop - c.from_offset)
    if report.unverifiable_offsets:
        report.warnings.append(f"{report.unverifiable_offsets} committed offsets are no longer in Kafka "
                               "(retention or a deleted topic): not compared")


def _identity_checks(report: VerifyReport, read: list[tuple[OffsetRange, str | None]],
                     current: dict[str, str]) -> None:
    """Rows read from an earlier topic of the same name sit under offsets that name other records now."""
    earlier, report.unrecorded_topic_id_offsets = earlier_incarnations(read, current)
    for topic, (ids, stretches) in sorted(earlier.items()):
        offsets = sum(r.span for r in stretches)
        report.earlier_topic_offsets += offsets
        first = stretches[:EXAMPLES]
        shown = ", ".join(f"{r.topic}-{r.partition} [{r.from_offset}, {r.until_offset})" for r in first)
        more = f" and {len(stretches) - EXAMPLES} more" if len(stretches) > EXAMPLES else ""
        replay = " ".join(f"--range {r.topic}:{r.partition}:{r.from_offset}:{r.until_offset}" for r in first)
        report.problems.append(
            f"{offsets} committed offset(s) of topic {topic} were read from an earlier topic of that name (id "
            f"{', '.join(sorted(ids))}); Kafka's {topic} is id {current[topic]} now, so their rows sit under offsets "
            f"that name other records: {shown}{more}. Replace them with the current topic's records: "
            f"`kafka-ledger replay {report.pipeline} {replay}`"
        )
    if report.unrecorded_topic_id_offsets:
        report.warnings.append(f"{report.unrecorded_topic_id_offsets} committed offsets were read before kafka-ledger "
                               "recorded topic ids: whether their topic was recreated since is not checked")


def _conclude(report: VerifyReport, tally: Tally, pipeline: PipelineConfig) -> None:
    report.kafka_records, report.output_rows, report.dead_letters = (
        tally.kafka_records, tally.output_rows, tally.dead_letters)
    report.missing, report.duplicates, report.unexpected = tally.missing, tally.duplicates, tally.unexpected
    report.outside_committed, report.awaiting_reread = tally.outside, tally.awaiting
    report.compacted_away = tally.compacted_away
    if tally.missing:
        report.problems.append(f"{tally.missing} committed record(s) neither in the output nor in the dead letters: "
                               f"{tally.example_text('missing', tally.missing)}")
    if tally.doubled:
        message = (f"{tally.duplicates} duplicate row(s) for {tally.doubled} record(s): "
                   f"{tally.example_text('doubled', tally.doubled)}")
        if pipeline.delivery_mode == "at_least_once":
            report.warnings.append(message + " (expected after re-deliveries: the pipeline is at_least_once)")
        else:
            report.problems.append(message)
    if tally.compacted_away:
        report.warnings.append(f"{tally.compacted_away} row(s) for records compaction has removed from Kafka since "
                               "they were read (compacted topic): not compared: "
                               f"{tally.example_text('compacted_away', tally.compacted_away)}")
    if tally.unexpected:
        report.problems.append(f"{tally.unexpected} row(s) for offsets that hold no committed record in Kafka: "
                               f"{tally.example_text('unexpected', tally.unexpected)}")
    if tally.outside:
        report.problems.append(f"{tally.outside} row(s) outside every committed read range: "
                               f"{tally.example_text('outside', tally.outside)}")
    if tally.awaiting:
        report.warnings.append(f"{tally.awaiting} row(s) at or past the position (a reset moved it back): "
                               "they are replaced when those offsets are read again")


def deadline_seconds(offsets_to_read: int, timeout: float | None = None) -> float:
    """How long the Kafka read may take: `timeout` if given, else a floor plus time proportional to the work."""
    return timeout if timeout is not None else DEADLINE_FLOOR_SECONDS + offsets_to_read / DEADLINE_OFFSETS_PER_SECOND


def verify_pipeline(
    services: Services, pipeline: PipelineConfig, *, full: bool = False, timeout: float | None = None
) -> VerifyReport:
    """Check the ledger and the published data of one pipeline (incremental unless `full`; see the module).

    Ledger: committed ranges never overlap, they tile each partition from where the pipeline began to
    its position, nothing is committed past a position, and every read range was read from the topic Kafka
    holds under its name now (the topic id its batch recorded). Data (gap-aware, against Kafka): every
    record Kafka holds in a checked read range is in the output or the dead letters exactly once, and
    nothing published lies outside the committed ranges (except rows a backward reset left to be
    replaced when re-read). A verify that completed and found no problem advances the verified point.
    """
    started = time.monotonic()
    report = VerifyReport(pipeline.name, mode="full" if full else "incremental")
    kafka = services.kafka
    with ledger.session(services.ledger) as conn:
        # One snapshot for everything read from Postgres, the streamed rows included.
        conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ, readonly=True)
        with conn:
            with conn.cursor() as cur:
                positions = {r.topic_partition: r for r in ledger.position_rows(cur, pipeline.name)}
                coverage = ledger.coverage(cur, pipeline.name)
                read_topic_ids = ledger.read_coverage_topic_ids(cur, pipeline.name)
                before = ledger.verified_point(cur, pipeline.name)
                cur.execute(sql.SELECT_FINISHED_THROUGH, {"pipeline": pipeline.name})
                finished_through = cur.fetchone()[0]
                after = 0 if full or before is None else before
                cur.execute(sql.SELECT_RANGES_COMMITTED_AFTER, {"pipeline": pipeline.name, "after": after})
                committed_after = cur.fetchall()
                output = sink_for(pipeline).output_view(conn)
                has_output = output.exists()
                stored_partitions = output.partitions() if has_output else set()
                cur.execute(sql.SELECT_DEAD_LETTER_PARTITIONS, {"pipeline": pipeline.name})
                stored_partitions |= {TopicPartition(t, p) for t, p in cur.fetchall()}
            report.partitions = len(positions)
            report.verified_point = {"before": before, "after": before, "advanced": False}
            if not full:
                report.checked_after_batch = after
                report.checked_batches = len({row[0] for row in committed_after})
            _ledger_checks(report, positions, coverage)
            if not output.holds_every_record:
                # Records superseded by a newer one of their key are rightly absent: a record-by-record comparison
                # would call them missing. The verified point stays where it is.
                report.warnings.append("entity table (write: upsert): its rows were not compared with Kafka, only "
                                       "the ledger was checked")
            else:
                _check_data(conn, report, pipeline, output, kafka, full, timeout, positions, coverage,
                            read_topic_ids, committed_after, stored_partitions, has_output)
            _check_mirror(report, pipeline, kafka, positions)
        conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_DEFAULT, readonly=False)
        if report.ok and output.holds_every_record:
            with conn, conn.cursor() as cur:
                cur.execute(sql.ADVANCE_VERIFIED_POINT,
                            {"pipeline": pipeline.name, "batch_id": finished_through, "mode": report.mode})
                point = cur.fetchone()[0]
            report.verified_point = {"before": before, "after": point, "advanced": before is None or point > before}
        with conn, conn.cursor() as cur:
            cur.execute(sql.RECORD_VERIFY_RESULT, {"pipeline": pipeline.name, "mode": report.mode,
                                                   "result": report.result, "problems": len(report.problems)})
    report.seconds = round(time.monotonic() - started, 3)
    services.observer.notify(VerifyFinished(pipeline.name, report.ok, report.mode, report.partitions,
                                            report.kafka_records, len(report.problems), report.seconds))
    return report


def _check_mirror(report: VerifyReport, pipeline: PipelineConfig, kafka: KafkaClient,
                  positions: dict[TopicPartition, ledger.PositionRow]) -> None:
    group = pipeline.mirror_consumer_group
    if not group:
        return
    try:
        report.mirror_differences = consumer_group.mirror_differences(
            kafka, pipeline, {tp: r.position for tp, r in positions.items()})
    except consumer_group.MirrorError as exc:
        report.warnings.append(f"mirror consumer group not checked: {exc}")
        return
    if report.mirror_differences:
        report.warnings.append(f"consumer group {group!r} differs from the ledger (the ledger is authoritative; the "
                               f"next commit rewrites the group): {'; '.join(report.mirror_differences)}")


def _check_data(
    conn: psycopg2.extensions.connection,
    report: VerifyReport,
    pipeline: PipelineConfig,
    output: OutputView,
    kafka: KafkaClient,
    full: bool,
    timeout: float | None,
    positions: dict[TopicPartition, ledger.PositionRow],
    coverage: dict[TopicPartition, list[Coverage]],
    read_topic_ids: list[tuple[OffsetRange, str | None]],
    committed_after: list[tuple[int, str, int, int, int]],
    stored_partitions: set[TopicPartition],
    has_output: bool,
) -> None:
    """Compare Kafka with the stored rows, partition by partition; sets `unverified` if Kafka cannot be read."""
    topics = sorted({tp.topic for tp in coverage})
    # A deadline given bounds the look-ups too (an unreachable Kafka is otherwise waited for 30 s).
    bound = {"timeout": timeout} if timeout is not None else {}
    try:
        offsets = kafka_offsets.partition_offsets(kafka, topics, **bound) if topics else {}
        compacted = kafka_offsets.compacted_topics(kafka, topics, **bound)
        current_ids = kafka_offsets.topic_ids(kafka, topics, **bound)
    except (PlanError, KafkaException) as exc:
        report.unverified = f"cannot read the committed topics back from Kafka: {exc}"
        return
    _unverifiable(report, coverage, offsets)
    _identity_checks(report, read_topic_ids, current_ids)

    new_spans: dict[TopicPartition, list[Span]] = {}
    for _, topic, partition, lo, hi in committed_after:
        new_spans.setdefault(TopicPartition(topic, partition), []).append((lo, hi))
    work = []
    for tp in sorted(set(coverage) | set(positions) | stored_partitions | set(new_spans)):
        read = merge_spans((c.from_offset, c.until_offset) for c in coverage.get(tp, []) if c.disposition == "read")
        position = positions[tp].position if tp in positions else None
        checked = read if full else merge_spans(new_spans.get(tp, []))
        # Full: every row of the partition. Incremental: the new batches' ranges, and every offset outside
        # the read ranges (rows there are problems or await a re-read, wherever they are).
        spans = [(0, OPEN_END)] if full else merge_spans(new_spans.get(tp, []) + subtract_spans((0, OPEN_END), read))
        work.append(_PartitionWork(tp, read, position, spans, _kafka_spans(spans, read, offsets.get(tp))))
        report.checked_ranges += [{"topic": tp.topic, "partition": tp.partition, "from": lo, "until": hi}
                                  for lo, hi in checked]
    to_read = sum(hi - lo for w in work for lo, hi in w.kafka_spans)
    deadline = time.monotonic() + deadline_seconds(to_read, timeout)
    tally = Tally()
    consumer = readback.readback_consumer(kafka, **readback.ONE_PARTITION_FETCH) if to_read else None
    check = _Check(tally, conn, pipeline, output, has_output, consumer, offsets, compacted, deadline)
    try:
        for group in _groups(work):
            began, rows_before = time.monotonic(), tally.output_rows + tally.dead_letters
            records_before = tally.kafka_records
            if len(group) == 1 and not _small(group[0]):
                check.partition(group[0])
            else:
                check.together(group)
            if any(w.kafka_spans for w in group):
                seconds = time.monotonic() - began
                records = tally.kafka_records - records_before
                log.info("verify %s %s: %d records compared with %d rows in %.1f s (%d records/s)",
                         pipeline.name, group[0].tp if len(group) == 1 else f"{len(group)} partitions ({group[0].tp} "
                         f"to {group[-1].tp})", records, tally.output_rows + tally.dead_letters - rows_before,
                         seconds, records / seconds if seconds > 0 else 0)
    except TimeoutError as exc:
        report.unverified = (f"{exc} ({deadline_seconds(to_read, timeout):.0f} s for {to_read} offsets; "
                             "give more with --timeout SECONDS)")
        return
    except (KafkaException, readback.KafkaReadError) as exc:
        report.unverified = f"cannot read the committed topics back from Kafka: {exc}"
        return
    finally:
        if consumer is not None:
            consumer.close()
    _conclude(report, tally, pipeline)
