"""Kafka offset look-ups: partitions of the subscribed topics, their log start and read_committed end."""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicCollection
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, OffsetSpec

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import KafkaClient
from kafka_ledger.model.ranges import PartitionOffsets, PlanError, RecordId, TopicPartition


class KafkaUnavailable(PlanError):
    """Kafka did not answer: nothing was planned (retrying later is the remedy)."""


# librdkafka's own log lines repeat a connection failure many times a second; the failure reaches the user
# once, in the error that stops the plan (ReportingAdminClient.unreachable).
log = logging.getLogger(__name__)
LIBRDKAFKA_LOG = logging.getLogger("kafka_ledger.librdkafka")
LIBRDKAFKA_LOG.setLevel(logging.CRITICAL)
LIBRDKAFKA_LOG.propagate = False


# Connection errors that repeat the same way on every attempt: a wrong password or an untrusted certificate
# does not heal by waiting. Seen this often, the look-up stops at once instead of at its timeout; once is
# not enough (a connection cut during its handshake reports one).
REFUSALS = (KafkaError._AUTHENTICATION, KafkaError._SSL)
REFUSALS_TO_STOP = 3


class ConnectionReports:
    """What librdkafka reports about a client's connections (its error callback)."""

    def __init__(self) -> None:
        self.errors: deque[str] = deque(maxlen=100)  # the latest: a client kept for days reports on and on
        self.refusals = 0

    def __call__(self, error: KafkaError) -> None:
        self.errors.append(error.str())
        self.refusals += error.code() in REFUSALS


class ReportingAdminClient(AdminClient):
    """An admin client that keeps what librdkafka reports about its connections (why Kafka is unreachable)."""

    def __init__(self, config: dict[str, object]):
        # The callback must not hold the client (a bound method would): a client in a reference cycle lives, with
        # its threads and sockets, until the garbage collector's rare full pass, and a run carrying batch after
        # batch piled up a hundred of them. Without the cycle a client ends when its last reference does.
        self.reports = ConnectionReports()
        super().__init__({**config, "error_cb": self.reports, "logger": LIBRDKAFKA_LOG})

    def topics(self, kafka: KafkaClient, timeout: float) -> ClusterMetadata:
        """The cluster's metadata; KafkaUnavailable at the timeout, or as soon as the broker keeps refusing us."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            except KafkaException as exc:
                self.poll(0)  # serves the error callbacks queued meanwhile
                if self.reports.refusals >= REFUSALS_TO_STOP or time.monotonic() >= deadline:
                    raise self.unreachable(kafka, exc) from exc

    def unreachable(self, kafka: KafkaClient, exc: Exception) -> KafkaUnavailable:
        """The error to raise when a request failed: the connection's own reason (TLS, SASL) when known."""
        self.poll(0.5)  # serves the error callbacks queued meanwhile
        reasons = [e for e in dict.fromkeys(self.reports.errors) if "brokers are down" not in e]
        return KafkaUnavailable(f"cannot reach Kafka at {kafka}: {'; '.join(reasons) or exc}")


def admin_client(kafka: KafkaClient) -> ReportingAdminClient:
    return ReportingAdminClient(kafka.confluent(**{"socket.timeout.ms": 10_000}))


# What a partition answers while its leadership moves (a broker restarted, a leader being elected): asked again.
# _NOENT is the client's own "Failed to query partition leaders: No leaders found", while a restarted broker
# still loads its logs.
LEADERSHIP_IN_FLUX = frozenset({
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError._NOENT})


def list_offsets(admin: ReportingAdminClient, tps: list[TopicPartition], spec: OffsetSpec,
                 timeout: float) -> dict[TopicPartition, int]:
    """Each partition's offset as `spec` asks (read_committed), in one request; the partitions whose leadership was
    moving asked again until `timeout`."""
    deadline = time.monotonic() + timeout
    found: dict[TopicPartition, int] = {}
    asked = tps
    while asked:
        futures = admin.list_offsets(
            {KafkaTopicPartition(tp.topic, tp.partition): spec for tp in asked},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=max(1.0, deadline - time.monotonic()),
        )
        moving = []
        for k, f in futures.items():
            try:
                found[TopicPartition(k.topic, k.partition)] = f.result().offset
            except KafkaException as exc:
                if exc.args[0].code() not in LEADERSHIP_IN_FLUX or time.monotonic() >= deadline:
                    raise
                moving.append(TopicPartition(k.topic, k.partition))
        if moving:
            log.info("asking again for the offsets of %d partition(s) whose leader is moving", len(moving))
            time.sleep(0.5)
        asked = moving
    return found


