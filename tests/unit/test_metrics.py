"""The Prometheus endpoint's pure parts: the series from the ledger's and Kafka's figures, authentication, listening."""

import base64
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from pydantic import SecretStr

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.ledger.db import PositionRow
from kafka_ledger.model.ranges import PartitionOffsets, TopicPartition
from kafka_ledger.ops import metrics

NOW = datetime(2026, 11, 27, 12, tzinfo=UTC).timestamp()


def pipeline(**overrides) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "clicks", "topics": ["clicks"], "output_table": "clicks",
        "columns": [{"name": "id", "type": "string"}], **overrides,
    })


class Fixed(Collector):
    def __init__(self, pipelines, found, kafka):
        self.args = (pipelines, found, kafka)

    def collect(self):
        return metrics.families(*self.args, NOW)


def samples(pipelines, found, kafka) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape, parsed back from the exposition text as Prometheus would read it."""
    text = metrics.exposition(Fixed(pipelines, found, kafka))
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def at(name: str, **labels) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def position_row(topic: str, partition: int, position: int, newest: datetime | None = None) -> PositionRow:
    return PositionRow(topic, partition, position, 0, None, datetime(2026, 11, 27, tzinfo=UTC), newest)


def figures() -> metrics.LedgerFigures:
    newest = datetime(2026, 11, 27, 11, 59, tzinfo=UTC)
    return metrics.LedgerFigures(
        positions={"clicks": {TopicPartition("clicks", 0): position_row("clicks", 0, 70, newest),
                              TopicPartition("clicks", 1): position_row("clicks", 1, 60)}},
        batches={"clicks": {"committed": 5, "failed": 1, "abandoned": 1}}, attempts={"clicks": 10},
        records_published={"clicks": 130}, last_commit={"clicks": newest},
        dead_letters={"clicks": {"malformed JSON (not a JSON object)": 3}}, lost_offsets={"clicks": 10},
        verified={"clicks": (newest, "problems", newest - timedelta(days=1))},
        durations={("clicks", "total"): ([0, 1, 3] + [5] * 9, 5, 12.5)},
    )


def test_a_scrape_gives_each_partitions_offsets_lag_and_timestamps_and_each_pipelines_counts():
    tp0, tp1, tp2 = (TopicPartition("clicks", p) for p in range(3))
    kafka = metrics.KafkaFigures({"clicks": {tp0: PartitionOffsets(0, 100), tp1: PartitionOffsets(50, 60),
                                             tp2: PartitionOffsets(5, 9)}},
                                 oldest_unread={(tp0, 70): NOW - 42.0})
    got = samples([pipeline()], figures(), kafka)

    p0, p1, p2 = ({"pipeline": "clicks", "topic": "clicks", "partition": str(p)} for p in range(3))
    assert got[at("kafka_ledger_partition_end_offset", **p0)] == 100
    assert got[at("kafka_ledger_partition_log_start_offset", **p1)] == 50
    assert got[at("kafka_ledger_partition_committed_offset", **p0)] == 70
    assert (at("kafka_ledger_partition_committed_offset", **p2)) not in got  # never read
    assert [got[at("kafka_ledger_partition_lag_records", **p)] for p in (p0, p1, p2)] == [30, 0, 4]
    # Lag in seconds: where the oldest unread record's timestamp is known, and never for a caught-up partition.
    assert got[at("kafka_ledger_partition_oldest_unread_timestamp_seconds", **p0)] == NOW - 42.0
    assert at("kafka_ledger_partition_oldest_unread_timestamp_seconds", **p1) not in got
    group = {"cluster_name": "kafka-ledger", "group": "clicks", "topic": "clicks"}
    assert got[at("kafka_consumergroup_group_lag", **group, partition="0")] == 30
    assert got[at("kafka_consumergroup_group_lag_seconds", **group, partition="0")] == 42.0
    assert got[at("kafka_consumergroup_group_lag_seconds", **group, partition="1")] == 0
    assert got[at("kafka_ledger_newest_published_timestamp_seconds", **p0)] == NOW - 60
    assert at("kafka_ledger_newest_published_timestamp_seconds", **p1) not in got

    assert got[at("kafka_ledger_batches_total", pipeline="clicks", status="committed")] == 5
    assert got[at("kafka_ledger_batches_total", pipeline="clicks", status="abandoned")] == 1
    assert got[at("kafka_ledger_unfinished_batches", pipeline="clicks", status="failed")] == 1
    assert got[at("kafka_ledger_unfinished_batches", pipeline="clicks", status="planned")] == 0
    assert got[at("kafka_ledger_batch_attempts_total", pipeline="clicks")] == 10
    assert got[at("kafka_ledger_records_published_total", pipeline="clicks")] == 130
    assert got[at("kafka_ledger_dead_letters_total", pipeline="clicks",
                  reason="malformed JSON (not a JSON object)")] == 3
    assert got[at("kafka_ledger_lost_records_total", pipeline="clicks")] == 10
    assert got[at("kafka_ledger_last_commit_timestamp_seconds", pipeline="clicks")] == NOW - 60
    assert got[at("kafka_ledger_last_verify_timestamp_seconds", pipeline="clicks")] == NOW - 60
    assert {result: got[at("kafka_ledger_last_verify_result", pipeline="clicks", result=result)]
            for result in ("ok", "problems", "unverified")} == {"ok": 0, "problems": 1, "unverified": 0}
    assert got[at("kafka_ledger_last_concluded_verify_timestamp_seconds", pipeline="clicks")] == NOW - 60 - 86400
    assert got[at("kafka_ledger_kafka_offsets_known", pipeline="clicks")] == 1
    total = {"pipeline": "clicks", "stage": "total"}
    assert got[at("kafka_ledger_batch_duration_seconds_bucket", **total, le="1.0")] == 1
    assert got[at("kafka_ledger_batch_duration_seconds_bucket", **total, le="+Inf")] == 5
    assert got[at("kafka_ledger_batch_duration_seconds_count", **total)] == 5
    assert got[at("kafka_ledger_batch_duration_seconds_sum", **total)] == 12.5
    # A stage no batch measured yet is an empty histogram, not a missing one.
    assert got[at("kafka_ledger_batch_duration_seconds_count", pipeline="clicks", stage="read")] == 0


def test_without_kafka_the_ledgers_figures_remain_and_the_group_is_the_mirrored_one():
    got = samples([pipeline(mirror_consumer_group="team.clicks")], figures(),
                  metrics.KafkaFigures(None, error="cannot reach Kafka"))

    assert got[at("kafka_ledger_partition_committed_offset", pipeline="clicks", topic="clicks", partition="0")] == 70
    assert got[at("kafka_ledger_kafka_offsets_known", pipeline="clicks")] == 0
    assert not [key for key in got if key[0] in ("kafka_ledger_partition_lag_records", "kafka_consumergroup_group_lag")]

    kafka = metrics.KafkaFigures({"clicks": {TopicPartition("clicks", 0): PartitionOffsets(0, 80)}})
    got = samples([pipeline(mirror_consumer_group="team.clicks")], figures(), kafka)
    assert got[at("kafka_consumergroup_group_lag", cluster_name="kafka-ledger", group="team.clicks", topic="clicks",
                  partition="0")] == 10


def test_a_pipeline_the_ledger_has_never_seen_shows_zero_counts():
    got = samples([pipeline(name="fresh")], metrics.LedgerFigures(), metrics.KafkaFigures({}))

    assert got[at("kafka_ledger_batches_total", pipeline="fresh", status="committed")] == 0
    assert got[at("kafka_ledger_records_published_total", pipeline="fresh")] == 0
    assert got[at("kafka_ledger_pipeline_info", pipeline="fresh", dag_id="kafka_ledger__fresh", write="append",
                  delivery_mode="exactly_once")] == 1
    assert at("kafka_ledger_last_commit_timestamp_seconds", pipeline="fresh") not in got


def test_the_endpoint_admits_only_the_token_or_the_basic_credentials():
    both = metrics.Credentials(SecretStr("t0ken"), SecretStr("prometheus:s3cret"))
    basic = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()

    assert both.admits("Bearer t0ken") and both.admits(basic)
    assert not both.admits(None) and not both.admits("Bearer wrong") and not both.admits("Basic !!!")
    assert not both.admits("Basic " + base64.b64encode(b"prometheus:wrong").decode())
    assert not metrics.Credentials(token=SecretStr("t0ken")).admits(basic)


def test_the_endpoint_answers_401_without_credentials():
    app = metrics.wsgi_app(Fixed([pipeline()], metrics.LedgerFigures(), None),
                           metrics.Credentials(token=SecretStr("t0ken")))
    statuses = []

    def start_response(status, headers):
        statuses.append((status, dict(headers)))

    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics"}, start_response))
    assert statuses[-1][0] == "401 Unauthorized" and statuses[-1][1]["WWW-Authenticate"].startswith("Bearer")
    assert b"kafka_ledger" not in body.replace(b"kafka-ledger", b"")

    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": "Bearer t0ken"},
                        start_response))
    assert statuses[-1][0] == "200 OK" and b"kafka_ledger_pipeline_info" in body


def test_serving_without_credentials_is_refused_unless_asked_for_on_loopback():
    collector = Fixed([], metrics.LedgerFigures(), None)
    with pytest.raises(metrics.MetricsAuthError, match="KAFKA_LEDGER_METRICS_TOKEN"):
        metrics.make_server("127.0.0.1:0", collector, metrics.Credentials())
    with pytest.raises(metrics.MetricsAuthError):
        metrics.make_server("0.0.0.0:0", collector, metrics.Credentials(), allow_unauthenticated=True)
    server = metrics.make_server("127.0.0.1:0", collector, metrics.Credentials(), allow_unauthenticated=True)
    server.server_close()


@pytest.mark.parametrize(("listen", "parsed"), [("127.0.0.1:9464", ("127.0.0.1", 9464)),
                                                ("[::1]:9464", ("::1", 9464)), ("localhost:1", ("localhost", 1))])
def test_listen_addresses(listen, parsed):
    assert metrics.parse_listen(listen) == parsed


@pytest.mark.parametrize("listen", ["9464", "host:", ":9464", "host:port"])
def test_bad_listen_addresses_are_refused_with_an_example(listen):
    with pytest.raises(ValueError, match="HOST:PORT"):
        metrics.parse_listen(listen)


def test_only_the_most_frequent_dead_letter_reasons_get_a_series_of_their_own():
    reasons = {f"unexpected field(s): f{n}": n + 1 for n in range(metrics.MAX_REASONS + 5)}
    found = metrics.LedgerFigures(dead_letters={"clicks": reasons})
    got = samples([pipeline()], found, None)
    served = {dict(key)["reason"]: value for (name, key), value in got.items()
              if name == "kafka_ledger_dead_letters_total"}
    assert len(served) == metrics.MAX_REASONS + 1
    assert served[metrics.OTHER_REASONS] == sum(range(1, 6))  # the five least frequent
    assert sum(served.values()) == sum(reasons.values())


def test_the_histogram_adds_up_the_batches_counted_under_each_bound():
    # Counted by migration 0018's trigger: each batch under the smallest bound its seconds fit, inf above the last.
    counts, total, seconds = metrics.histogram({0.5: (2, 0.6), 5.0: (1, 4.0), float("inf"): (1, 5000.0)})
    assert counts[:4] == [2, 2, 2, 3] and counts[-1] == 3 and (total, seconds) == (4, 5004.6)


def test_the_migration_counts_batches_under_the_buckets_the_endpoint_serves():
    migration = next((Path(metrics.__file__).parents[1] / "ledger" / "migrations" / "versions").glob(
        "0018_*.py")).read_text()
    bounds = re.search(r'BUCKETS = "ARRAY\[([^\]]*)\]', migration).group(1)
    assert tuple(float(b) for b in bounds.split(",")) == metrics.DURATION_BUCKETS


def test_a_latest_only_pipeline_loses_nothing_it_skips():
    found = metrics.LedgerFigures(lost_offsets={"clicks": 40})
    got = samples([pipeline(delivery_mode="latest_only")], found, None)
    assert got[at("kafka_ledger_lost_records_total", pipeline="clicks")] == 0


def test_two_pipelines_reading_one_topic_each_get_the_age_of_their_own_oldest_unread_record():
    tp = TopicPartition("clicks", 0)
    found = metrics.LedgerFigures(positions={"clicks": {tp: position_row("clicks", 0, 70)},
                                             "clicks_lake": {tp: position_row("clicks", 0, 40)}})
    held = {tp: PartitionOffsets(0, 100)}
    kafka = metrics.KafkaFigures({"clicks": held, "clicks_lake": held},
                                 oldest_unread={(tp, 70): NOW - 10.0, (tp, 40): NOW - 500.0})
    got = samples([pipeline(), pipeline(name="clicks_lake")], found, kafka)
    assert {name: got[at("kafka_ledger_partition_oldest_unread_timestamp_seconds", pipeline=name, topic="clicks",
                         partition="0")] for name in ("clicks", "clicks_lake")} == {
        "clicks": NOW - 10.0, "clicks_lake": NOW - 500.0}
