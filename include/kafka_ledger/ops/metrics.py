"""Prometheus metrics of the declared pipelines, computed from the ledger and Kafka whenever they are scraped.

No task process keeps any of it: every replica of the endpoint gives the same answer, and a restart loses nothing.
Kafka's answers are cached for a few seconds (`KafkaLookups`) so that scrapes add no load to the brokers.
"""

from __future__ import annotations

import base64
import gc
import hmac
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from wsgiref.simple_server import WSGIRequestHandler
from wsgiref.simple_server import make_server as wsgi_server

from confluent_kafka import KafkaException
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, generate_latest
from prometheus_client.registry import Collector
from pydantic import SecretStr

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ledger import sql
from kafka_ledger.model import ranges as planning
from kafka_ledger.model.ranges import PartitionOffsets, TopicPartition

log = logging.getLogger(__name__)

PREFIX = "kafka_ledger"
DEFAULT_LISTEN = "127.0.0.1:9464"  # 9464: the port OpenTelemetry's Prometheus exporter uses too
KAFKA_CACHE_SECONDS = 5.0

# The stages of a committed batch the duration histogram shows (counted by migration 0018's trigger): queued (planned,
# until its last attempt began), read (Spark reading and decoding its ranges: in the connect runtime it overlaps the
# publish), commit (the publish and commit transaction), total (planned to committed).
BATCH_STAGES = ("queued", "read", "commit", "total")
# Their buckets: migration 0018 counts each batch under the smallest bound its seconds fit (the same list, tested).
DURATION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Batch statuses no batch leaves (counted as counters), and those of unfinished batches (gauges).
FINAL_STATUSES = ("committed", "abandoned")
UNFINISHED_STATUSES = ("planned", "written", "failed")
# A pipeline's most frequent dead-letter reasons each get their series, the rest one together: a reason may name what
# a record held (its unexpected fields), and Prometheus must not get a series per whim of a producer.
MAX_REASONS = 50
OTHER_REASONS = "(other reasons)"
# kafka-lag-exporter's dashboards select on a cluster_name label.
LAG_EXPORTER_CLUSTER = "kafka-ledger"


@dataclass
class LedgerFigures:
    """What the ledger says of the pipelines, read in one transaction."""

    # pipeline -> partition -> its position row (committed position, Kafka timestamp of its newest published record)
    positions: dict[str, dict[TopicPartition, ledger.PositionRow]] = field(default_factory=dict)
    batches: dict[str, dict[str, int]] = field(default_factory=dict)  # pipeline -> status -> batches
    attempts: dict[str, int] = field(default_factory=dict)  # pipeline -> attempts of its batches
    records_published: dict[str, int] = field(default_factory=dict)
    last_commit: dict[str, datetime] = field(default_factory=dict)
    dead_letters: dict[str, dict[str, int]] = field(default_factory=dict)  # pipeline -> reason -> count
    lost_offsets: dict[str, int] = field(default_factory=dict)
    # pipeline -> (when its last verify ended, its result, when the last that concluded ended)
    verified: dict[str, tuple[datetime, str, datetime | None]] = field(default_factory=dict)
    # (pipeline, stage) -> (batches at most each of DURATION_BUCKETS, batches, seconds in all)
    durations: dict[tuple[str, str], tuple[list[int], int, float]] = field(default_factory=dict)


def read_ledger(cur: ledger.Cursor, pipelines: list[str]) -> LedgerFigures:
    """The ledger's figures of `pipelines`: their positions, and totals the ledger keeps as it goes (a few rows per
    pipeline, whatever its history)."""
    figures, params = LedgerFigures(), {"pipelines": pipelines}
    figures.positions = ledger.pipelines_position_rows(cur, pipelines)
    cur.execute(sql.METRICS_BATCH_TOTALS, params)
    for pipeline, committed, abandoned, attempts, published, skipped, last_commit in cur.fetchall():
        figures.batches[pipeline] = {"committed": committed, "abandoned": abandoned}
        figures.attempts[pipeline] = attempts
        figures.records_published[pipeline] = published
        figures.lost_offsets[pipeline] = skipped
        if last_commit is not None:
            figures.last_commit[pipeline] = last_commit
    cur.execute(sql.METRICS_UNFINISHED_BATCHES, params)
    for pipeline, status, batches, attempts in cur.fetchall():
        figures.batches.setdefault(pipeline, {})[status] = batches
        figures.attempts[pipeline] = figures.attempts.get(pipeline, 0) + (attempts or 0)
    cur.execute(sql.METRICS_DEAD_LETTERS, params)
    for pipeline, reason, count in cur.fetchall():
        figures.dead_letters.setdefault(pipeline, {})[reason] = count
    cur.execute(sql.METRICS_VERIFY_RESULTS, params)
    figures.verified = {pipeline: tuple(rest) for pipeline, *rest in cur.fetchall()}
    cur.execute(sql.METRICS_BATCH_DURATIONS, params)
    counted: dict[tuple[str, str], dict[float, tuple[int, float]]] = {}
    for pipeline, stage, le, batches, seconds in cur.fetchall():
        counted.setdefault((pipeline, stage), {})[le] = (batches, seconds)
    figures.durations = {key: histogram(by_bound) for key, by_bound in counted.items()}
    return figures


