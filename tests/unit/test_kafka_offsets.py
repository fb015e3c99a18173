"""Kafka look-ups give up early when the broker keeps refusing the client, and only then; a client ends with its
last reference."""

import gc
import time
import weakref

import pytest
from confluent_kafka import KafkaError

from kafka_ledger.config.services import KafkaClient
from kafka_ledger.kafka import offsets as kafka_offsets

NOWHERE = "127.0.0.1:1"  # nothing listens on port 1: every connection attempt fails at once


def client() -> kafka_offsets.ReportingAdminClient:
    return kafka_offsets.ReportingAdminClient({"bootstrap.servers": NOWHERE, "reconnect.backoff.max.ms": 100})


def test_a_broker_that_keeps_refusing_stops_the_look_up_at_once():
    admin = client()
    for _ in range(kafka_offsets.REFUSALS_TO_STOP):
        admin.reports(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: bad password"))
    began = time.monotonic()
    with pytest.raises(kafka_offsets.KafkaUnavailable, match="SASL authentication error: bad password"):
        admin.topics(KafkaClient(NOWHERE), timeout=30)
    assert time.monotonic() - began < 5


def test_a_single_refusal_or_an_unreachable_broker_waits_for_the_timeout():
    admin = client()
    admin.reports(KafkaError(KafkaError._SSL, "SSL handshake failed: Disconnected"))
    began = time.monotonic()
    with pytest.raises(kafka_offsets.KafkaUnavailable, match=f"cannot reach Kafka at {NOWHERE}"):
        admin.topics(KafkaClient(NOWHERE), timeout=2.5)
    assert 2.4 <= time.monotonic() - began < 6


def test_an_admin_client_ends_with_its_last_reference_not_at_the_next_full_garbage_collection():
    """Its error callback holds no reference back to it: a run carrying hundreds of batches, each looking offsets up
    with a client of its own, must not pile up clients (each with its librdkafka threads and sockets)."""
    gc.disable()
    try:
        ended = weakref.ref(client())
        assert ended() is None
    finally:
        gc.enable()
