"""Position resets: move a pipeline's committed positions deliberately, with a dry run and an audit trail."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from kafka_ledger.batch.columns import with_recorded_columns_or_none
from kafka_ledger.batch.plan import compare_topic_ids
from kafka_ledger.batch.requests import RequestError, as_utc
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient, Services
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model.ranges import (
    Coverage,
    OffsetRange,
    PartitionOffsets,
    PositionChange,
    TopicPartition,
    plan_reset,
    truncate_coverage,
)
from kafka_ledger.sinks import sink_for

log = logging.getLogger(__name__)

Target = Literal["earliest", "latest"] | datetime | dict[TopicPartition, int]


def describe_target(target: Target) -> str:
    if isinstance(target, datetime):
        return f"datetime {as_utc(target).isoformat()}"
    if isinstance(target, dict):
        return "offsets " + ", ".join(f"{tp}={offset}" for tp, offset in sorted(target.items()))
    return target


@dataclass(frozen=True)
class ResetResult:
    """What a reset changes (or changed), partition by partition."""

    pipeline: str
    target: str
    changes: list[PositionChange]
    blocking_batches: list[int]
    dry_run: bool
    reset_id: int | None = None
    abandoned_batches: list[int] = field(default_factory=list)
    # {topic: (the id the ledger was anchored to, the id Kafka's topic has now)}: a recreated topic re-anchored.
    reanchored: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Read stretches of a re-anchored topic the reset leaves below the positions: their rows are the earlier
    # topic's records under offsets that name other records now, until read again.
    kept_from_earlier_topic: list[OffsetRange] = field(default_factory=list)

    @property
    def skipped_offsets(self) -> int:
        return sum(c.skipped.span for c in self.changes if c.skipped)

    @property
    def reread_offsets(self) -> int:
        return sum(c.reread.span for c in self.changes if c.reread)

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "target": self.target, "dry_run": self.dry_run, "reset_id": self.reset_id,
            "skipped_offsets": self.skipped_offsets, "reread_offsets": self.reread_offsets,
            "blocking_batches": self.blocking_batches, "abandoned_batches": self.abandoned_batches,
            "partitions": [change_dict(c) for c in self.changes],
            "reanchored": self.reanchored_ids(),
            "kept_from_earlier_topic": [r.as_dict() for r in self.kept_from_earlier_topic],
        }

    def reanchored_ids(self) -> dict[str, dict[str, str]]:
        """{topic: {"before": id, "after": id}}: the form of the audit row and of --json."""
        return {topic: {"before": before, "after": after} for topic, (before, after) in sorted(self.reanchored.items())}


def change_dict(c: PositionChange) -> dict[str, Any]:
    return {
        "topic": c.topic, "partition": c.partition, "before": c.before, "after": c.after,
        "skipped": [c.skipped.from_offset, c.skipped.until_offset] if c.skipped else None,
        "reread": [c.reread.from_offset, c.reread.until_offset] if c.reread else None,
    }


def resolve_targets(
    kafka: KafkaClient, target: Target, offsets: dict[TopicPartition, PartitionOffsets]
) -> dict[TopicPartition, int]:
    """Target offset of each partition: explicit offsets are taken as given (validated later)."""
    if isinstance(target, dict):
        return dict(target)
    if target == "earliest":
        return {tp: o.log_start for tp, o in offsets.items()}
    if target == "latest":
        return {tp: o.end for tp, o in offsets.items()}
    found = kafka_offsets.offsets_for_time(kafka, sorted(offsets), int(as_utc(target).timestamp() * 1000))
    return {tp: offsets[tp].end if offset is None else offset for tp, offset in found.items()}


def reset_positions(
    services: Services,
    pipeline: PipelineConfig,
    target: Target,
    *,
    requested_by: str,
    reason: str,
    dry_run: bool = True,
    abandon_open_batches: bool = False,
) -> ResetResult:
    """Move positions to `target`; in one transaction with the audit row, or only describe it (dry run).

    Offsets jumped over are recorded as skipped; offsets a backward move makes read again are
    uncommitted and their rows are replaced when re-read. Unfinished batches block a reset unless
    they are abandoned explicitly (their ranges start at the old positions).
    """
    if not dry_run and not reason.strip():
        raise RequestError("a reset needs a reason (it is recorded in the audit table)")
    with ledger.session(services.ledger) as conn:
        with ledger.pipeline_transaction(conn, pipeline.name) as cur:
            # A pipeline that takes its columns from its reader schema and was never planned has no table yet.
            prepared = with_recorded_columns_or_none(cur, pipeline)
            if prepared is not None:
                sink_for(prepared).prepare(cur)
            offsets = kafka_offsets.subscribed_offsets(services.kafka, pipeline)
            # A reset is how a recreated topic is re-anchored: the new positions refer to the topic Kafka has now.
            unseen, reanchored = compare_topic_ids(cur, services.kafka, pipeline, {tp.topic for tp in offsets})
            positions = ledger.positions(cur, pipeline.name)
            changes = plan_reset(positions, resolve_targets(services.kafka, target, offsets), offsets)
            blocking = [b.batch_id for b in ledger.in_flight_batches(cur, pipeline.name)]
            coverage = ledger.coverage(cur, pipeline.name)
            kept = _kept_from_earlier_topic(coverage, changes, set(reanchored))
            result = ResetResult(pipeline.name, describe_target(target), changes, blocking, dry_run,
                                 reanchored=reanchored, kept_from_earlier_topic=kept)
            if dry_run:
                conn.rollback()
                return result
            if blocking and not abandon_open_batches:
                raise RequestError(
                    f"batch(es) {', '.join(map(str, blocking))} of {pipeline.name} "
                    "are unfinished and start at the current positions; let them finish (next run, or "
                    "`kafka-ledger replay`) or abandon them with --abandon-open-batches"
                )
            abandoned = _abandon(cur, pipeline.name, blocking)
            cur.execute(
                sql.INSERT_RESET,
                {"pipeline": pipeline.name, "requested_by": requested_by, "reason": reason,
                 "target": result.target, "partitions": json.dumps([change_dict(c) for c in changes]),
                 "abandoned_batches": abandoned,
                 "topic_ids": json.dumps(result.reanchored_ids())},
            )
            reset_id = cur.fetchone()[0]
            ledger.anchor_topics(cur, pipeline.name, {**unseen, **{t: after for t, (_, after) in reanchored.items()}})
            for c in changes:
                tp = TopicPartition(c.topic, c.partition)
                if c.reread:
                    removed, added = truncate_coverage(coverage.get(tp, []), c.after)
                    ledger.replace_coverage(cur, pipeline.name, tp, removed, added)
                elif c.skipped:
                    ledger.replace_coverage(
                        cur, pipeline.name, tp, [], [Coverage(c.before, c.after, "skipped", reset_id=reset_id)]
                    )
                cur.execute(sql.UPSERT_POSITION, {"pipeline": pipeline.name, "topic": c.topic,
                                                  "partition": c.partition, "position": c.after})
        result = ResetResult(pipeline.name, result.target, changes, blocking, False, reset_id, abandoned, reanchored,
                             kept)
        log.warning(
            "reset %s of %s to %s by %s (%s): %d offsets skipped, %d offsets to be read again%s%s",
            reset_id, pipeline.name, result.target, requested_by, reason, result.skipped_offsets,
            result.reread_offsets, f", abandoned batches {abandoned}" if abandoned else "",
            "".join(f", topic {t} re-anchored from id {b} to {a}" for t, (b, a) in sorted(reanchored.items())),
        )
        return result


def _kept_from_earlier_topic(
    coverage: dict[TopicPartition, list[Coverage]], changes: list[PositionChange], reanchored: set[str]
) -> list[OffsetRange]:
    """The read stretches of re-anchored topics that stay below the positions after the reset."""
    after = {TopicPartition(c.topic, c.partition): c.after for c in changes}
    kept = []
    for tp, stretches in sorted(coverage.items()):
        if tp.topic not in reanchored:
            continue
        for c in stretches:
            until = min(c.until_offset, after.get(tp, c.until_offset))
            if c.disposition == "read" and c.from_offset < until:
                kept.append(OffsetRange(tp.topic, tp.partition, c.from_offset, until))
    return kept


def _abandon(cur: ledger.Cursor, pipeline: str, batch_ids: list[int]) -> list[int]:
    if not batch_ids:
        return []
    cur.execute(sql.ABANDON_UNFINISHED_BATCHES, {"pipeline": pipeline, "error": "abandoned by a position reset"})
    return sorted(row[0] for row in cur.fetchall())
