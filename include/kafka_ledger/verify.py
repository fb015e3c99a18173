"""Ledger invariants and exactly-once accounting of a pipeline, checked against Kafka itself."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg2.extensions

from kafka_ledger import audit, kafka_offsets, ledger, sql
from kafka_ledger.config import PipelineConfig
from kafka_ledger.planning import Coverage, PlanError, TopicPartition, coverage_problems

RecordId = tuple[str, int, int]


@dataclass
class VerifyReport:
    """Everything verify found for one pipeline; `ok` is False when any problem was found."""

    pipeline: str
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
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


class _Coverage:
    """Fast membership of offsets in one partition's coverage."""

    def __init__(self, ranges: list[Coverage]):
        self.ranges = sorted(ranges, key=lambda c: c.from_offset)
        self.starts = [c.from_offset for c in self.ranges]

    def find(self, offset: int) -> Coverage | None:
        i = bisect.bisect_right(self.starts, offset) - 1
        if i >= 0 and offset < self.ranges[i].until_offset:
            return self.ranges[i]
        return None


def _examples(ids: list[RecordId], limit: int = 5) -> str:
    shown = ", ".join(f"{t}-{p}@{o}" for t, p, o in sorted(ids)[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def verify_pipeline(dsn: str, bootstrap_servers: str, pipeline: PipelineConfig) -> VerifyReport:
    """Check the ledger and the published data of one pipeline.

    Ledger: committed ranges never overlap, they tile each partition from where the pipeline began to
    its position, and nothing is committed past a position. Data (gap-aware, against Kafka): every
    record Kafka holds in a committed read range is in the output or the dead letters exactly once,
    and nothing published lies outside the committed ranges (except rows a backward reset left to be
    replaced when re-read).
    """
    report = VerifyReport(pipeline.name)
    conn = ledger.connect(dsn)
    try:
        conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ, readonly=True)
        with conn, conn.cursor() as cur:
            rows = ledger.position_rows(cur, pipeline.name)
            coverage = ledger.coverage(cur, pipeline.name)
            cur.execute(sql.SELECT_TABLE_COLUMNS, {"schema": pipeline.output_schema, "table": pipeline.output_table})
            has_output = cur.fetchone() is not None
            stored = audit.record_ids(cur, pipeline) if has_output else audit.PostgresRecords([], [])
    finally:
        conn.close()

    positions = {r.topic_partition: r for r in rows}
    report.partitions = len(rows)
    for tp, row in sorted(positions.items()):
        report.problems += coverage_problems(tp, coverage.get(tp, []), row.start_offset, row.position)
    for tp in sorted(set(coverage) - set(positions)):
        report.problems.append(f"{tp}: committed ranges without a position")
    for ranges in coverage.values():
        report.committed_offsets += sum(c.until_offset - c.from_offset for c in ranges if c.disposition == "read")
        report.skipped_offsets += sum(c.until_offset - c.from_offset for c in ranges if c.disposition == "skipped")
    if report.skipped_offsets:
        report.warnings.append(f"{report.skipped_offsets} offsets were skipped on purpose (latest_only or a reset)")

    report.output_rows, report.dead_letters = len(stored.output), len(stored.dead_letters)
    topics = sorted({tp.topic for tp in coverage})
    try:
        offsets = kafka_offsets.partition_offsets(bootstrap_servers, topics) if topics else {}
        produced = audit.kafka_record_ids(bootstrap_servers, topics, offsets=offsets) if topics else set()
        compacted = kafka_offsets.compacted_topics(bootstrap_servers, topics)
    except PlanError as exc:
        report.problems.append(f"cannot read the committed topics back from Kafka: {exc}")
        return report
    lookup = {tp: _Coverage(ranges) for tp, ranges in coverage.items()}

    def read_range(rid: RecordId) -> Coverage | None:
        index = lookup.get(TopicPartition(rid[0], rid[1]))
        c = index.find(rid[2]) if index else None
        return c if c is not None and c.disposition == "read" else None

    # Offsets Kafka has deleted since they were committed can no longer be compared.
    for tp, ranges in coverage.items():
        log_start = offsets[tp].log_start if tp in offsets else None
        for c in ranges:
            if c.disposition == "read":
                if log_start is None:
                    report.unverifiable_offsets += c.until_offset - c.from_offset
                else:
                    report.unverifiable_offsets += max(0, min(c.until_offset, log_start) - c.from_offset)
    if report.unverifiable_offsets:
        report.warnings.append(f"{report.unverifiable_offsets} committed offsets are no longer in Kafka "
                               "(retention or a deleted topic): not compared")

    expected = {rid for rid in produced if read_range(rid) is not None}
    report.kafka_records = len(expected)
    seen = Counter(stored.output) + Counter(stored.dead_letters)
    missing = sorted(expected - set(seen))
    report.missing = len(missing)
    if missing:
        report.problems.append(f"{len(missing)} committed record(s) neither in the output nor in the dead letters: "
                               f"{_examples(missing)}")
    doubled = sorted(rid for rid, n in seen.items() if n > 1)
    report.duplicates = sum(seen[rid] - 1 for rid in doubled)
    if doubled:
        message = f"{report.duplicates} duplicate row(s) for {len(doubled)} record(s): {_examples(doubled)}"
        if pipeline.delivery_mode == "at_least_once":
            report.warnings.append(message + " (expected after re-deliveries: the pipeline is at_least_once)")
        else:
            report.problems.append(message)
    unexpected, compacted_away, outside, awaiting = [], [], [], []
    for rid in seen:
        tp = TopicPartition(rid[0], rid[1])
        if read_range(rid) is not None:
            if rid not in produced and tp in offsets and rid[2] >= offsets[tp].log_start:
                # A compacted topic drops older records of a key after they were read: not a problem.
                (compacted_away if rid[0] in compacted else unexpected).append(rid)
        elif tp in positions and rid[2] >= positions[tp].position:
            awaiting.append(rid)
        else:
            outside.append(rid)
    report.unexpected, report.outside_committed, report.awaiting_reread = len(unexpected), len(outside), len(awaiting)
    report.compacted_away = len(compacted_away)
    if compacted_away:
        report.warnings.append(f"{len(compacted_away)} row(s) for records compaction has removed from Kafka since "
                               f"they were read (compacted topic): not compared: {_examples(sorted(compacted_away))}")
    if unexpected:
        report.problems.append(f"{len(unexpected)} row(s) for offsets that hold no committed record in Kafka: "
                               f"{_examples(unexpected)}")
    if outside:
        report.problems.append(f"{len(outside)} row(s) outside every committed read range: {_examples(outside)}")
    if awaiting:
        report.warnings.append(f"{len(awaiting)} row(s) at or past the position (a reset moved it back): "
                               "they are replaced when those offsets are read again")
    return report
