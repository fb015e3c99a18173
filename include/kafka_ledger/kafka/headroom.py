"""Retention headroom: how many offsets and how long until retention deletes a partition's oldest unread offset."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaException

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.model.ranges import PartitionOffsets, PlanError, TopicPartition

log = logging.getLogger(__name__)

# How many low partitions a log line or a failed check names one by one (the rest are counted).
NAMED = 10


@dataclass(frozen=True)
class Retention:
    """What deletes a topic's records: retention.ms and retention.bytes (None: no limit), and whether its
    cleanup.policy deletes at all (compact alone never deletes by age or size)."""

    ms: int | None
    bytes: int | None
    deletes: bool

    @classmethod
    def from_config(cls, config: Mapping[str, str | None]) -> Retention:
        def limit(name: str) -> int | None:
            value = int(config.get(name) or -1)
            return None if value < 0 else value

        policy = config.get("cleanup.policy") or "delete"
        return cls(limit("retention.ms"), limit("retention.bytes"), "delete" in policy)


@dataclass(frozen=True)
class Headroom:
    """One partition's margin before retention deletes its oldest unread offset (the committed position).

    `offsets`: offsets retention deletes before it reaches the position. `seconds`: at the earliest, the time until
    it may (None: no limit, or not known yet). `window_seconds`: how long the topic keeps a record, the scale of
    `fraction`. `basis`: which estimate gave `seconds`. `low` once `fraction` is under the pipeline's
    `retention_warning_fraction`. Offsets already `lost` are not low: the warning is for before the loss, and
    the loss is on_data_loss's to handle (the plan fails naming it, or records it as skipped).
    """

    topic: str
    partition: int
    position: int
    unread: int
    offsets: int | None
    seconds: float | None
    window_seconds: float | None
    basis: str
    lost: int
    low: bool

    @property
    def fraction(self) -> float | None:
        if self.seconds is None or not self.window_seconds:
            return None
        return self.seconds / self.window_seconds

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": None if self.fraction is None else round(self.fraction, 4)}

    def describe(self) -> str:
        """One line for task logs, the CLI and a failed check."""
        where = f"{self.topic}-{self.partition}"
        if self.lost:
            return f"{where}: retention deleted {self.lost} offsets never read (position {self.position})"
        if self.seconds is None:
            return f"{where}: {self.basis}"
        share = f" ({self.fraction:.0%} of {duration(self.window_seconds)})" if self.fraction is not None else ""
        return (f"{where}: {self.offsets} offsets and at the earliest {duration(self.seconds)}{share} before "
                f"retention may delete offset {self.position}, the oldest unread ({self.basis})")


def duration(seconds: float | None) -> str:
    """A short human duration: 45s, 12m 5s, 3h 12m, 2d 4h."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit} {(s % size) // sub_size}{sub}"
    return f"{s}s"


def headroom_text(margin: dict[str, Any] | None) -> str:
    """A partition's headroom (Headroom.as_dict) in a table cell: offsets and time left, the share of the window."""
    if not margin:
        return "-"
    if margin["lost"]:
        return f"LOST {margin['lost']} offsets"
    if margin["offsets"] is None:
        return margin["basis"]
    if margin["seconds"] is None:
        return f"{margin['offsets']} offsets; {margin['basis']}"
    share = f" ({margin['fraction']:.0%})" if margin["fraction"] is not None else ""
    return f"{margin['offsets']} offsets, {duration(margin['seconds'])}{share}"


def assess(
    tp: TopicPartition,
    position: int,
    offsets: PartitionOffsets,
    retention: Retention,
    oldest_unread_ms: int | None,
    log_start_rate: float | None,
    now_ms: int,
    warn_fraction: float,
) -> Headroom:
    """The headroom of one partition.

    Two estimates, the smaller wins: by time, the oldest unread record's timestamp plus retention.ms (Kafka deletes
    a whole segment once its newest record is that old, so never earlier); by movement, the offsets left before
    the position at the rate plans saw the log start move (any deletion: retention.bytes included).
    """
    unread = max(0, offsets.end - position)

    def result(offsets_left: int | None, seconds: float | None, window: float | None, basis: str,
               lost: int = 0) -> Headroom:
        low = not lost and seconds is not None and window is not None and seconds < warn_fraction * window
        return Headroom(tp.topic, tp.partition, position, unread, offsets_left, seconds, window, basis, lost, low)

    if position < offsets.log_start:
        return result(0, None, None, "lost", lost=offsets.log_start - position)
    if unread == 0:
        return result(None, None, None, "nothing unread")
    left = position - offsets.log_start
    if not retention.deletes:
        return result(left, None, None, "compacted only: nothing is deleted by age or size")
    estimates = []
    if retention.ms is not None and oldest_unread_ms is not None:
        estimates.append(((oldest_unread_ms + retention.ms - now_ms) / 1000, retention.ms / 1000, "retention.ms"))
    if log_start_rate:
        estimates.append((left / log_start_rate, (offsets.end - offsets.log_start) / log_start_rate,
                          "log start movement"))
    if not estimates:
        if retention.ms is None and retention.bytes is None:
            return result(left, None, None, "no retention limit")
        return result(left, None, None, "not known yet: the log start has not been seen moving")
    seconds, window, basis = min(estimates)
    return result(left, max(0.0, seconds), window, basis)


