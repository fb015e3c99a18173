"""Positions mirrored into a Kafka consumer group, so Kafka's own tools (kafka-consumer-groups, Burrow) see the lag.

The ledger stays the only authority: the group is written after the ledger's transaction committed, from the
ledger's positions, and a failed write is logged and rewritten whole after the next commit. Nothing reads
the group back except verify, which reports a group that differs from the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.model.ranges import TopicPartition

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 30.0


class MirrorError(RuntimeError):
    """The consumer group could not be written or read; the ledger is unaffected."""


class _CoordinatorMoving(MirrorError):
    """The group's coordinator is being elected or loaded (a group's first use, a broker restart): try again."""


# Errors of a group coordinator that is not ready yet, worth a few quick retries.
COORDINATOR_NOT_READY = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                         KafkaError.COORDINATOR_NOT_AVAILABLE}


def offset_metadata(pipeline: PipelineConfig, last_batch_id: int | None) -> str:
    """The note stored with each mirrored offset: who wrote it and which batch moved the position last."""
    return f"kafka-ledger {pipeline.name}" + (f" batch {last_batch_id}" if last_batch_id is not None else "")


@retry(retry=retry_if_exception_type(_CoordinatorMoving), stop=stop_after_attempt(5),
       wait=wait_exponential(multiplier=0.5, max=5), reraise=True)
def write_positions(kafka: KafkaClient, group: str, positions: dict[TopicPartition, tuple[int, str]]) -> None:
    """Commit each partition's (offset, metadata) to `group`: Kafka reads them as the group's positions."""
    if not positions:
        return
    admin = kafka_offsets.admin_client(kafka)
    request = ConsumerGroupTopicPartitions(group, [
        KafkaTopicPartition(tp.topic, tp.partition, offset, metadata=metadata)
        for tp, (offset, metadata) in sorted(positions.items())
    ])
    try:
        result = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_SECONDS)[group].result()
    except KafkaException as exc:
        raise MirrorError(f"cannot write consumer group {group!r}: {exc}") from exc
    errors = [tp.error for tp in result.topic_partitions if tp.error]
    failed = [f"{tp.topic}-{tp.partition}: {tp.error}" for tp in result.topic_partitions if tp.error]
    if failed:
        kind = _CoordinatorMoving if all(e.code() in COORDINATOR_NOT_READY for e in errors) else MirrorError
        raise kind(f"consumer group {group!r} refused offsets: {'; '.join(failed)}")


def read_positions(kafka: KafkaClient, group: str) -> dict[TopicPartition, int]:
    """The offsets committed in `group` (partitions without one are left out)."""
    admin = kafka_offsets.admin_client(kafka)
    try:
        result = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=TIMEOUT_SECONDS)[group].result()
    except KafkaException as exc:
        raise MirrorError(f"cannot read consumer group {group!r}: {exc}") from exc
    return {TopicPartition(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}


# A position as the ledger holds it: the partition, its position, and the batch that moved it last.
LedgerPosition = tuple[TopicPartition, int, int | None]


def mirror_positions(kafka: KafkaClient, pipeline: PipelineConfig,
                     ledger_positions: Callable[[], Iterable[LedgerPosition]]) -> bool:
    """After a commit: write the ledger's positions (`ledger_positions` reads them) to the pipeline's mirror group,
    if it has one.

    Never raises: the commit it follows stands whatever happens here. A failure is logged as a warning; the
    next commit writes every position again, and verify reports the difference meanwhile.
    """
    group = pipeline.mirror_consumer_group
    if not group:
        return False
    try:
        positions = {tp: (position, offset_metadata(pipeline, last_batch_id))
                     for tp, position, last_batch_id in ledger_positions()}
        write_positions(kafka, group, positions)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the ledger's commit must stand
        log.warning("positions of %s NOT mirrored into consumer group %r (the ledger is unaffected; the next "
                    "commit writes them again): %s", pipeline.name, group, exc)
        return False
    log.info("mirrored %d position(s) of %s into consumer group %r", len(positions), pipeline.name, group)
    return True


def mirror_differences(kafka: KafkaClient, pipeline: PipelineConfig,
                       positions: dict[TopicPartition, int]) -> list[str]:
    """Where the mirror group differs from the ledger's positions, in words (empty: same, or no mirror)."""
    group = pipeline.mirror_consumer_group
    if not group:
        return []
    mirrored = read_positions(kafka, group)
    return [f"{tp}: ledger {positions.get(tp)}, group {mirrored.get(tp)}"
            for tp in sorted(set(positions) | set(mirrored)) if positions.get(tp) != mirrored.get(tp)]
