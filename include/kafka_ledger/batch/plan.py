"""Planning a batch: resume the unfinished one, or record the next exact ranges in the ledger before any read."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from kafka_ledger.batch.columns import with_columns_taken
from kafka_ledger.batch.requests import BatchRequest, RequestError
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient, Services
from kafka_ledger.formats.known import value_format
from kafka_ledger.kafka import headroom
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import (
    LostDataError,
    OffsetRange,
    PartitionOffsets,
    TopicIdentityError,
    TopicPartition,
    backlog,
    check_rewrite_ranges,
    join_consecutive,
    lost_ranges,
    plan_latest_ranges,
    plan_ranges,
    start_positions,
    topic_identity,
    window_ranges,
)
from kafka_ledger.observe import failpoints
from kafka_ledger.observe.events import BatchPlanned
from kafka_ledger.sinks import sink_for

log = logging.getLogger(__name__)
# How many new partitions the plan names in its log line (their start offsets).
NEW_PARTITIONS_NAMED = 20


@dataclass(frozen=True)
class PlannedBatch:
    """What the plan step decided: a batch to read (new or resumed), or nothing to do."""

    batch_id: int | None
    resumed: bool
    ranges: list[OffsetRange]
    backlog_after: int  # offsets still unread after this batch (gaps included): > 0 means "run again"
    kind: str = "catch_up"
    pending: list[OffsetRange] = field(default_factory=list)  # a window's offsets not ingested yet
    dry_run: bool = False
    # Each partition's margin before retention deletes its oldest unread offset (None: could not be looked up).
    headroom: list[headroom.Headroom] | None = None
    # What the plan decided, in words (the window, the batch replayed, a resumed batch's status).
    detail: str = ""

    @property
    def offsets(self) -> int:
        return sum(r.span for r in self.ranges)

    @property
    def skipped(self) -> int:
        return sum(r.from_offset - r.skipped_from for r in self.ranges if r.skipped_from is not None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id, "kind": self.kind, "resumed": self.resumed, "dry_run": self.dry_run,
            "offsets": self.offsets, "skipped_offsets": self.skipped, "backlog_after": self.backlog_after,
            "ranges": [r.as_dict() for r in self.ranges], "pending": [r.as_dict() for r in self.pending],
            "headroom": None if self.headroom is None else [h.as_dict() for h in self.headroom],
        }


def _format_ranges(ranges: list[OffsetRange]) -> str:
    return "\n".join(f"  {r.describe()}" for r in ranges)


def plan_next_batch(
    services: Services,
    pipeline: PipelineConfig,
    dag_id: str | None = None,
    run_id: str | None = None,
) -> PlannedBatch:
    """Resume the pipeline's unfinished batch, or record the next capped batch before anything is read."""
    return plan_batch(services, pipeline, BatchRequest(), dag_id=dag_id, run_id=run_id)


def plan_batch(
    services: Services,
    pipeline: PipelineConfig,
    request: BatchRequest | None = None,
    *,
    dag_id: str | None = None,
    run_id: str | None = None,
    requested_by: str | None = None,
    backfill_window: tuple[datetime, datetime] | None = None,
    dry_run: bool = False,
    carrying: bool = False,
    view: kafka_offsets.SubscriptionView | None = None,
) -> PlannedBatch:
    """Record the batch a run will read (or find the one to resume), BEFORE anything is read.

    `request` says what to read (catch_up by default); `backfill_window` makes this an Airflow backfill
    run of that data interval. With `dry_run` the same decisions are made and logged, then rolled back.
    `carrying`: the next batch of a run that carries batch after batch (batch/carry.py): a catch-up batch, never
    the replay a cleared run gets, and no retention look-up (the run's first plan made it).
    `view`: what Kafka said of the subscription just before (a carrier looks up all its members' at once); without
    it, Kafka is asked here.
    Invalid requests raise RequestError and write nothing.
    """
    request = request or BatchRequest()
    kafka = services.kafka
    started = time.monotonic()
    with ledger.session(services.ledger) as conn:
        with ledger.pipeline_transaction(conn, pipeline.name) as cur:
            offsets = view.offsets if view is not None else kafka_offsets.subscribed_offsets(kafka, pipeline)
            pipeline = with_columns_taken(cur, services, pipeline, sorted({tp.topic for tp in offsets}))
            sink_for(pipeline).prepare(cur)
            planned = _plan(cur, services, pipeline, offsets, request, dag_id, run_id, requested_by, backfill_window,
                            carrying, None if view is None else view.topic_ids)
            ledger.observe_log_starts(cur, pipeline.name, {tp: o.log_start for tp, o in offsets.items()})
            positions = ledger.positions(cur, pipeline.name)
            rates = ledger.log_start_rates(cur, pipeline.name)
            if dry_run:
                conn.rollback()
                planned = replace(planned, dry_run=True, batch_id=None if not planned.resumed else planned.batch_id)
        if planned.batch_id is not None:
            services.observer.notify(BatchPlanned(
                pipeline.name, planned.batch_id, planned.kind, planned.resumed, len(planned.ranges), planned.offsets,
                planned.backlog_after, tuple(r.describe() for r in planned.ranges),
                planned.detail + (" (dry run: nothing recorded)" if planned.dry_run else ""),
                seconds=time.monotonic() - started))
        failpoints.hit("after_plan")
    if carrying:
        return planned
    return replace(planned, headroom=_headroom(kafka, pipeline, positions, offsets, rates))


