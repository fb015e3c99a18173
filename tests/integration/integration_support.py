"""Helpers shared by the integration tests: test records and a producer that remembers where they landed."""

from __future__ import annotations

import json

from confluent_kafka import Producer

# The columns of every test pipeline (and of the fault campaign's).
COLUMNS = [
    {"name": "event_id", "type": "string", "required": True},
    {"name": "amount", "type": "long"},
    {"name": "price", "type": "double"},
    {"name": "ok", "type": "boolean"},
    {"name": "event_time", "type": "timestamp"},
]


def good_value(i: int) -> bytes:
    return json.dumps(
        {"event_id": f"e{i}", "amount": i, "price": i / 4, "ok": i % 2 == 0, "event_time": "2026-11-21T10:00:00Z"}
    ).encode()


# Bad records and the reason the dead-letter table must give for each.
BAD_VALUES: list[tuple[bytes | None, str]] = [
    (b'{"event_id": "x", "amount": 1', "malformed JSON (not a JSON object)"),
    (b'{"amount": 3}', "required field 'event_id' is missing or null"),
    (b'{"event_id": "y", "amount": "many"}', "field 'amount' is not a valid long"),
    (b"\xff\xfe{}", "value is not valid UTF-8"),
    (None, "null value (tombstone)"),
]


class RecordedProducer:
    """Produces records and returns each one's (topic, partition, offset) from its delivery report."""

    def __init__(self, servers: str):
        self.producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})

    def send(
        self, topic: str, values: list[bytes | None], partition: int | None = None, timestamp_ms: int | None = None,
        keys: list[str] | None = None,
    ) -> list[tuple[str, int, int]]:
        """Produce `values` in order (optionally with one Kafka timestamp, and keys; by default key i is "k{i}");
        element i says where value i landed."""
        landed: dict[int, tuple[str, int, int]] = {}
        errors: list[str] = []

        def on_delivery(index: int):
            def report(err, msg) -> None:  # noqa: ANN001 - confluent-kafka callback
                if err is not None:
                    errors.append(str(err))
                else:
                    landed[index] = (msg.topic(), msg.partition(), msg.offset())
            return report

        for i, value in enumerate(values):
            kwargs = {"partition": partition} if partition is not None else {}
            if timestamp_ms is not None:
                kwargs["timestamp"] = timestamp_ms
            key = keys[i] if keys is not None else f"k{i}"
            self.producer.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery(i), **kwargs)
            self.producer.poll(0)
        self.producer.flush(30)
        assert not errors, errors
        return [landed[i] for i in range(len(values))]
