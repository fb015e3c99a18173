"""Kafka offset look-ups: partitions of the subscribed topics, their log start and read_committed end."""

from __future__ import annotations

from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kafka_ledger.planning import PartitionOffsets, PlanError, TopicPartition


def admin_client(bootstrap_servers: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers, "socket.timeout.ms": 10_000})


def _list_offsets(admin: AdminClient, tps: list[TopicPartition], spec: OffsetSpec, timeout: float) -> dict:
    futures = admin.list_offsets(
        {KafkaTopicPartition(tp.topic, tp.partition): spec for tp in tps},
        isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=timeout,
    )
    return {TopicPartition(k.topic, k.partition): f.result().offset for k, f in futures.items()}


def partition_offsets(
    bootstrap_servers: str, topics: list[str], timeout: float = 30.0
) -> dict[TopicPartition, PartitionOffsets]:
    """Every partition of `topics` with its log start offset and its end offset under read_committed.

    The end offset under read_committed is the last stable offset: open transactions are never read
    into a batch, so a range never ends inside a transaction that might still abort.
    """
    admin = admin_client(bootstrap_servers)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise PlanError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    missing = [t for t in topics if t not in metadata.topics or metadata.topics[t].error is not None]
    if missing:
        raise PlanError(f"topic(s) not found in Kafka at {bootstrap_servers}: {', '.join(missing)}")
    tps = sorted(TopicPartition(t, p) for t in topics for p in metadata.topics[t].partitions)
    if not tps:
        return {}
    try:
        starts = _list_offsets(admin, tps, OffsetSpec.earliest(), timeout)
        ends = _list_offsets(admin, tps, OffsetSpec.latest(), timeout)
    except KafkaException as exc:
        raise PlanError(f"cannot list offsets of {', '.join(topics)}: {exc}") from exc
    return {tp: PartitionOffsets(log_start=starts[tp], end=ends[tp]) for tp in tps}