def _headroom(
    kafka: KafkaClient,
    pipeline: PipelineConfig,
    positions: dict[TopicPartition, int],
    offsets: dict[TopicPartition, PartitionOffsets],
    rates: dict[TopicPartition, float],
) -> list[headroom.Headroom] | None:
    """Retention headroom as of this plan, logged; after the plan is recorded and its lock released, and never
    failing it (the headroom only warns)."""
    found, error = headroom.look_up(kafka, pipeline, positions, offsets, rates)
    if error:
        log.warning(error)
    else:
        headroom.log_headroom(pipeline, found)
    return found


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def compare_topic_ids(
    cur: ledger.Cursor, kafka: KafkaClient, pipeline: PipelineConfig, topics: set[str],
    current: dict[str, str] | None = None,
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Kafka's ids of `topics` (`current`: looked up already) against the ledger's anchors: (unseen topics' ids,
    {topic: (anchored, current)})."""
    if current is None:
        current = kafka_offsets.topic_ids(kafka, sorted(topics))
    else:
        current = {topic: found for topic, found in current.items() if topic in topics}
    return topic_identity(ledger.topic_anchors(cur, pipeline.name), current)


def _check_topic_identity(
    cur: ledger.Cursor,
    kafka: KafkaClient,
    pipeline: PipelineConfig,
    offsets: dict[TopicPartition, PartitionOffsets],
    topic_ids: dict[str, str] | None = None,
) -> None:
    """Refuse when a topic's Kafka id is not the one the ledger anchored; anchor topics met for the first time.

    Before positions are read or a batch resumed: offsets of a recreated topic name other records, so neither
    the next ranges nor an unfinished batch's recorded ones may be read from it.
    """
    unseen, changed = compare_topic_ids(cur, kafka, pipeline, {tp.topic for tp in offsets}, topic_ids)
    if changed:
        raise TopicIdentityError(pipeline.name, changed)
    if unseen:
        ledger.anchor_topics(cur, pipeline.name, unseen)
        log.info("anchored %s", ", ".join(f"topic {t} to its id {i}" for t, i in sorted(unseen.items())))


def _subscribed_positions(
    cur: ledger.Cursor, pipeline: PipelineConfig, offsets: dict[TopicPartition, PartitionOffsets]
) -> dict[TopicPartition, int]:
    """Positions of the subscribed partitions; partitions seen for the first time get their start position."""
    known = ledger.positions(cur, pipeline.name)
    new = [tp for tp in offsets if tp not in known]
    if new:
        starts = start_positions(new, offsets, pipeline.start_position)
        for assigned in pipeline.assignment or []:
            tp = TopicPartition(assigned.topic, assigned.partition)
            if tp in starts and assigned.start_offset is not None:
                starts[tp] = assigned.start_offset
        ledger.insert_start_positions(cur, pipeline.name, starts)
        # A few named, not thousands: a pipeline over a topic of 10,000 partitions starts them all at once.
        named = sorted(starts.items())[:NEW_PARTITIONS_NAMED]
        more = f" and {len(starts) - len(named)} more" if len(starts) > len(named) else ""
        log.info("%d new partition(s) start at: %s%s", len(new), ", ".join(f"{tp}@{pos}" for tp, pos in named), more)
        known = {**known, **starts}
    if pipeline.topic_pattern:
        # A matching topic that was deleted simply stops being read.
        return {tp: pos for tp, pos in known.items() if tp in offsets}
    if pipeline.assignment:
        return {tp: known[tp] for tp in offsets}
    # Listed topics must stay: a vanished partition of one fails the plan (see plan_ranges).
    return {tp: pos for tp, pos in known.items() if tp.topic in pipeline.topics}


def _resume(
    cur: ledger.Cursor,
    batch: ledger.Batch,
    offsets: dict[TopicPartition, PartitionOffsets],
    positions: dict[TopicPartition, int],
    dag_id: str | None,
    run_id: str | None,
) -> PlannedBatch:
    lost = lost_ranges(batch.ranges, {tp: o.log_start for tp, o in offsets.items()})
    if lost:
        raise LostDataError(lost)
    ledger.set_batch_owner(cur, batch.batch_id, dag_id, run_id)
    remaining = _backlog_after(positions, offsets, batch.ranges) if batch.moves_positions else 0
    detail = (f"status {batch.status}, {batch.attempts} attempt(s) so far"
              + (f", last error: {batch.last_error}" if batch.last_error else ""))
    return PlannedBatch(batch.batch_id, True, batch.ranges, backlog_after=remaining, kind=batch.kind, detail=detail)


def _refuse(problems: list[str]) -> None:
    if problems:
        raise RequestError("; ".join(problems))


def _refuse_rewrite_beside_catch_up(cur: ledger.Cursor, pipeline: PipelineConfig) -> None:
    """A rewrite of a sink that cannot have one beside an unfinished catch-up batch (Sink.rewrites_wait_for_catch_up),
    refused while there is one."""
    if not sink_for(pipeline).rewrites_wait_for_catch_up:
        return
    unfinished = ledger.open_batch(cur, pipeline.name)
    if unfinished is not None:
        raise RequestError(
            f"catch-up batch {unfinished.batch_id} of {pipeline.name} is {unfinished.status}: its "
            f"{pipeline.sink.type} sink takes a rewrite only once that batch has committed. Resume it first (a run "
            f"without config, or `kafka-ledger replay {pipeline.name} --batch {unfinished.batch_id}`)")


def _plan(
    cur: ledger.Cursor,
    services: Services,
    pipeline: PipelineConfig,
    offsets: dict[TopicPartition, PartitionOffsets],
    request: BatchRequest,
    dag_id: str | None,
    run_id: str | None,
    requested_by: str | None,
    backfill_window: tuple[datetime, datetime] | None,
    carrying: bool = False,
    topic_ids: dict[str, str] | None = None,
) -> PlannedBatch:
    kafka = services.kafka
    _check_topic_identity(cur, kafka, pipeline, offsets, topic_ids)
    positions = _subscribed_positions(cur, pipeline, offsets)
    mine = ledger.run_open_batch(cur, pipeline.name, dag_id, run_id)
    if mine is not None:
        return _resume(cur, mine, offsets, positions, dag_id, run_id)
    # A backfill run always rewrites its data interval, also when it reuses a run that committed before; a
    # carrying run's next batch is its next catch-up batch.
    committed = ([] if backfill_window or carrying
                 else ledger.run_committed_batches(cur, pipeline.name, dag_id, run_id))
    carried = [b for b in committed if b.kind == "catch_up"]
    if committed:
        # Clearing a run is how Airflow users reprocess it: the run re-reads the ranges it recorded and replaces
        # their output (positions untouched). Planning anew would read whatever is new under the old run's name.
        log.info("run %s already committed batch(es) %s: clearing it replays %s", run_id,
                 ", ".join(str(b.batch_id) for b in committed),
                 f"the ranges of the {len(carried)} batches it carried" if len(carried) > 1
                 else "its first batch's ranges")
        request = BatchRequest(mode="replay_batch", batch_id=committed[0].batch_id,
                               reason=request.reason or f"run {run_id} cleared in Airflow")

    def record(ranges: list[OffsetRange], kind: str, **extra: Any) -> ledger.Batch:
        batch = ledger.create_batch(cur, pipeline.name, ranges, dag_id, run_id, kind=kind,
                                    requested_by=requested_by, reason=request.reason,
                                    end_offsets={tp: o.end for tp, o in offsets.items()}, **extra)
        fmt = value_format(pipeline)
        if fmt.uses_registry:
            replayed = extra.get("replay_of") if request.reader_schema == "batch" else None
            # The columns as the format reads them (a change event's row image is inside it: `after.id`).
            ledger.record_schema_pins(cur, batch.batch_id, fmt.pin(
                services.registry().client(), pipeline, sink_for(pipeline).envelope.reading(pipeline).columns,
                {r.topic for r in ranges}, ledger.schema_pins(cur, replayed) if replayed else {}))
        return batch

    in_flight = {b.batch_id: b.ranges for b in ledger.in_flight_batches(cur, pipeline.name)}

    if len(carried) > 1:
        # A run that carried several batches (batch/carry.py) replays them all, as one batch of their joined ranges.
        ranges, gaps = join_consecutive(b.ranges for b in carried)
        if gaps:
            raise RequestError(
                f"run {run_id} carried batches {carried[0].batch_id} to {carried[-1].batch_id}, whose ranges do not "
                f"join ({'; '.join(gaps)}): replay them one by one (`kafka-ledger replay {pipeline.name} --batch N`)")
        _refuse(check_rewrite_ranges(ranges, offsets, positions, in_flight))
        _refuse_rewrite_beside_catch_up(cur, pipeline)
        batch = record(ranges, "replay", replay_of=carried[0].batch_id)
        return PlannedBatch(batch.batch_id, False, ranges, 0, kind="replay",
                            detail=f"of the {len(carried)} batches {carried[0].batch_id} to {carried[-1].batch_id} "
                                   f"run {run_id} carried")

    if backfill_window is not None or request.mode == "time_window":
        kind = "backfill" if backfill_window is not None else "time_window"
        window = backfill_window or (request.window_from, request.window_to)
        tps = sorted(offsets)
        behind, pending = window_ranges(
            kafka_offsets.offsets_for_time(kafka, tps, _ms(window[0])),
            kafka_offsets.offsets_for_time(kafka, tps, _ms(window[1])),
            offsets, positions,
        )
        if pending:
            log.info("%d offsets of the window [%s, %s) are not ingested yet; the catch-up runs read them:\n%s",
                     sum(r.span for r in pending), window[0], window[1], _format_ranges(pending))
        if not behind:
            log.info("window [%s, %s) holds no ingested offsets to rewrite: nothing to read", *window)
            return PlannedBatch(None, False, [], 0, kind=kind, pending=pending)
        _refuse(check_rewrite_ranges(behind, offsets, positions, in_flight))
        _refuse_rewrite_beside_catch_up(cur, pipeline)
        batch = record(behind, kind, window=window)
        return PlannedBatch(batch.batch_id, False, behind, 0, kind=kind, pending=pending,
                            detail=f"for [{window[0]}, {window[1]})")

    if request.mode == "offset_ranges":
        ranges = sorted(request.offset_ranges)
        _refuse(check_rewrite_ranges(ranges, offsets, positions, in_flight))
        _refuse_rewrite_beside_catch_up(cur, pipeline)
        batch = record(ranges, "offset_ranges")
        return PlannedBatch(batch.batch_id, False, ranges, 0, kind="offset_ranges")

    if request.mode == "replay_batch":
        try:
            target = ledger.pipeline_batch(cur, pipeline.name, request.batch_id)
        except ledger.LedgerError as exc:
            raise RequestError(str(exc)) from exc
        if target.status == "abandoned":
            raise RequestError(f"batch {target.batch_id} was abandoned by a position reset; "
                               "replay its offsets with mode offset_ranges if they are behind the position")
        if target.unfinished:
            # Replaying an unfinished batch is resuming it: same ranges, and a catch-up batch then
            # moves the positions when it commits.
            return _resume(cur, target, offsets, positions, dag_id, run_id)
        ranges = [OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset) for r in target.ranges]
        _refuse(check_rewrite_ranges(ranges, offsets, positions, in_flight))
        _refuse_rewrite_beside_catch_up(cur, pipeline)
        batch = record(ranges, "replay", replay_of=target.batch_id)
        return PlannedBatch(batch.batch_id, False, ranges, 0, kind="replay",
                            detail=f"of {target.kind} batch {target.batch_id}")

    unfinished = ledger.open_batch(cur, pipeline.name)
    if unfinished is not None:
        return _resume(cur, unfinished, offsets, positions, dag_id, run_id)
    skip_lost = pipeline.on_data_loss == "skip"
    if pipeline.delivery_mode == "latest_only":
        ranges = plan_latest_ranges(positions, offsets, pipeline.max_records_per_partition, skip_lost)
    else:
        ranges = plan_ranges(positions, offsets, pipeline.max_records_per_partition, skip_lost)
    lost = [r for r in ranges if r.skipped_from is not None and r.skipped_from < offsets[r.topic_partition].log_start]
    if lost:
        log.warning(
            "DATA LOSS accepted (on_data_loss: skip): retention deleted offsets %s never read; they are recorded "
            "as skipped in the ledger", ", ".join(
                f"{r.topic}-{r.partition} [{r.skipped_from}, {offsets[r.topic_partition].log_start})" for r in lost),
        )
    remaining = _backlog_after(positions, offsets, ranges)
    if not ranges:
        log.info("no new data in %s for %s: nothing planned, no Spark job", pipeline.subscription, pipeline.name)
        return PlannedBatch(None, False, [], backlog_after=0)
    batch = record(ranges, "catch_up")
    planned = PlannedBatch(batch.batch_id, False, ranges, backlog_after=remaining,
                           detail=f"{pipeline.delivery_mode}, cap {pipeline.max_records_per_partition} per partition")
    if planned.skipped:
        log.warning("latest_only: %d older offsets skipped on purpose and recorded as skipped in the ledger",
                    planned.skipped)
    return planned


def _backlog_after(
    positions: dict[TopicPartition, int], offsets: dict[TopicPartition, PartitionOffsets], ranges: list[OffsetRange]
) -> int:
    after = {tp: pos for tp, pos in positions.items() if tp in offsets}
    for r in ranges:
        after[r.topic_partition] = r.until_offset
    return backlog(after, offsets)
