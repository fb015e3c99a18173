"""Bad records on the real stack: each one ends in the dead letters with its reason, and nothing else is lost."""

from __future__ import annotations

import psycopg2
import pytest
from integration_support import CASES, NEAR_MAX, assert_exactly_once, good_value, verify_ok

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.ops import readback as audit

pytestmark = pytest.mark.integration

def test_each_bad_record_is_dead_lettered_with_its_reason_and_its_raw_bytes(dsn, servers, pipeline_factory):
    from confluent_kafka import Producer

    pipeline = pipeline_factory("bad_records", partitions=1)
    topic = pipeline.topics[0]
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
    landed: dict[str, tuple[str, int, int]] = {}
    names = ["good before"] + list(CASES) + ["good after"]
    values = {"good before": (good_value(0), b"k"), "good after": (good_value(2), b"k"),
              **{name: (value, key) for name, (value, key, _) in CASES.items()}}
    for name in names:
        value, key = values[name]

        def report(err, msg, name=name) -> None:  # noqa: ANN001 - confluent-kafka callback
            assert err is None, err
            landed[name] = (msg.topic(), msg.partition(), msg.offset())

        producer.produce(topic, key=key, value=value, partition=0, on_delivery=report)
        producer.flush(30)

    assert run_pipeline_dag(pipeline).state == "success"
    expected_dead = {landed[name]: reason for name, (_, _, reason) in CASES.items() if reason}
    assert_exactly_once(dsn, servers, pipeline, expected_dead)
    published = set(audit.postgres_record_ids(LedgerDatabase(dsn), pipeline).output)
    assert {landed[name] for name in ("good before", "good after", "null key",
                                      "value near the max message size")} == published
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT kafka_offset, kafka_value, kafka_key FROM kafka_ledger.dead_letters WHERE pipeline = %s",
                    (pipeline.name,))
        raw = {offset: (None if value is None else bytes(value), key) for offset, value, key in cur.fetchall()}
        cur.execute(f"SELECT length(event_id) FROM {pipeline.output_schema}.{pipeline.output_table} "
                    "WHERE kafka_offset = %s", (landed["value near the max message size"][2],))
        assert cur.fetchone()[0] == NEAR_MAX + 3
    conn.close()
    for name, (value, _, reason) in CASES.items():
        if reason:
            assert raw[landed[name][2]][0] == value, f"{name}: the raw value must be kept byte for byte"
    verify_ok(pipeline)