def partition_offsets(
    kafka: KafkaClient, topics: list[str], timeout: float = 30.0
) -> dict[TopicPartition, PartitionOffsets]:
    """Every partition of `topics` with its log start offset and its end offset under read_committed.

    The end offset under read_committed is the last stable offset: open transactions are never read
    into a batch, so a range never ends inside a transaction that might still abort.
    """
    admin = admin_client(kafka)
    tps = _topics_partitions(admin.topics(kafka, timeout), topics, kafka)
    return _offsets(admin, tps, topics, timeout)


def log_start_offsets(kafka: KafkaClient, topics: list[str], timeout: float = 30.0) -> dict[TopicPartition, int]:
    """Every partition of `topics` with its log start offset only: half the look-ups of partition_offsets, for a
    check that needs no end (whether retention deleted what a batch is about to read)."""
    admin = admin_client(kafka)
    tps = _topics_partitions(admin.topics(kafka, timeout), topics, kafka)
    try:
        return list_offsets(admin, tps, OffsetSpec.earliest(), timeout) if tps else {}
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot list offsets of {', '.join(topics)}: {exc}") from exc


def _topics_partitions(metadata: ClusterMetadata, topics: list[str], kafka: KafkaClient) -> list[TopicPartition]:
    missing = [t for t in topics if t not in metadata.topics or metadata.topics[t].error is not None]
    if missing:
        raise PlanError(f"topic(s) not found in Kafka at {kafka}: {', '.join(missing)}")
    return sorted(TopicPartition(t, p) for t in topics for p in metadata.topics[t].partitions)


def _offsets(admin: ReportingAdminClient, tps: list[TopicPartition], topics: list[str],
             timeout: float) -> dict[TopicPartition, PartitionOffsets]:
    if not tps:
        return {}
    try:
        starts = list_offsets(admin, tps, OffsetSpec.earliest(), timeout)
        ends = list_offsets(admin, tps, OffsetSpec.latest(), timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot list offsets of {', '.join(topics)}: {exc}") from exc
    return {tp: PartitionOffsets(log_start=starts[tp], end=ends[tp]) for tp in tps}


def _subscribed_partitions(pipeline: PipelineConfig, metadata: ClusterMetadata,
                           kafka: KafkaClient) -> list[TopicPartition]:
    """The partitions the pipeline subscribes to, as the cluster's metadata has them.

    A topic list must exist in full; a pattern matches whatever topics exist at this moment (so new matching topics
    are picked up at plan time); an assignment must name existing partitions.
    """
    if pipeline.topic_pattern:
        return _topics_partitions(metadata, sorted(t for t in metadata.topics if pipeline.subscribes(t)), kafka)
    if pipeline.assignment:
        existing = set(_topics_partitions(metadata, sorted({a.topic for a in pipeline.assignment}), kafka))
        wanted = [TopicPartition(a.topic, a.partition) for a in pipeline.assignment]
        missing = [str(tp) for tp in wanted if tp not in existing]
        if missing:
            raise PlanError(f"assigned partition(s) do not exist in Kafka: {', '.join(missing)}")
        return sorted(wanted)
    return _topics_partitions(metadata, pipeline.topics, kafka)


def subscribed_offsets(
    kafka: KafkaClient, pipeline: PipelineConfig, timeout: float = 30.0
) -> dict[TopicPartition, PartitionOffsets]:
    """Offsets of every partition the pipeline subscribes to, resolved now (_subscribed_partitions)."""
    admin = admin_client(kafka)
    tps = _subscribed_partitions(pipeline, admin.topics(kafka, timeout), kafka)
    return _offsets(admin, tps, sorted({tp.topic for tp in tps}), timeout)


def pipelines_offsets(
    kafka: KafkaClient, pipelines: list[PipelineConfig], timeout: float = 10.0,
    admin: ReportingAdminClient | None = None,
) -> tuple[dict[str, dict[TopicPartition, PartitionOffsets]], dict[str, str]]:
    """Every pipeline's subscribed partitions with their offsets, in one metadata request and one offset request
    of each kind for them all (a scrape's look-up, the doorbells'): the offsets by pipeline, and why a pipeline's
    are unknown (a topic missing). KafkaUnavailable when Kafka does not answer. Through `admin` if given (a client
    kept between look-ups), else a client of its own."""
    admin = admin or admin_client(kafka)
    metadata = admin.topics(kafka, timeout)
    subscribed: dict[str, list[TopicPartition]] = {}
    problems: dict[str, str] = {}
    for pipeline in pipelines:
        try:
            subscribed[pipeline.name] = _subscribed_partitions(pipeline, metadata, kafka)
        except PlanError as exc:
            problems[pipeline.name] = str(exc)
    everything = sorted({tp for tps in subscribed.values() for tp in tps})
    offsets = _offsets(admin, everything, sorted({tp.topic for tp in everything}), timeout)
    return {name: {tp: offsets[tp] for tp in tps} for name, tps in subscribed.items()}, problems


@dataclass(frozen=True)
class SubscriptionView:
    """What Kafka said of a pipeline's subscription at one moment: its partitions' offsets and its topics' ids."""

    offsets: dict[TopicPartition, PartitionOffsets]
    topic_ids: dict[str, str]


def subscription_views(kafka: KafkaClient, pipelines: list[PipelineConfig], timeout: float = 30.0
                       ) -> tuple[dict[str, SubscriptionView], dict[str, str]]:
    """Every pipeline's SubscriptionView, in one metadata request, one offsets request of each kind and one
    description of the topics for them all (a carrier's members): the views by pipeline, and why a pipeline's is
    unknown (a topic missing)."""
    admin = admin_client(kafka)
    offsets, problems = pipelines_offsets(kafka, pipelines, timeout, admin)
    ids = topic_ids(kafka, sorted({tp.topic for found in offsets.values() for tp in found}), timeout, admin)
    return {name: SubscriptionView(found, {tp.topic: ids[tp.topic] for tp in found if tp.topic in ids})
            for name, found in offsets.items()}, problems


def topic_ids(kafka: KafkaClient, topics: list[str], timeout: float = 30.0,
              admin: ReportingAdminClient | None = None) -> dict[str, str]:
    """Each topic's Kafka topic id (KIP-516): a new id for every creation of a topic of that name.

    A topic Kafka does not have is left out. Through `admin` if given, else a client of its own.
    """
    if not topics:
        return {}
    admin = admin or admin_client(kafka)
    ids = {}
    try:
        for topic, future in admin.describe_topics(TopicCollection(sorted(topics)), request_timeout=timeout).items():
            try:
                ids[topic] = str(future.result().topic_id)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
    except KafkaException as exc:
        raise admin.unreachable(kafka, exc) from exc
    return ids


def offsets_for_time(
    kafka: KafkaClient, tps: list[TopicPartition], timestamp_ms: int, timeout: float = 30.0
) -> dict[TopicPartition, int | None]:
    """For each partition, the first offset whose record timestamp is >= timestamp_ms (None: no such record).

    Kafka answers from its time index, so this is cheap; records with out-of-order timestamps are
    placed by their offset, which keeps consecutive windows tiling without gap or overlap.
    """
    if not tps:
        return {}
    admin = admin_client(kafka)
    try:
        found = list_offsets(admin, tps, OffsetSpec.for_timestamp(timestamp_ms), timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot look up offsets by time in Kafka at {kafka}: {exc}") from exc
    return {tp: (offset if offset >= 0 else None) for tp, offset in found.items()}


def topic_configs(kafka: KafkaClient, topics: list[str], timeout: float = 30.0) -> dict[str, dict[str, str | None]]:
    """Each topic's effective configuration (its own settings, else the broker's defaults)."""
    if not topics:
        return {}
    admin = admin_client(kafka)
    try:
        futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics],
                                         request_timeout=timeout)
        return {resource.name: {name: entry.value for name, entry in future.result().items()}
                for resource, future in futures.items()}
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot describe topics {', '.join(topics)}: {exc}") from exc


