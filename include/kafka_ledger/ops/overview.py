"""What the ledger and Kafka say about a pipeline: the reports behind `kafka-ledger status`, `batches` and the page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaException

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.kafka import headroom
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model import ranges as planning
from kafka_ledger.model.ranges import Coverage, PartitionOffsets, TopicPartition

# How much of a dead letter's key or value a report shows: enough to recognise it, never a whole payload.
SHOWN_BYTES = 300


def freshness(lag: int | None, newest_published: datetime | None, oldest_waiting: datetime | None,
              now: datetime) -> dict[str, float | None]:
    """How fresh a partition's output is: the age of its newest published record (now minus its Kafka timestamp),
    and its lag in seconds: how long the oldest record not yet published has waited (now minus its Kafka
    timestamp; 0 when nothing waits, unknown when that record's timestamp could not be read)."""
    age = (now - newest_published).total_seconds() if newest_published else None
    if lag == 0:
        lag_seconds: float | None = 0.0
    elif oldest_waiting:
        lag_seconds = max(0.0, (now - oldest_waiting).total_seconds())
    else:
        lag_seconds = None
    return {"age_seconds": None if age is None else round(age, 1),
            "lag_seconds": None if lag_seconds is None else round(lag_seconds, 1)}


def partition_report(
    pipeline: PipelineConfig,
    offsets: dict[TopicPartition, PartitionOffsets],
    rows: dict[TopicPartition, ledger.PositionRow],
    coverage: dict[TopicPartition, list[Coverage]],
    margins: dict[TopicPartition, headroom.Headroom] | None = None,
    oldest_waiting: dict[TopicPartition, datetime] | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Per partition: committed position, log start, end offset, lag (in offsets and in seconds), the newest
    published record's Kafka timestamp and age, skipped and lost offsets, retention headroom. `oldest_waiting`: the
    Kafka timestamp of the first record at or after each lagging partition's position."""
    partitions = []
    margins, oldest_waiting, now = margins or {}, oldest_waiting or {}, now or datetime.now(UTC)
    lags = planning.partition_lag({tp: row.position for tp, row in rows.items()}, offsets, pipeline.start_position)
    for tp in sorted(set(offsets) | set(rows)):
        row, kafka = rows.get(tp), offsets.get(tp)
        skipped = sum(c.until_offset - c.from_offset for c in coverage.get(tp, []) if c.disposition == "skipped")
        lag = lags.get(tp)
        lost = max(0, kafka.log_start - row.position) if row and kafka else 0
        margin = margins.get(tp)
        partitions.append({
            "topic": tp.topic, "partition": tp.partition, "position": row.position if row else None,
            "log_start": kafka.log_start if kafka else None, "end_offset": kafka.end if kafka else None,
            "lag": lag, "newest_published_at": row.newest_timestamp if row else None,
            **freshness(lag, row.newest_timestamp if row else None, oldest_waiting.get(tp), now),
            "skipped_offsets": skipped, "in_kafka": kafka is not None, "lost_offsets": lost,
            "last_batch_id": row.last_batch_id if row else None,
            "headroom": margin.as_dict() if margin else None,
            "note": ("not in Kafka" if kafka is None else
                     f"LOST {lost} offsets (retention)" if lost else
                     "not read yet" if row is None else
                     f"RETENTION HEADROOM LOW: {headroom.duration(margin.seconds)} left" if margin and margin.low else
                     ""),
        })
    return partitions


@dataclass(frozen=True)
class _Held:
    """What the ledger holds of one pipeline for its status."""

    rows: dict[TopicPartition, ledger.PositionRow]
    coverage: dict[TopicPartition, list[Coverage]]
    unfinished: list[ledger.Batch]
    log_start_rates: dict[TopicPartition, float]


def pipeline_status(services: Services, pipeline: PipelineConfig, tolerate_kafka: bool = False) -> dict[str, Any]:
    """The pipeline's partitions (position, log start, end offset, lag) and its unfinished batches (pipelines_status).
    """
    (status,) = pipelines_status(services, [pipeline], tolerate_kafka)
    return status


def pipelines_status(services: Services, pipelines: list[PipelineConfig],
                     tolerate_kafka: bool = False) -> list[dict[str, Any]]:
    """Each pipeline's partitions (position, log start, end offset, lag) and its unfinished batches, looked up for
    them all at once: Kafka's offsets, the topics' retention and the oldest waiting records' timestamps in one
    request each, the ledger in one transaction. Two hundred pipelines one by one took 16 s.

    tolerate_kafka: Kafka unreachable (or a subscribed topic missing) is reported in a status's `kafka_error`, with
    the ledger's figures only, instead of raised.
    """
    offsets: dict[str, dict[TopicPartition, PartitionOffsets]] = {p.name: {} for p in pipelines}
    kafka_errors: dict[str, str] = {}
    try:
        found, kafka_errors = kafka_offsets.pipelines_offsets(services.kafka, pipelines)
        offsets.update(found)
    except planning.PlanError as exc:  # Kafka unreachable
        if not tolerate_kafka:
            raise
        kafka_errors = dict.fromkeys(offsets, str(exc))
    if kafka_errors and not tolerate_kafka:  # a subscribed topic missing
        raise planning.PlanError(next(iter(kafka_errors.values())))
    with ledger.transaction(services.ledger) as cur:
        rows = ledger.pipelines_position_rows(cur, [p.name for p in pipelines])
        held = {p.name: _Held(rows[p.name], ledger.coverage(cur, p.name), ledger.in_flight_batches(cur, p.name),
                              ledger.log_start_rates(cur, p.name)) for p in pipelines}
    # The oldest waiting record of each lagging partition (one small fetch each): its lag in seconds, and its
    # retention headroom.
    waiting = {p.name: planning.unread_positions({tp: r.position for tp, r in rows[p.name].items()},
                                                 offsets[p.name]) for p in pipelines}
    stamps: dict[str, dict[TopicPartition, int]] = {name: {} for name in waiting}
    freshness_error = None
    try:
        found = kafka_offsets.position_timestamps(
            services.kafka, {wait for positions in waiting.values() for wait in positions.items()})
        stamps = {name: {tp: found[tp, at] for tp, at in positions.items() if (tp, at) in found}
                  for name, positions in waiting.items()}
    except (planning.PlanError, KafkaException) as exc:  # a lag in seconds is worth a report, not a failure
        freshness_error = f"lag in seconds unknown: {exc}"
    retention: dict[str, headroom.Retention] = {}
    retention_error = None
    try:
        retention = headroom.topics_retention(
            services.kafka, sorted({tp.topic for name in offsets for tp in offsets[name]}))
    except (planning.PlanError, KafkaException) as exc:
        retention_error = str(exc)
    statuses = []
    for pipeline in pipelines:
        figures = held[pipeline.name]
        found_offsets = offsets[pipeline.name]
        margins, headroom_error = {}, None
        if found_offsets:
            if retention_error:
                headroom_error = f"retention headroom of {pipeline.name} not computed: {retention_error}"
            else:
                margins = {TopicPartition(h.topic, h.partition): h for h in headroom.assess_all(
                    pipeline, {tp: r.position for tp, r in figures.rows.items()}, found_offsets, retention,
                    figures.log_start_rates, stamps[pipeline.name])}
        statuses.append(_status(pipeline, found_offsets, figures.rows, figures.coverage, figures.unfinished, margins,
                                stamps[pipeline.name], kafka_errors.get(pipeline.name), headroom_error,
                                freshness_error))
    return statuses


def _status(pipeline: PipelineConfig, offsets: dict[TopicPartition, PartitionOffsets],
            rows: dict[TopicPartition, ledger.PositionRow], coverage: dict[TopicPartition, list[Coverage]],
            unfinished: list[Any], margins: dict[TopicPartition, headroom.Headroom], stamps: dict[TopicPartition, int],
            kafka_error: str | None, headroom_error: str | None, freshness_error: str | None) -> dict[str, Any]:
    partitions = partition_report(pipeline, offsets, rows, coverage, margins,
                                  {tp: datetime.fromtimestamp(ms / 1000, UTC) for tp, ms in stamps.items()})
    known = [p["lag_seconds"] for p in partitions if p["lag_seconds"] is not None]
    published = [p["newest_published_at"] for p in partitions if p["newest_published_at"] is not None]
    return {
        "pipeline": pipeline.name, "dag_id": pipeline.dag_id, "delivery_mode": pipeline.delivery_mode,
        "write": pipeline.write, "key": pipeline.key, "subscription": pipeline.subscription,
        "lag": None if kafka_error else sum(p["lag"] or 0 for p in partitions),
        # The pipeline's freshness: its furthest-behind partition, and its newest published record.
        "lag_seconds": max(known) if known and len(known) == len(partitions) else None,
        "newest_published_at": max(published) if published else None,
        "kafka_error": kafka_error, "headroom_error": headroom_error, "freshness_error": freshness_error,
        "partitions": partitions,
        "retention_warning": headroom.warning(pipeline, list(margins.values())),
        "unfinished_batches": [{"batch_id": b.batch_id, "kind": b.kind, "status": b.status,
                                "attempts": b.attempts, "last_error": b.last_error} for b in unfinished],
    }


# Partitions a status shows at once (kafka-ledger status, the pipeline's page): a pipeline over 10,000 partitions
# reads as pages of them, its totals and most-behind partitions above.
PARTITIONS_PER_PAGE = 100
MOST_BEHIND = 5


class PageError(ValueError):
    """A page of partitions that the status does not have."""


def partition_page(status: dict[str, Any], page: int = 1, size: int | None = PARTITIONS_PER_PAGE) -> dict[str, Any]:
    """The status with one page of its partitions in topic and partition order (`size` None: all of them), the
    page's number, how many pages and partitions there are, how many lag, and the most behind of them all."""
    partitions = status["partitions"]
    size = size or max(1, len(partitions))
    pages = max(1, -(-len(partitions) // size))
    if not 1 <= page <= pages:
        raise PageError(f"page {page} does not exist: {status['pipeline']} has {len(partitions)} partition(s), "
                        f"{pages} page(s) of {size}")
    lagging = [p for p in partitions if p["lag"]]
    behind = sorted(lagging, key=lambda p: (-(p["lag_seconds"] or 0.0), -p["lag"], p["topic"], p["partition"]))
    return {**status, "partitions": partitions[(page - 1) * size:page * size], "page": page, "pages": pages,
            "partitions_total": len(partitions), "partitions_lagging": len(lagging),
            "most_behind": [{"topic": p["topic"], "partition": p["partition"], "lag": p["lag"],
                             "lag_seconds": p["lag_seconds"]} for p in behind[:MOST_BEHIND]]}


def batch_summary(b: ledger.Batch) -> dict[str, Any]:
    """A batch as reports show it: what it is for, its counts and timings, its Airflow run and its ranges."""
    summary = {
        "batch_id": b.batch_id, "pipeline": b.pipeline, "kind": b.kind, "status": b.status,
        "attempts": b.attempts, "replay_of": b.replay_of, "requested_by": b.requested_by, "reason": b.reason,
        "window_start": b.window_start, "window_end": b.window_end, "dag_id": b.dag_id, "run_id": b.run_id,
        "planned_at": b.planned_at, "written_at": b.written_at, "committed_at": b.committed_at,
        "records_read": b.records_read, "records_written": b.records_written,
        "records_dead_lettered": b.records_dead_lettered, "read_seconds": b.read_seconds,
        "commit_seconds": b.commit_seconds, "last_error": b.last_error, "snapshot_id": b.snapshot_id,
        "offsets": sum(r.span for r in b.ranges),
        "ranges": [r.as_dict() for r in b.ranges],
    }
    summary["rewrites"] = rewrites(summary)
    return summary


def rewrites(summary: dict[str, Any]) -> str | None:
    """What a rewrite batch re-reads, in words (None for a catch-up): the batch it replays, its window, its ranges."""
    if summary["kind"] == "catch_up":
        return None
    if summary["replay_of"] is not None:
        return f"batch {summary['replay_of']}"
    if summary["window_start"] is not None:
        return f"{summary['window_start']:%Y-%m-%d %H:%M} to {summary['window_end']:%Y-%m-%d %H:%M}"
    ranges = summary["ranges"]
    if not ranges:
        return None
    first = ranges[0]
    more = f" and {len(ranges) - 1} more" if len(ranges) > 1 else ""
    return f"{first['topic']}-{first['partition']} [{first['from']}, {first['until']}){more}"


def batch_detail(cur: ledger.Cursor, pipeline: str, batch_id: int) -> dict[str, Any]:
    """A batch of the pipeline with, per range, the records its Spark job read and the partition's end offset when
    planned."""
    summary = batch_summary(ledger.pipeline_batch(cur, pipeline, batch_id))
    cur.execute(sql.SELECT_RANGE_END_OFFSETS, {"batch_id": batch_id})
    extra = {(topic, partition): (end, read) for topic, partition, end, read in cur.fetchall()}
    for r in summary["ranges"]:
        r["end_offset_when_planned"], r["records_read"] = extra.get((r["topic"], r["partition"]), (None, None))
    return summary


def batch_history(cur: ledger.Cursor, pipeline: str, limit: int = 50) -> list[dict[str, Any]]:
    """The newest batches, oldest first: counts and the lag each catch-up found when planned (for charts)."""
    cur.execute(sql.SELECT_BATCH_HISTORY, {"pipeline": pipeline, "limit": limit})
    names = ("batch_id", "kind", "status", "planned_at", "committed_at", "records_read", "records_written",
             "records_dead_lettered", "lag_when_planned")
    return [dict(zip(names, row, strict=True)) for row in reversed(cur.fetchall())]


def shown_bytes(data: bytes | memoryview | None) -> str | None:
    """A key or value as text a person can read: UTF-8 where it is, escapes elsewhere, cut at SHOWN_BYTES."""
    if data is None:
        return None
    raw = bytes(data)
    text = raw[:SHOWN_BYTES].decode("utf-8", "backslashreplace")
    return text + (f"… ({len(raw)} bytes)" if len(raw) > SHOWN_BYTES else "")


def dead_letter_groups(cur: ledger.Cursor, pipeline: str, limit: int = 20, samples: int = 3) -> list[dict[str, Any]]:
    """Dead letters by reason, most frequent first, with the first few records of each."""
    cur.execute(sql.SELECT_DEAD_LETTER_GROUPS, {"pipeline": pipeline, "limit": limit})
    groups = {reason: {"reason": reason, "count": count, "first_at": first, "last_at": last, "samples": []}
              for reason, count, first, last in cur.fetchall()}
    cur.execute(sql.SELECT_DEAD_LETTER_SAMPLES, {"pipeline": pipeline, "samples": samples})
    for reason, topic, partition, offset, timestamp, key, value, batch_id in cur.fetchall():
        if reason in groups:
            groups[reason]["samples"].append({
                "topic": topic, "partition": partition, "offset": offset, "timestamp": timestamp,
                "key": shown_bytes(key), "value": shown_bytes(value), "batch_id": batch_id,
            })
    return list(groups.values())


def recent_resets(cur: ledger.Cursor, pipeline: str, limit: int = 20) -> list[dict[str, Any]]:
    """The reset audit, newest first: who moved which positions, when, why, and what they abandoned."""
    cur.execute(sql.SELECT_RESETS, {"pipeline": pipeline, "limit": limit})
    names = ("reset_id", "requested_by", "requested_at", "reason", "target", "partitions", "abandoned_batches")
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def instant(value: datetime | None) -> str:
    """A Kafka timestamp in a report's cell: to the second, in UTC."""
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}" if value else "-"


def iso(value: Any) -> Any:
    """json.dumps' `default` for reports: datetimes as ISO 8601 text, anything else JSON lacks as its text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)