def partition_headroom(
    kafka: KafkaClient,
    pipeline: PipelineConfig,
    positions: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    log_start_rates: Mapping[TopicPartition, float],
    oldest_unread_ms: Mapping[TopicPartition, int] | None = None,
) -> list[Headroom]:
    """The headroom of every partition with a position: the topics' retention settings and, where retention.ms
    applies, the oldest unread record's timestamp (one small fetch per such partition, unless `oldest_unread_ms`
    has them already) come from Kafka."""
    tps = sorted(tp for tp in positions if tp in offsets)
    retention = topics_retention(kafka, sorted({tp.topic for tp in tps}))
    aged = {tp: positions[tp] for tp in tps
            if retention[tp.topic].deletes and retention[tp.topic].ms is not None
            and offsets[tp].log_start <= positions[tp] < offsets[tp].end}
    stamps = (kafka_offsets.record_timestamps(kafka, aged) if oldest_unread_ms is None
              else oldest_unread_ms)
    return assess_all(pipeline, positions, offsets, retention, log_start_rates, stamps)


def topics_retention(kafka: KafkaClient, topics: list[str]) -> dict[str, Retention]:
    """Each topic's retention settings, in one request."""
    configs = kafka_offsets.topic_configs(kafka, topics)
    return {topic: Retention.from_config(config) for topic, config in configs.items()}


def assess_all(
    pipeline: PipelineConfig,
    positions: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    retention: Mapping[str, Retention],
    log_start_rates: Mapping[TopicPartition, float],
    oldest_unread_ms: Mapping[TopicPartition, int],
) -> list[Headroom]:
    """The headroom of every partition with a position, from what Kafka said (no look-up of its own)."""
    now_ms = int(time.time() * 1000)
    return [assess(tp, positions[tp], offsets[tp], retention[tp.topic], oldest_unread_ms.get(tp),
                   log_start_rates.get(tp), now_ms, pipeline.retention_warning_fraction)
            for tp in sorted(tp for tp in positions if tp in offsets)]


def look_up(
    kafka: KafkaClient,
    pipeline: PipelineConfig,
    positions: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, PartitionOffsets],
    log_start_rates: Mapping[TopicPartition, float],
    oldest_unread_ms: Mapping[TopicPartition, int] | None = None,
) -> tuple[list[Headroom] | None, str | None]:
    """partition_headroom, never raising for Kafka's sake: (the headroom, None), or (None, why not). The headroom
    only warns: a plan or a report goes on without it."""
    try:
        return (partition_headroom(kafka, pipeline, positions, offsets, log_start_rates, oldest_unread_ms),
                None)
    except (PlanError, KafkaException) as exc:
        return None, f"retention headroom of {pipeline.name} not computed: {exc}"


def low(headroom: list[Headroom]) -> list[Headroom]:
    """The partitions under the warning threshold, the tightest first."""
    return sorted((h for h in headroom if h.low), key=lambda h: h.seconds or 0.0)


def warning(pipeline: PipelineConfig, headroom: list[Headroom]) -> str | None:
    """The loud sentence when any partition is under the threshold (None when none is)."""
    under = low(headroom)
    if not under:
        return None
    named = "; ".join(h.describe() for h in under[:NAMED])
    more = f"; and {len(under) - NAMED} more partition(s)" if len(under) > NAMED else ""
    return (f"RETENTION HEADROOM LOW for {pipeline.name}: {len(under)} partition(s) under "
            f"{pipeline.retention_warning_fraction:.0%} of their retention window: {named}{more}. Read them before "
            f"retention deletes them (the pipeline's runs catch up; raise max_records_per_partition or run more "
            f"often), or lengthen the topic's retention; on_data_loss ({pipeline.on_data_loss}) decides what "
            f"happens to offsets deleted unread")


def log_headroom(pipeline: PipelineConfig, headroom: list[Headroom]) -> None:
    """The plan task's lines: the tightest partition, and a warning naming every low one."""
    bounded = [h for h in headroom if h.seconds is not None]
    if bounded:
        tightest = min(bounded, key=lambda h: h.seconds or 0.0)
        log.info("retention headroom of %s, tightest partition: %s", pipeline.name, tightest.describe())
    elif headroom:
        log.info("retention headroom of %s: no partition's oldest unread offset has a retention deadline (%s)",
                 pipeline.name, ", ".join(sorted({h.basis for h in headroom})))
    loud = warning(pipeline, headroom)
    if loud:
        log.warning(loud)