def compacted_topics(kafka: KafkaClient, topics: list[str], timeout: float = 30.0) -> set[str]:
    """The topics among `topics` whose cleanup.policy includes compact (Kafka may delete older records
    of a key at any time, leaving offset gaps)."""
    configs = topic_configs(kafka, topics, timeout)
    return {topic for topic, config in configs.items() if "compact" in (config.get("cleanup.policy") or "")}


def bounded_consumer(kafka: KafkaClient, purpose: str, **extra: object) -> Consumer:
    """A read_committed consumer of its own (no group offsets: group `kafka-ledger-<purpose>-<random>`) for reads
    bounded by offsets known beforehand, which reports reaching a partition's end; `extra`: more settings."""
    return Consumer(kafka.confluent(**{
        "group.id": f"kafka-ledger-{purpose}-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        # A fetch that finds no data need not be held for more (the default 500 ms wait stalled each partition's
        # switch; see docs/benchmark.md).
        "fetch.wait.max.ms": 0,
        # Retention deleting the offsets being read must fail the read, not jump to the end and make records look
        # missing.
        "auto.offset.reset": "error",
        **extra,
    }))


def record_timestamps(
    kafka: KafkaClient, offsets: dict[TopicPartition, int], timeout: float = 10.0
) -> dict[TopicPartition, int]:
    """The Kafka timestamp (ms) of the first committed record at or after each offset, where Kafka has one.

    One small fetch per partition. A partition with nothing readable there (its end, or only aborted records)
    is left out, and so is one not answered within `timeout`.
    """
    if not offsets:
        return {}
    consumer = bounded_consumer(kafka, "timestamps", **{
        "max.partition.fetch.bytes": 1, "fetch.max.bytes": 1 << 20, "socket.timeout.ms": int(timeout * 1000)})
    found: dict[TopicPartition, int] = {}
    waiting = set(offsets)
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset) for tp, offset in offsets.items()])
        while waiting and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=len(waiting), timeout=0.2):
                if message.topic() is None:
                    continue  # a client-wide event, not a partition's answer
                tp = TopicPartition(message.topic(), message.partition())
                if tp not in waiting:
                    continue
                # The partition's end, or its offset deleted meanwhile, answers too: with no timestamp.
                if message.error() is None:
                    found[tp] = message.timestamp()[1]
                waiting.discard(tp)
                consumer.pause([KafkaTopicPartition(tp.topic, tp.partition)])
    finally:
        consumer.close()
    return found