def histogram(by_bound: dict[float, tuple[int, float]]) -> tuple[list[int], int, float]:
    """From batches counted under the smallest bound they fit (`inf`: above the last), the cumulative count at each
    of DURATION_BUCKETS, the count and the seconds in all."""
    cumulative, running = [], 0
    for bound in DURATION_BUCKETS:
        running += by_bound.get(bound, (0, 0.0))[0]
        cumulative.append(running)
    return cumulative, sum(b for b, _ in by_bound.values()), sum(s for _, s in by_bound.values())


@dataclass
class KafkaFigures:
    """What Kafka says of the pipelines' partitions (None when it did not answer: `error` says why)."""

    offsets: dict[str, dict[TopicPartition, PartitionOffsets]] | None
    problems: dict[str, str] = field(default_factory=dict)  # pipeline -> why its offsets are unknown
    # The Kafka timestamp (epoch seconds) of the record at a lagging partition's position, by (partition, position):
    # two pipelines reading one topic wait at positions of their own.
    oldest_unread: dict[tuple[TopicPartition, int], float] = field(default_factory=dict)
    error: str | None = None


class KafkaLookups:
    """Kafka's offsets of every pipeline, asked at most every `ttl_seconds`; and the timestamp of the record at each
    lagging partition's position, asked once per position (a record's timestamp does not change)."""

    def __init__(self, services: Services, ttl_seconds: float = KAFKA_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.services, self.ttl_seconds, self.clock = services, ttl_seconds, clock
        self._lock = threading.Lock()  # concurrent scrapes share one look-up
        self._offsets: tuple[float, tuple[str, ...], KafkaFigures] | None = None
        self._stamps: dict[tuple[TopicPartition, int], float] = {}

    def figures(self, pipelines: list[PipelineConfig], positions: dict[str, dict[TopicPartition, int]]) -> KafkaFigures:
        with self._lock:
            names = tuple(p.name for p in pipelines)
            now = self.clock()
            if self._offsets is None or self._offsets[1] != names or now - self._offsets[0] >= self.ttl_seconds:
                try:
                    offsets, problems = kafka_offsets.pipelines_offsets(self.services.kafka, pipelines)
                    found = KafkaFigures(offsets, problems)
                except (planning.PlanError, KafkaException) as exc:
                    found = KafkaFigures(None, error=str(exc))
                self._offsets = (now, names, found)
            found = self._offsets[2]
            if found.offsets is None:
                return found
            found.oldest_unread = self._oldest_unread(found.offsets, positions)
            return found

    def _oldest_unread(self, offsets: dict[str, dict[TopicPartition, PartitionOffsets]],
                       positions: dict[str, dict[TopicPartition, int]]) -> dict[tuple[TopicPartition, int], float]:
        waiting = {w for name, held in offsets.items()
                   for w in planning.unread_positions(positions.get(name, {}), held).items()}
        asked = waiting - set(self._stamps)
        if asked:
            try:
                stamps = kafka_offsets.position_timestamps(self.services.kafka, asked, timeout=2.0)
            except (planning.PlanError, KafkaException) as exc:
                log.warning("oldest unread records' timestamps unknown: %s", exc)
                stamps = {}
            # A partition that did not answer is asked again next time.
            self._stamps.update({key: ms / 1000 for key, ms in stamps.items()})
        self._stamps = {key: value for key, value in self._stamps.items() if key in waiting}
        return dict(self._stamps)


def _top_reasons(counts: dict[str, int]) -> list[tuple[str, int]]:
    """The MAX_REASONS most frequent reasons by name, the others summed as OTHER_REASONS."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept = sorted(ranked[:MAX_REASONS])
    rest = sum(count for _, count in ranked[MAX_REASONS:])
    return kept + ([(OTHER_REASONS, rest)] if rest else [])


def _labels(pipeline: PipelineConfig, tp: TopicPartition) -> list[str]:
    return [pipeline.name, tp.topic, str(tp.partition)]


def _epoch(value: datetime) -> float:
    return value.timestamp()


def families(pipelines: list[PipelineConfig], found: LedgerFigures, kafka: KafkaFigures | None,
             now: float) -> Iterator[Metric]:
    """The metric families of `pipelines` from the ledger's and Kafka's figures at `now` (epoch seconds; pure: no
    look-up of its own)."""
    partition = ["pipeline", "topic", "partition"]
    end = GaugeMetricFamily(f"{PREFIX}_partition_end_offset", "The partition's end offset (read_committed)",
                            labels=partition)
    log_start = GaugeMetricFamily(f"{PREFIX}_partition_log_start_offset",
                                  "The partition's first offset still in Kafka (retention deletes those before it)",
                                  labels=partition)
    committed = GaugeMetricFamily(f"{PREFIX}_partition_committed_offset",
                                  "The pipeline's committed position in the partition: every offset before it is "
                                  "published", labels=partition)
    lag = GaugeMetricFamily(f"{PREFIX}_partition_lag_records",
                            "Offsets between the committed position and the end offset", labels=partition)
    oldest = GaugeMetricFamily(f"{PREFIX}_partition_oldest_unread_timestamp_seconds",
                               "Kafka timestamp of the oldest record not yet published (lag in seconds: time() - "
                               "this; absent when caught up)", labels=partition)
    newest = GaugeMetricFamily(f"{PREFIX}_newest_published_timestamp_seconds",
                               "Kafka timestamp of the newest record published from the partition (freshness: "
                               "time() - this)", labels=partition)
    group_lag = GaugeMetricFamily("kafka_consumergroup_group_lag",
                                  "kafka-lag-exporter's lag in offsets, the group being the pipeline's (its mirrored "
                                  "consumer group, else its name)",
                                  labels=["cluster_name", "group", "topic", "partition"])
    group_lag_seconds = GaugeMetricFamily("kafka_consumergroup_group_lag_seconds",
                                          "kafka-lag-exporter's lag in seconds (0 when caught up)",
                                          labels=["cluster_name", "group", "topic", "partition"])
    kafka_known = GaugeMetricFamily(f"{PREFIX}_kafka_offsets_known",
                                    "1 when Kafka answered for the pipeline's partitions, 0 when not (a topic "
                                    "missing, Kafka unreachable)", labels=["pipeline"])
    info = GaugeMetricFamily(f"{PREFIX}_pipeline_info", "A declared pipeline (always 1) and how it writes",
                             labels=["pipeline", "dag_id", "write", "delivery_mode"])
    last_commit = GaugeMetricFamily(f"{PREFIX}_last_commit_timestamp_seconds", "When the newest batch committed",
                                    labels=["pipeline"])
    batches = CounterMetricFamily(f"{PREFIX}_batches", "Batches that ended, by how (committed, abandoned by a reset)",
                                  labels=["pipeline", "status"])
    unfinished = GaugeMetricFamily(f"{PREFIX}_unfinished_batches",
                                   "Batches planned and not ended, by status (planned, written, failed)",
                                   labels=["pipeline", "status"])
    attempts = CounterMetricFamily(f"{PREFIX}_batch_attempts", "Spark job attempts of the pipeline's batches",
                                   labels=["pipeline"])
    published = CounterMetricFamily(f"{PREFIX}_records_published", "Records the committed batches published "
                                    "(a replay's count again)", labels=["pipeline"])
    dead_letters = CounterMetricFamily(f"{PREFIX}_dead_letters", "Records kept as dead letters, by reason",
                                       labels=["pipeline", "reason"])
    lost = CounterMetricFamily(f"{PREFIX}_lost_records", "Offsets retention deleted before they were read, "
                               "recorded by the batch that skipped them (on_data_loss: skip; 0 for latest_only)",
                               labels=["pipeline"])
    verified = GaugeMetricFamily(f"{PREFIX}_last_verify_timestamp_seconds", "When the pipeline's last verify ended",
                                 labels=["pipeline"])
    verify_result = GaugeMetricFamily(f"{PREFIX}_last_verify_result",
                                      "1 for what the last verify concluded: ok, problems (records lost, doubled or "
                                      "misplaced), unverified (it could not check); 0 for the others",
                                      labels=["pipeline", "result"])
    concluded = GaugeMetricFamily(f"{PREFIX}_last_concluded_verify_timestamp_seconds",
                                  "When the pipeline's last verify that could check (ok or problems) ended",
                                  labels=["pipeline"])
    durations = HistogramMetricFamily(f"{PREFIX}_batch_duration_seconds",
                                      "Committed batches' seconds in each stage (queued, read, commit, total)",
                                      labels=["pipeline", "stage"])
    offsets = kafka.offsets if kafka is not None and kafka.offsets is not None else {}
    oldest_unread = kafka.oldest_unread if kafka is not None else {}
    for pipeline in pipelines:
        name = pipeline.name
        info.add_metric([name, pipeline.dag_id, pipeline.write, pipeline.delivery_mode], 1)
        held = found.positions.get(name, {})
        kafka_known.add_metric([name], 1 if name in offsets else 0)
        held_offsets = offsets.get(name, {})
        lags = planning.partition_lag({tp: r.position for tp, r in held.items()}, held_offsets,
                                      pipeline.start_position)
        group = pipeline.mirror_consumer_group or name
        for tp in sorted(set(held) | set(held_offsets)):
            labels = _labels(pipeline, tp)
            if tp in held:
                committed.add_metric(labels, held[tp].position)
                if held[tp].newest_timestamp is not None:
                    newest.add_metric(labels, _epoch(held[tp].newest_timestamp))
            if tp in held_offsets:
                end.add_metric(labels, held_offsets[tp].end)
                log_start.add_metric(labels, held_offsets[tp].log_start)
                lag.add_metric(labels, lags[tp])
                group_lag.add_metric([LAG_EXPORTER_CLUSTER, group, tp.topic, str(tp.partition)], lags[tp])
                # The record a lagging pipeline waits for is the one at its own position.
                stamp = oldest_unread.get((tp, held[tp].position)) if tp in held else None
                if lags[tp] == 0:
                    group_lag_seconds.add_metric([LAG_EXPORTER_CLUSTER, group, tp.topic, str(tp.partition)], 0)
                elif stamp is not None:
                    oldest.add_metric(labels, stamp)
                    group_lag_seconds.add_metric([LAG_EXPORTER_CLUSTER, group, tp.topic, str(tp.partition)],
                                                 max(0.0, now - stamp))
        by_status = found.batches.get(name, {})
        for status in FINAL_STATUSES:
            batches.add_metric([name, status], by_status.get(status, 0))
        for status in UNFINISHED_STATUSES:
            unfinished.add_metric([name, status], by_status.get(status, 0))
        attempts.add_metric([name], found.attempts.get(name, 0))
        published.add_metric([name], found.records_published.get(name, 0))
        if name in found.last_commit:
            last_commit.add_metric([name], _epoch(found.last_commit[name]))
        for reason, count in _top_reasons(found.dead_letters.get(name, {})):
            dead_letters.add_metric([name, reason], count)
        # latest_only skips on purpose what it does not read: none of it is a loss.
        lost.add_metric([name], 0 if pipeline.delivery_mode == "latest_only" else found.lost_offsets.get(name, 0))
        if name in found.verified:
            verified_at, result, concluded_at = found.verified[name]
            verified.add_metric([name], _epoch(verified_at))
            if concluded_at is not None:
                concluded.add_metric([name], _epoch(concluded_at))
            for possible in sql.VERIFY_RESULTS:
                verify_result.add_metric([name, possible], 1 if possible == result else 0)
        for stage in BATCH_STAGES:
            counts, total, seconds = found.durations.get((name, stage), ([0] * len(DURATION_BUCKETS), 0, 0.0))
            buckets = [(str(bound), count) for bound, count in zip(DURATION_BUCKETS, counts, strict=True)]
            durations.add_metric([name, stage], [*buckets, ("+Inf", total)], seconds)
    yield from (info, end, log_start, committed, lag, oldest, newest, group_lag, group_lag_seconds, kafka_known,
                last_commit, batches, unfinished, attempts, published, dead_letters, lost, verified, verify_result,
                concluded, durations)


class LedgerCollector(Collector):
    """The collector behind the endpoint: the declared pipelines' figures, read from the ledger and Kafka per scrape.

    `pipelines` gives the declared pipelines (read again at every scrape: a pipeline declared since shows).
    """

    def __init__(self, services: Services, pipelines: Callable[[], Iterable[PipelineConfig]],
                 kafka_ttl_seconds: float = KAFKA_CACHE_SECONDS):
        self.services, self.pipelines = services, pipelines
        self.kafka = KafkaLookups(services, kafka_ttl_seconds)

    def describe(self) -> list[Metric]:
        return []  # no look-up when the collector is registered

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        up = up_family()
        try:
            pipelines = sorted(self.pipelines(), key=lambda p: p.name)
        except Exception as exc:  # noqa: BLE001 - a broken pipelines file is a scrape's finding, not a crash
            log.warning("metrics: cannot read the pipelines: %s", exc)
            up.add_metric(["pipelines"], 0)
            yield up
            return
        up.add_metric(["pipelines"], 1)
        try:
            with ledger.transaction(self.services.ledger) as cur:
                found = read_ledger(cur, [p.name for p in pipelines])
        except Exception as exc:  # noqa: BLE001 - the ledger unreachable is what kafka_ledger_up says
            log.warning("metrics: the ledger did not answer: %s", exc)
            up.add_metric(["ledger"], 0)
            yield up
            return
        up.add_metric(["ledger"], 1)
        positions = {name: {tp: r.position for tp, r in held.items()} for name, held in found.positions.items()}
        kafka = self.kafka.figures(pipelines, positions)
        if kafka.error:
            log.warning("metrics: Kafka did not answer: %s", kafka.error)
        up.add_metric(["kafka"], 0 if kafka.offsets is None else 1)
        yield from families(pipelines, found, kafka, time.time())
        yield up
        took = scrape_duration_family()
        took.add_metric([], time.monotonic() - started)
        yield took


def up_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_up", "1 when the source answered this scrape (ledger, kafka, pipelines)",
                             labels=["source"])


def scrape_duration_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_scrape_duration_seconds", "How long this scrape's look-ups took")


def served_series() -> set[str]:
    """The name of every series the endpoint serves (a counter's with _total, a histogram's _bucket, _sum and
    _count): what a dashboard or an alert rule may ask for."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    every = [*families([], LedgerFigures(), None, 0.0), up_family(), scrape_duration_family()]
    return {f"{family.name}{suffix}" for family in every for suffix in suffixes[family.type]}


class MetricsAuthError(ValueError):
    """The endpoint would serve without authentication where that is not allowed."""


@dataclass(frozen=True)
class Credentials:
    """What a scrape must present: a bearer token, or basic auth's `user:password` (either one, or both)."""

    token: SecretStr | None = None
    basic: SecretStr | None = None

    def __bool__(self) -> bool:
        return self.token is not None or self.basic is not None

    def admits(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return hmac.compare_digest(given.strip().encode(), self.token.get_secret_value().encode())
        if scheme.lower() == "basic" and self.basic is not None:
            try:
                decoded = base64.b64decode(given.strip(), validate=True)
            except ValueError:
                return False
            return hmac.compare_digest(decoded, self.basic.get_secret_value().encode())
        return False


def registry_of(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(collector: Collector) -> str:
    """One scrape's text, as the endpoint would serve it (`kafka-ledger metrics show`)."""
    return generate_latest(registry_of(collector)).decode()


def wsgi_app(collector: Collector, credentials: Credentials) -> Callable:
    """The endpoint: the collector's scrape for a request that presents `credentials` (none asked when empty)."""
    metrics = make_wsgi_app(registry_of(collector))
    challenge = 'Bearer realm="kafka-ledger metrics"' if credentials.token else 'Basic realm="kafka-ledger metrics"'

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if credentials and not credentials.admits(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("WWW-Authenticate", challenge), ("Content-Type", "text/plain")])
            return [b"kafka-ledger metrics: authentication required\n"]
        return metrics(environ, start_response)

    return app


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) as (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(listen: str, collector: Collector, credentials: Credentials,
                allow_unauthenticated: bool = False) -> ThreadingWSGIServer:
    """The endpoint's HTTP server, bound to `listen` (not yet serving). Without credentials it is refused unless
    `allow_unauthenticated` and `listen` is a loopback address: anything that can reach it would read the
    pipelines' topics and figures."""
    host, port = parse_listen(listen)
    if not credentials and not (allow_unauthenticated and is_loopback(host)):
        raise MetricsAuthError(
            "the metrics endpoint needs KAFKA_LEDGER_METRICS_TOKEN (a bearer token) or KAFKA_LEDGER_METRICS_BASIC_AUTH "
            "(user:password); --no-auth serves without either, on a loopback address only")

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            log.debug("metrics: " + format, *args)

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = wsgi_server(host, port, wsgi_app(collector, credentials), Server, handler_class=QuietHandler)
    # A scrape makes tens of thousands of short-lived objects, enough to start the collector's full passes, each over
    # every object the process's imports made: 150 ms of a 100 ms scrape. Frozen, those are passed over.
    gc.freeze()
    return server
