"""Kafka look-ups give up early when the broker keeps refusing the client, and only then; a client ends with its
last reference."""

import gc
import time
import weakref

import pytest
from confluent_kafka import KafkaError, KafkaException

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


class _Answers:
    """An admin client's list_offsets whose partitions answer, request by request, as scripted."""

    def __init__(self, *rounds: dict[int, int | KafkaError]):
        self.rounds, self.asked = list(rounds), []

    def list_offsets(self, request, **_):
        from concurrent.futures import Future

        answers = self.rounds.pop(0)
        self.asked.append(sorted(k.partition for k in request))
        futures = {}
        for key in request:
            future, answer = Future(), answers[key.partition]
            if isinstance(answer, KafkaError):
                future.set_exception(KafkaException(answer))
            else:
                future.set_result(type("Info", (), {"offset": answer}))
            futures[key] = future
        return futures


def test_partitions_whose_leader_is_moving_are_asked_again_and_other_errors_fail_at_once():
    from confluent_kafka.admin import OffsetSpec

    from kafka_ledger.model.ranges import TopicPartition

    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    moving = KafkaError(KafkaError.UNKNOWN_LEADER_EPOCH)
    admin = _Answers({0: 5, 1: moving}, {1: 7})
    assert kafka_offsets.list_offsets(admin, tps, OffsetSpec.latest(), 10) == {tps[0]: 5, tps[1]: 7}
    assert admin.asked == [[0, 1], [1]]
    no_leaders = KafkaError(KafkaError._NOENT, "Failed to query partition leaders: No leaders found")
    assert kafka_offsets.list_offsets(_Answers({0: no_leaders, 1: 2}, {0: 3}), tps, OffsetSpec.latest(), 10) == {
        tps[0]: 3, tps[1]: 2}
    with pytest.raises(KafkaException):
        kafka_offsets.list_offsets(_Answers({0: 5, 1: KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)}), tps,
                                   OffsetSpec.latest(), 10)
