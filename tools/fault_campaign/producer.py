"""The fault campaign's records: sequence-numbered, every BAD_EVERY-th a bad one; their producer, which
remembers where each landed, and the reading back of where they are in Kafka (a resumed campaign)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

from kafka_ledger.config.settings import kafka_for
from tools.fault_campaign import CampaignFailure
from tools.records import BAD_VALUES

BAD_EVERY = 50  # every 50th sequence number is a bad record, cycling through BAD_VALUES
# An entity-table campaign (write: upsert, key event_id): record `seq` is a version of entity u<seq % ENTITIES>,
# every TOMBSTONE_EVERY-th one (at remainder 5) its tombstone.
ENTITIES = 97
TOMBSTONE_EVERY = 11


def entity_of(seq: int) -> str:
    return f"u{seq % ENTITIES}"


def record_value(seq: int, entity: bool = False) -> bytes | None:
    """The value of record `seq`: a good impression (an entity's version, or its tombstone: None), or (every
    BAD_EVERY-th) one of the bad records."""
    if seq % BAD_EVERY == 0:
        return BAD_VALUES[(seq // BAD_EVERY) % len(BAD_VALUES)][0]
    if entity and seq % TOMBSTONE_EVERY == 5:
        return None
    return json.dumps({"event_id": entity_of(seq) if entity else f"s{seq}", "amount": seq, "price": seq / 4,
                       "ok": seq % 2 == 0, "event_time": "2026-11-21T10:00:00Z"}).encode()


def record_key(seq: int, entity: bool = False) -> bytes:
    """Record `seq`'s Kafka key: it carries the sequence number (a resumed campaign reads it back); an entity's
    names the entity too, a JSON object as the tombstones' keys are read."""
    if entity:
        return json.dumps({"event_id": entity_of(seq), "seq": seq}).encode()
    return f"k{seq}".encode()


def sequence_number(key: bytes) -> int:
    text = key.decode()
    return json.loads(text)["seq"] if text.startswith("{") else int(text[1:])


def expected_reason(seq: int, entity: bool = False) -> str | None:
    """The dead-letter reason of record `seq`, None for a record that publishes (an entity's tombstone too)."""
    if seq % BAD_EVERY != 0 or (entity and record_value(seq, entity) is None):
        return None
    return BAD_VALUES[(seq // BAD_EVERY) % len(BAD_VALUES)][1]


class SequenceProducer:
    """Background producer of sequence-numbered records; remembers where each one landed."""

    def __init__(self, servers: str, topic: str, rate: float, landed: dict[tuple[int, int], int] | None = None,
                 entity_partitions: int | None = None):
        from confluent_kafka import Producer



        self.topic = topic
        self.rate = rate
        # An entity campaign: each entity's records in one partition (as a keyed producer's are), chosen here because
        # the keys also carry the sequence number.
        self.entity_partitions = entity_partitions
        # With the deployment's Kafka settings (security), as every client of the project; log_level 2: no
        # connection errors while a broker restarts.
        self.producer = Producer(kafka_for(servers).confluent(**{"enable.idempotence": True, "acks": "all",
                                                                 "linger.ms": 20, "log_level": 2}))
        # (partition, offset) -> seq; a resumed campaign starts from what earlier sessions produced.
        self.landed: dict[tuple[int, int], int] = dict(landed or {})
        self.delivered: Counter = Counter(p for p, _ in self.landed)  # partition -> records delivered
        self.journal: list[tuple[int, int, int]] = []  # landed since the last checkpoint
        self.errors: list[str] = []
        self.next_seq = max(self.landed.values(), default=-1) + 1
        self.quota = self.next_seq
        self.produced_here = self.reports_here = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="sequence-producer", daemon=True)
        self.thread.start()

    def allow(self, records: int) -> None:
        """Let the producer write `records` more, at its rate, while runs go on."""
        with self.lock:
            self.quota += records

    def _report(self, seq: int):
        def on_delivery(err, msg) -> None:  # noqa: ANN001 - confluent-kafka callback
            self.reports_here += 1
            if err is not None:
                self.errors.append(f"record {seq}: {err}")
            else:
                self.landed[(msg.partition(), msg.offset())] = seq
                self.delivered[msg.partition()] += 1
                self.journal.append((msg.partition(), msg.offset(), seq))
        return on_delivery

    def _produce(self) -> None:
        started, sent = time.monotonic(), 0
        while not self.stopping.is_set() or self.next_seq < self.quota:
            with self.lock:
                todo = min(self.quota - self.next_seq, 50)
            if todo <= 0:
                self.producer.poll(0.05)
                started, sent = time.monotonic(), 0
                continue
            for _ in range(todo):
                seq = self.next_seq
                while True:
                    try:
                        entity = self.entity_partitions is not None
                        where = {"partition": seq % ENTITIES % self.entity_partitions} if entity else {}
                        self.producer.produce(self.topic, key=record_key(seq, entity), value=record_value(seq, entity),
                                              on_delivery=self._report(seq), **where)
                        self.produced_here += 1
                        break
                    except BufferError:
                        self.producer.poll(0.1)
                self.next_seq += 1
            sent += todo
            self.producer.poll(0)
            # Keep to the rate, so records keep arriving while the runs read.
            ahead = sent / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(min(ahead, 0.5))
        self.producer.flush(300)

    def wait_delivered(self, positions: dict[int, int], timeout: float = 300) -> None:
        """Wait until every offset below `positions` has its delivery report."""
        deadline = time.monotonic() + timeout
        while True:
            self.producer.poll(0)
            counts = dict(self.delivered)
            if all(counts.get(p, 0) >= pos for p, pos in positions.items()):
                return
            if time.monotonic() > deadline:
                raise CampaignFailure(f"delivery reports missing below positions {positions}: have {counts}")
            time.sleep(0.1)

    def wait_delivered_some(self, records: int, timeout: float = 60) -> None:
        """Wait until `records` more records than at the start have their delivery reports (or the timeout)."""
        wanted, deadline = sum(self.delivered.values()) + records, time.monotonic() + timeout
        while sum(self.delivered.values()) < wanted and time.monotonic() < deadline:
            self.producer.poll(0.1)

    def settle(self, timeout: float = 300) -> list[tuple[int, int, int]]:
        """Wait until the quota is produced and every record has its report; return (and forget) the new ones."""
        deadline = time.monotonic() + timeout
        while self.next_seq < self.quota or self.reports_here < self.produced_here:
            if time.monotonic() > deadline:
                raise CampaignFailure(f"producer did not settle: {self.next_seq} of {self.quota} produced, "
                                      f"{sum(self.delivered.values())} delivered")
            self.producer.poll(0.1)
        new, self.journal = self.journal, []
        return new

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        if self.errors:
            raise CampaignFailure(f"{len(self.errors)} records were not delivered: {self.errors[:5]}")


def records_by_key(servers: str, topic: str, timeout: float = 300) -> dict[tuple[int, int], int]:
    """Every record of `topic` read back from Kafka: (partition, offset) -> the sequence number in its key."""
    from kafka_ledger.ops.readback import read_back

    records = read_back(kafka_for(servers), [topic], timeout)
    return {(m.partition(), m.offset()): sequence_number(m.key()) for m in records}

