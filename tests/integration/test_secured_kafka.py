"""Pipelines over the local broker's SASL_SSL listener (SCRAM-SHA-512 over TLS), in both Spark runtimes."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import psycopg2
import pytest
from integration_support import BAD_VALUES, SECURED_SERVERS, good_value, other_ca, secured_kafka_settings

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.services import KAFKA_CONFIG_ENV, LedgerDatabase
from kafka_ledger.config.settings import kafka_for, services_for
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ops import readback as audit
from kafka_ledger.ops.verify import verify_pipeline

pytestmark = pytest.mark.integration

@pytest.fixture
def over_sasl_ssl(monkeypatch):
    """Point every client of this process (and the Spark jobs it starts) at the secured listener."""

    def use(settings: dict[str, str]) -> None:
        monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", SECURED_SERVERS)
        monkeypatch.setenv(KAFKA_CONFIG_ENV, json.dumps(settings))

    return use


@pytest.mark.parametrize("runtime", ["connect", "submit"])
def test_a_pipeline_runs_exactly_once_over_sasl_ssl(
    runtime, dsn, servers, pipeline_factory, producer, over_sasl_ssl, monkeypatch
):
    pipeline = pipeline_factory(f"secure_{runtime}", partitions=3)
    topic = pipeline.topics[0]
    bad, reason = BAD_VALUES[0]
    landed = producer.send(topic, [good_value(i) for i in range(300)] + [bad])  # over the plaintext listener

    over_sasl_ssl(secured_kafka_settings())
    outcome = run_pipeline_dag(pipeline)
    assert outcome.state == "success", outcome
    produced = audit.kafka_record_ids(kafka_for(SECURED_SERVERS), pipeline.topics)
    stored = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline)
    assert max(Counter(stored.output).values()) == 1
    assert set(stored.output) | set(stored.dead_letters) == produced == set(landed)
    assert set(stored.dead_letters) == {landed[-1]}
    report = verify_pipeline(services_for(dsn, SECURED_SERVERS), pipeline, full=True)
    assert report.ok and report.kafka_records == 301, report.problems
    # The password reached Spark as options, never its logs.
    server_log = Path(os.environ.get("KL_STATE", ".stack")) / "logs" / "spark-connect.log"
    if server_log.exists():
        assert os.environ["KL_KAFKA_SASL_PASSWORD"] not in server_log.read_text(errors="replace")

    # The client settings change (here back to the plaintext listener, as a rotated password would): the warm
    # server's pooled consumers for these partitions hold the old ones, and the next batch must still read.
    more = producer.send(topic, [good_value(i) for i in range(300, 400)])
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", servers)
    monkeypatch.setenv(KAFKA_CONFIG_ENV, "{}")
    outcome = run_pipeline_dag(pipeline)
    assert outcome.state == "success", outcome
    stored = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline)
    assert max(Counter(stored.output).values()) == 1
    assert set(stored.output) | set(stored.dead_letters) == set(landed) | set(more)


@pytest.mark.parametrize("problem", ["password", "certificate"])
def test_a_refused_connection_fails_the_plan_clearly_and_writes_nothing(
    problem, dsn, pipeline_factory, producer, over_sasl_ssl, tmp_path
):
    pipeline = pipeline_factory(f"secure_refused_{problem}", partitions=1)
    producer.send(pipeline.topics[0], [good_value(i) for i in range(5)])
    if problem == "password":  # a wrong one
        over_sasl_ssl(secured_kafka_settings(**{"sasl.password": "not-the-password"}))
        expected = "SASL authentication error"
    else:  # the broker's, signed by a CA the client does not trust
        over_sasl_ssl(secured_kafka_settings(**{"ssl.ca.location": str(other_ca(tmp_path))}))
        expected = "certificate verify failed"
    with pytest.raises(kafka_offsets.KafkaUnavailable) as raised:
        plan_next_batch(services_for(dsn, SECURED_SERVERS), pipeline)
    assert str(raised.value).startswith(f"cannot reach Kafka at {SECURED_SERVERS}: ")
    assert expected in str(raised.value)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM kafka_ledger.batches WHERE pipeline = %s", (pipeline.name,))
        assert cur.fetchone() == (0,)
    conn.close()