def records_at(kafka: KafkaClient, wanted: Iterable[RecordId],
               timeout: float = 60.0) -> dict[RecordId, tuple[bytes | None, bytes | None]]:
    """The raw key and value of the committed record at each (topic, partition, offset), read again from Kafka: one
    read of each partition, from its first wanted offset to its last. An offset Kafka no longer holds (retention
    deleted it, or a compaction) is left out; KafkaUnavailable when a partition gives no answer within `timeout`."""
    offsets: dict[TopicPartition, set[int]] = {}
    for topic, partition, offset in wanted:
        offsets.setdefault(TopicPartition(topic, partition), set()).add(offset)
    if not offsets:
        return {}
    consumer = bounded_consumer(kafka, "records", **{"socket.timeout.ms": int(timeout * 1000)})
    found: dict[RecordId, tuple[bytes | None, bytes | None]] = {}
    last = {tp: max(wanted_offsets) for tp, wanted_offsets in offsets.items()}
    # The partition's end, or its first wanted offset deleted meanwhile (auto.offset.reset: error), ends its read;
    # another error (a broker moving, a connection lost) is waited out.
    ending = {KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, min(o)) for tp, o in offsets.items()])
        while last:
            if time.monotonic() > deadline:
                shown = ", ".join(str(tp) for tp in sorted(last)[:3])
                raise KafkaUnavailable(f"Kafka at {kafka.servers} did not give the records of {len(last)} "
                                       f"partition(s) ({shown}) within {timeout:.0f} s")
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                if message.topic() is None:
                    continue  # a client-wide event, not a partition's answer
                tp = TopicPartition(message.topic(), message.partition())
                if tp not in last:
                    continue
                error = message.error()
                if error is not None and error.code() not in ending:
                    continue
                if error is None and message.offset() in offsets[tp]:
                    found[(tp.topic, tp.partition, message.offset())] = (message.key(), message.value())
                if error is not None or message.offset() >= last[tp]:
                    del last[tp]
                    consumer.pause([KafkaTopicPartition(tp.topic, tp.partition)])
    finally:
        consumer.close()
    return found


def newest_values(kafka: KafkaClient, topic: str, last: int = 5, timeout: float = 10.0) -> list[bytes]:
    """The values of up to `last` newest committed records of each partition of `topic` (not tombstones), newest
    first by Kafka timestamp: what a format whose values carry their schema derives columns from. Empty for a topic
    with no record (or none yet)."""
    ends = partition_offsets(kafka, [topic], timeout)
    wanted = {tp: max(o.log_start, o.end - last) for tp, o in ends.items() if o.end > o.log_start}
    if not wanted:
        return []
    consumer = bounded_consumer(kafka, "newest", **{"socket.timeout.ms": int(timeout * 1000)})
    found: list[tuple[int, bytes]] = []
    waiting = set(wanted)
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset) for tp, offset in wanted.items()])
        while waiting and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=100, timeout=0.2):
                if message.topic() is None:
                    continue
                tp = TopicPartition(message.topic(), message.partition())
                if message.error() is not None:  # the partition's end (or its offset deleted meanwhile)
                    waiting.discard(tp)
                elif message.value() is not None:
                    found.append((message.timestamp()[1], message.value()))
    finally:
        consumer.close()
    return [value for _, value in sorted(found, key=lambda f: f[0], reverse=True)]


def position_timestamps(kafka: KafkaClient, wanted: Iterable[tuple[TopicPartition, int]],
                        timeout: float = 10.0) -> dict[tuple[TopicPartition, int], int]:
    """record_timestamps of (partition, position) pairs, several pipelines' at once: one fetch for a position of each
    partition, and one fetch more for each further position in a partition (two pipelines reading one topic, each at
    its own position)."""
    left = set(wanted)
    found: dict[tuple[TopicPartition, int], int] = {}
    while left:
        asked: dict[TopicPartition, int] = {}
        for tp, position in sorted(left):
            asked.setdefault(tp, position)
        found.update({(tp, asked[tp]): ms for tp, ms in record_timestamps(kafka, asked, timeout).items()})
        left -= set(asked.items())
    return found
