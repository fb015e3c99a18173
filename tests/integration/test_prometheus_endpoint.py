"""The Prometheus endpoint on the real stack: its series say exactly what the ledger and Kafka hold, before and after
a batch, to a scrape that authenticates, and to no one else."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from integration_support import (
    CASES,
    cli,
    finish,
    good_value,
    listening_sockets,
    not_loopback,
    query,
    stack,
    start_task,
)
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.batch.commit import fail_batch
from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config import settings
from kafka_ledger.ops import metrics
from tools import prometheus
from tools.stack import service_pids

pytestmark = pytest.mark.integration

TOKEN = "metrics-test-token"  # noqa: S105 - a test's own token


def scrape(url: str, token: str | None = TOKEN) -> dict[tuple[str, frozenset], float]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def of(found: dict, name: str, **labels: str) -> dict[frozenset, float]:
    """The samples of `name` whose labels include `labels`, by their labels."""
    return {key: value for (metric, key), value in found.items()
            if metric == name and set(labels.items()) <= key}


def totals_match_the_tables(dsn: str, pipeline: str) -> bool:
    """Migration 0018's running totals equal the same figures computed from the ledger's own tables."""
    counts = query(dsn, "SELECT reason, dead_letters FROM kafka_ledger.dead_letter_counts WHERE pipeline = %s "
                        "AND dead_letters > 0 ORDER BY 1", pipeline)
    held = query(dsn, "SELECT error, count(*) FROM kafka_ledger.dead_letters WHERE pipeline = %s GROUP BY 1 ORDER BY 1",
                 pipeline)
    totals = query(dsn, "SELECT committed, attempts, records_published, last_committed_at "
                        "FROM kafka_ledger.batch_totals WHERE pipeline = %s", pipeline)
    computed = query(dsn, "SELECT count(*), sum(attempts), sum(records_written), max(committed_at) "
                          "FROM kafka_ledger.batches WHERE pipeline = %s AND status = 'committed'", pipeline)
    durations = query(dsn, "SELECT stage, sum(batches) FROM kafka_ledger.batch_duration_counts WHERE pipeline = %s "
                           "AND stage = 'total' GROUP BY 1", pipeline)
    assert counts == held and totals == computed and durations == [("total", computed[0][0])], (
        counts, held, totals, computed, durations)
    return True


def test_the_endpoint_shows_the_lag_then_the_published_offsets_records_and_dead_letters(dsn, servers, producer,
                                                                                      pipeline_factory):
    pipeline = pipeline_factory("metrics", partitions=2)
    topic = pipeline.topics[0]
    bad = {name: CASES[name] for name in ("malformed JSON", "wrong type", "missing required field")}
    landed = producer.send(topic, [good_value(i) for i in range(40)], partition=0, timestamp_ms=1_795_000_000_000)
    landed += producer.send(topic, [value for value, _, _ in bad.values()], partition=1,
                            timestamp_ms=1_795_000_001_000)
    services = settings.services_for(dsn, servers)
    collector = metrics.LedgerCollector(services, lambda: [pipeline], kafka_ttl_seconds=0)
    server = metrics.make_server("127.0.0.1:0", collector, metrics.Credentials(token=SecretStr(TOKEN)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(url, token=None)
        assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError):
            scrape(url, token="wrong")

        label = {"pipeline": pipeline.name, "topic": topic}
        before = scrape(url)
        assert {k: v for k, v in of(before, "kafka_ledger_partition_lag_records", **label).items()} == {
            frozenset({**label, "partition": "0"}.items()): 40, frozenset({**label, "partition": "1"}.items()): 3}
        assert not of(before, "kafka_ledger_partition_committed_offset", **label)  # never read
        assert of(before, "kafka_ledger_batches_total", pipeline=pipeline.name, status="committed") == {
            frozenset({"pipeline": pipeline.name, "status": "committed"}.items()): 0}

        assert run_pipeline_dag(pipeline).state == "success"

        after = scrape(url)
        ends = {"0": 40, "1": 3}
        for partition, end in ends.items():
            where = frozenset({**label, "partition": partition}.items())
            assert of(after, "kafka_ledger_partition_end_offset", **label)[where] == end
            assert of(after, "kafka_ledger_partition_committed_offset", **label)[where] == end
            assert of(after, "kafka_ledger_partition_lag_records", **label)[where] == 0
            assert of(after, "kafka_consumergroup_group_lag_seconds", group=pipeline.name,
                      partition=partition)
        # Caught up: no oldest unread record; the newest published one is the last good record's timestamp.
        assert not of(after, "kafka_ledger_partition_oldest_unread_timestamp_seconds", **label)
        assert list(of(after, "kafka_ledger_newest_published_timestamp_seconds", **label, partition="0").values()) \
            == [1_795_000_000.0]
        assert list(of(after, "kafka_ledger_records_published_total", pipeline=pipeline.name).values()) == [40]
        assert {dict(k)["reason"]: v for k, v in of(after, "kafka_ledger_dead_letters_total",
                                                     pipeline=pipeline.name).items()} == {
            reason: 1 for _, _, reason in bad.values()}
        assert list(of(after, "kafka_ledger_batches_total", pipeline=pipeline.name, status="committed").values()) \
            == [1]
        assert sum(of(after, "kafka_ledger_unfinished_batches", pipeline=pipeline.name).values()) == 0
        assert list(of(after, "kafka_ledger_batch_duration_seconds_count", pipeline=pipeline.name,
                       stage="total").values()) == [1]
        assert {dict(k)["source"]: v for k, v in of(after, "kafka_ledger_up").items()} == {
            "pipelines": 1, "ledger": 1, "kafka": 1}
        assert len(landed) == 43

        # A replay publishes its records again (a counter counts them again) and replaces its dead letters (held:
        # still one of each); the totals the triggers keep equal what the tables hold.
        (batch_id,) = [row[0] for row in query(dsn, "SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %s",
                                               pipeline.name)]
        code, _, err = cli("replay", pipeline.name, "--batch", str(batch_id), "--reason", "metrics test")
        assert code == 0, err
        replayed = scrape(url)
        assert list(of(replayed, "kafka_ledger_records_published_total", pipeline=pipeline.name).values()) == [80]
        assert list(of(replayed, "kafka_ledger_batches_total", pipeline=pipeline.name,
                       status="committed").values()) == [2]
        assert {dict(k)["reason"]: v for k, v in of(replayed, "kafka_ledger_dead_letters_total",
                                                     pipeline=pipeline.name).items()} == {
            reason: 1 for _, _, reason in bad.values()}
        assert totals_match_the_tables(dsn, pipeline.name)
    finally:
        server.shutdown()
        server.server_close()


def test_no_secret_reaches_a_scrape(dsn, servers, pipeline_factory):
    pipeline = pipeline_factory("metrics_secrets", partitions=1)
    services = settings.services_for(dsn, servers)
    text = metrics.exposition(metrics.LedgerCollector(services, lambda: [pipeline]))
    assert "kafka_ledger_up" in text
    for secret in services.secrets():
        assert secret not in text


def test_the_stacks_prometheus_scrapes_the_endpoint_and_promtool_accepts_a_scrape(servers):
    """`scripts/stack.sh monitoring`: the endpoint (bearer token) and Prometheus (basic auth) on loopback; a real
    scrape passes `promtool check metrics`, and Prometheus holds what it scraped."""
    stack("monitoring")
    metrics_url = f"http://127.0.0.1:{os.environ['KL_METRICS_PORT']}/metrics"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(metrics_url, timeout=30)
    assert refused.value.code == 401
    request = urllib.request.Request(metrics_url, headers={
        "Authorization": f"Bearer {os.environ['KAFKA_LEDGER_METRICS_TOKEN']}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        text = reply.read()
    promtool = Path(os.environ["KL_CACHE"]) / "prometheus" / "usr" / "bin" / "promtool"
    checked = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{prometheus.url()}/api/v1/query?query=up", timeout=30)
    assert refused.value.code == 401
    up = {labels["source"]: value for labels, value in prometheus.scraped_after("kafka_ledger_up", since=time.time())}
    assert up == {"pipelines": 1, "ledger": 1, "kafka": 1}
    pids = service_pids()
    sockets = listening_sockets([pids["metrics"], pids["prometheus"]])
    assert sockets and not_loopback(sockets) == set()


def counters(found: dict) -> dict[tuple[str, frozenset], float]:
    """The samples of every counter and histogram count: what must never go backwards."""
    return {key: value for key, value in found.items()
            if key[0].endswith(("_total", "_count", "_bucket", "_sum")) and key[0].startswith("kafka_ledger")}


@pytest.mark.own_stack  # it stops and restarts Postgres
def test_the_metrics_tell_the_truth_through_a_killed_task_and_a_postgres_restart(dsn, servers, producer,
                                                                                 pipeline_factory, tmp_path):
    pipeline = pipeline_factory("metrics_faults", partitions=2)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(500)])
    services = settings.services_for(dsn, servers)
    collector = metrics.LedgerCollector(services, lambda: [pipeline], kafka_ttl_seconds=0)

    def scrape_now() -> dict[tuple[str, frozenset], float]:
        text = metrics.exposition(collector)
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def one(found: dict, name: str, **labels: str) -> float:
        (value,) = of(found, name, **labels).values()
        return value

    def lag(found: dict) -> float:
        return sum(of(found, "kafka_ledger_partition_lag_records", pipeline=pipeline.name).values())

    batch_id = plan_next_batch(services, pipeline).batch_id
    # The task killed inside its commit's transaction, and the run giving up on it (Airflow's failure callback).
    code, _, _ = finish(start_task(pipeline, batch_id, "commit_before_end=kill", tmp_path))
    assert code != 0
    fail_batch(services, pipeline.name, batch_id, "the task was killed")
    failed = scrape_now()
    assert one(failed, "kafka_ledger_unfinished_batches", pipeline=pipeline.name, status="failed") == 1
    assert one(failed, "kafka_ledger_batches_total", pipeline=pipeline.name, status="committed") == 0
    assert one(failed, "kafka_ledger_batch_attempts_total", pipeline=pipeline.name) == 1
    assert one(failed, "kafka_ledger_records_published_total", pipeline=pipeline.name) == 0
    assert lag(failed) == 500  # unchanged: nothing was published

    code, _, err = finish(start_task(pipeline, batch_id))  # the next run resumes the same ranges
    assert code == 0, err
    drained = scrape_now()
    assert lag(drained) == 0
    assert one(drained, "kafka_ledger_unfinished_batches", pipeline=pipeline.name, status="failed") == 0
    assert one(drained, "kafka_ledger_batches_total", pipeline=pipeline.name, status="committed") == 1
    assert one(drained, "kafka_ledger_batch_attempts_total", pipeline=pipeline.name) == 2
    assert one(drained, "kafka_ledger_records_published_total", pipeline=pipeline.name) == 500
    before = counters(drained)

    stack("ctl", "stop", "postgres")
    try:
        down = scrape_now()
        assert {dict(k)["source"]: v for k, v in of(down, "kafka_ledger_up").items()} == {"pipelines": 1, "ledger": 0}
        assert counters(down) == {}  # absent, not zero: Prometheus sees no reset
    finally:
        stack("restart-postgres")
    after = counters(scrape_now())
    assert after.keys() == before.keys()
    assert [key for key, value in before.items() if after[key] < value] == []
