"""The fault campaign's records: sequence-numbered, every BAD_EVERY-th a bad one, as JSON or as Avro through the
schema registry; their producer, which remembers where each landed, and the reading back of where they are in Kafka
(a resumed campaign)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from kafka_ledger.config.settings import kafka_for
from kafka_ledger.formats.framing import NOT_FRAMED
from tools.fault_campaign import CampaignFailure
from tools.fault_campaign.typed_events import KEEP_NOTE, KEEP_NOTE_AND_DOC, TOASTED, typed_after
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


# A change-event campaign (envelope: debezium): record `seq` is a Debezium change event of entity u<seq % ENTITIES>, an
# update of its row image; at remainder 5 of TOMBSTONE_EVERY its delete, at remainder 7 a Kafka tombstone, which
# changes nothing (Debezium writes one after each delete); every BAD_EVERY-th one of these events not applied.
CDC_BAD_EVENTS: list[tuple[bytes, str]] = [
    (b'{"op": "u", "after": {"event_id": "x", "amount": 1', "malformed JSON (not a JSON object)"),
    (b'{"after": {"event_id": "x", "amount": 2}}', "not a change event: no op (envelope debezium; a row already "
                                                    "unwrapped, e.g. by ExtractNewRecordState, needs no envelope)"),
    (b'{"op": "t", "before": null, "after": null}', "truncate event (op t): not applied to an entity table (to apply "
                                                     "it, delete the table's rows yourself)"),
    (b'{"op": "u", "after": {"amount": 3}}', "required field 'after.event_id' is missing or null"),
    (b'{"op": "u", "after": {"event_id": "y", "amount": "many"}}', "field 'after.amount' is not a valid long"),
    (b'{"op": "d", "before": null, "after": null}', "delete event (op d) without its key: field 'before.event_id' is "
                                                     "null (the source table's REPLICA IDENTITY must hold the key)"),
]


def change_effect(seq: int, typed: bool = False) -> str:
    """What change event `seq` does to its entity: `row` (its newest version), `delete`, `none` (a Kafka tombstone),
    or `dead letter`; of the typed table's events (`typed`) also an update that leaves its TOASTed note (and jsonb)
    unchanged (typed_events.TOASTED: their placeholder in their place)."""
    if seq % BAD_EVERY == 0:
        return "dead letter"
    return {5: "delete", 7: "none", **({2: KEEP_NOTE, 9: KEEP_NOTE_AND_DOC} if typed else {})}.get(
        seq % TOMBSTONE_EVERY, "row")


def change_event(seq: int, typed: bool = False) -> bytes | None:
    """The value of change event `seq` (change_effect says what it does): the typed table's (`typed`) or a row image
    of the campaign's columns."""
    effect = change_effect(seq, typed)
    if effect == "dead letter":
        return CDC_BAD_EVENTS[(seq // BAD_EVERY) % len(CDC_BAD_EVENTS)][0]
    if effect == "none":
        return None
    if effect == "delete":
        row = None
    elif typed:
        row = {"event_id": entity_of(seq), "amount": seq, **typed_after(seq, TOASTED.get(effect, ()))}
    else:
        row = json.loads(record_value(seq, entity=True) or b"{}")
    return json.dumps({"before": {"event_id": entity_of(seq)} if effect == "delete" else None, "after": row,
                       "source": {"connector": "postgresql", "lsn": seq}, "op": "d" if effect == "delete" else "u",
                       "ts_ms": 1795780800000}).encode()


def change_event_reason(seq: int) -> str | None:
    """The dead-letter reason of bad change event `seq`, None for one that is a change event (which a typed table's
    that lacks a value of an entity without a row is too: the model says so)."""
    if change_effect(seq) != "dead letter":
        return None
    return CDC_BAD_EVENTS[(seq // BAD_EVERY) % len(CDC_BAD_EVENTS)][1]


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


class JsonRecords:
    """The records as JSON values (the bad ones tools/records.py's)."""

    format = "json"

    def value(self, seq: int) -> bytes | None:
        return record_value(seq)

    def reason(self, seq: int) -> str | None:
        return expected_reason(seq)


# The Avro records' first schema: the campaign's columns (tools/records.py), event_id nullable so that a bad record
# can leave it out; later versions (AvroRecords.evolve) add a field with a default each, which no column reads.
AVRO_SCHEMA: dict[str, Any] = {"type": "record", "name": "Impression", "namespace": "kafka_ledger.campaign", "fields": [
    {"name": "event_id", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": "long"},
    {"name": "price", "type": "double"},
    {"name": "ok", "type": "boolean"},
    {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}
EVENT_TIME = datetime(2026, 11, 21, 10, tzinfo=UTC)
# A schema id no registry has given (Apicurio's and Confluent's count up from 1).
UNKNOWN_SCHEMA_ID = 2**31 - 1


class RegisteredRecords:
    """Records written through the schema registry: every BAD_EVERY-th one bad (`_bad`: its value and reason), the
    others good (`_good`)."""

    def _good(self, seq: int) -> bytes:
        raise NotImplementedError

    def _bad(self, seq: int) -> tuple[bytes | None, str]:
        raise NotImplementedError

    def value(self, seq: int) -> bytes | None:
        return self._bad(seq)[0] if seq % BAD_EVERY == 0 else self._good(seq)

    def reason(self, seq: int) -> str | None:
        return self._bad(seq)[1] if seq % BAD_EVERY == 0 else None


class AvroRecords(RegisteredRecords):
    """The records as Avro values written by confluent-kafka's AvroSerializer through the schema registry (subject
    `<topic>-value`), the newest version registered; the bad ones: a value not in the wire format, an unknown schema
    id, a payload that does not decode, a missing required field, a tombstone. `evolve()` registers a new version (a
    field added with a default) that the records after it are written with, while they flow."""

    format = "avro"

    def __init__(self, client: Any, topic: str):
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        self.client, self.topic, self.subject = client, topic, f"{topic}-value"
        try:
            versions = client.get_versions(self.subject)
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise
            versions = []  # a new campaign's subject
        if not versions:
            client.register_schema(self.subject, Schema(json.dumps(AVRO_SCHEMA), "AVRO"))
        self.first_id = client.get_version(self.subject, 1).schema_id
        newest = client.get_latest_version(self.subject)
        self._write_with(json.loads(newest.schema.schema_str))

    def _write_with(self, schema: dict[str, Any]) -> None:
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        serializer = AvroSerializer(self.client, json.dumps(schema), conf={"auto.register.schemas": True})
        context = SerializationContext(self.topic, MessageField.VALUE)
        defaults = {f["name"]: f["default"] for f in schema["fields"] if f["name"] not in ("event_id", "amount",
                                                                                           "price", "ok", "event_time")}
        # One attribute, swapped at once: the producer's thread writes with the old or the new version, whole.
        self._encode = (lambda record: serializer({**defaults, **record}, context), schema)

    def evolve(self) -> int:
        """Register the next version (the newest's fields and one more, with a default); the records after this are
        written with it. Its schema id."""
        from confluent_kafka.schema_registry import Schema

        schema = self._encode[1]
        added = {"name": f"note_{len(schema['fields'])}", "type": "string", "default": ""}
        newer = {**schema, "fields": [*schema["fields"], added]}
        schema_id = self.client.register_schema(self.subject, Schema(json.dumps(newer), "AVRO"))
        self._write_with(newer)
        return schema_id

    def _good(self, seq: int, **changes: Any) -> bytes:
        encode, _ = self._encode
        return encode({"event_id": f"s{seq}", "amount": seq, "price": seq / 4, "ok": seq % 2 == 0,
                       "event_time": EVENT_TIME, **changes})

    def _bad(self, seq: int) -> tuple[bytes | None, str]:
        which = (seq // BAD_EVERY) % 5
        if which == 0:
            return json.dumps({"event_id": f"s{seq}"}).encode(), NOT_FRAMED
        if which == 1:
            return (b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + b"\x02",
                    f"schema id {UNKNOWN_SCHEMA_ID} is not a version of subject {self.subject}")
        if which == 2:  # a union's index (a string), then nothing: its length and bytes are missing
            return (b"\x00" + self.first_id.to_bytes(4, "big") + b"\x02",
                    f"value does not decode with its writer schema (id {self.first_id})")
        if which == 3:
            return self._good(seq, event_id=None), "required field 'event_id' is missing or null"
        return None, "null value (tombstone)"



# The Protobuf records' first schema: the campaign's columns, event_id optional (unset: NULL) so that a bad record can
# leave it out; later versions (ProtobufRecords.evolve) add a field each, which no column reads.
PROTOBUF_SCHEMA = """syntax = "proto3";
package kafka_ledger.campaign;
import "google/protobuf/timestamp.proto";
message Impression {
  optional string event_id = 1;
  int64 amount = 2;
  double price = 3;
  bool ok = 4;
  google.protobuf.Timestamp event_time = 5;
}
"""


class ProtobufRecords(RegisteredRecords):
    """The records as Protobuf values written by confluent-kafka's ProtobufSerializer through the schema registry
    (subject `<topic>-value`), the newest version registered; the bad ones: a value not in the wire format, an unknown
    schema id, a message index naming no message, a payload cut short, a missing required field, a tombstone.
    `evolve()` registers a new version (a field added) that the records after it are written with."""

    format = "protobuf"

    def __init__(self, client: Any, topic: str):
        self.client, self.topic, self.subject = client, topic, f"{topic}-value"
        self.fields = 0
        # The first version is registered (or found) by the serializer's first value; a resumed campaign's subject
        # may hold more: the records go on with as many fields as its newest version.
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            newest = client.get_latest_version(self.subject)
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise
            newest = None  # a new campaign's subject
        self._write_with(0 if newest is None else newest.version - 1)
        self.first_id = int.from_bytes(self._good(1)[1:5], "big") if newest is None else client.get_version(
            self.subject, 1).schema_id

    def _write_with(self, added: int) -> None:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        from kafka_ledger.formats.protobuf import message_class

        text = PROTOBUF_SCHEMA.replace("}\n", "".join(f"  string note_{6 + i} = {6 + i};\n" for i in range(added))
                                       + "}\n")
        impression = message_class(text, "kafka_ledger.campaign.Impression")
        serializer = ProtobufSerializer(impression, self.client, {"auto.register.schemas": True})
        context = SerializationContext(self.topic, MessageField.VALUE)

        def encode(record: dict[str, Any]) -> bytes:
            message = impression(**{k: v for k, v in record.items() if k != "event_time" and v is not None})
            message.event_time.FromDatetime(record["event_time"])
            return serializer(message, context)

        # One attribute, swapped at once: the producer's thread writes with the old or the new version, whole.
        self.fields = added
        self._encode = encode

    def evolve(self) -> int:
        """Register the next version (one field more); the records after this are written with it. Its schema id."""
        self._write_with(self.fields + 1)
        return int.from_bytes(self._good(1)[1:5], "big")

    def _good(self, seq: int, **changes: Any) -> bytes:
        return self._encode({"event_id": f"s{seq}", "amount": seq, "price": seq / 4, "ok": seq % 2 == 0,
                             "event_time": EVENT_TIME, **changes})

    def _bad(self, seq: int) -> tuple[bytes | None, str]:
        which = (seq // BAD_EVERY) % 6
        if which == 0:
            return json.dumps({"event_id": f"s{seq}"}).encode(), NOT_FRAMED
        if which == 1:
            return (b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + b"\x00",
                    f"schema id {UNKNOWN_SCHEMA_ID} is not a version of the topic's subject")
        if which == 2:  # the message index [3]: the schema has one message
            return (b"\x00" + self.first_id.to_bytes(4, "big") + b"\x02\x06",
                    f"bad message index [3]: schema id {self.first_id} has no such message")
        if which == 3:  # event_id's tag and a length of 9, then nothing
            return (b"\x00" + self.first_id.to_bytes(4, "big") + b"\x00\x0a\x09",
                    f"value does not decode as message kafka_ledger.campaign.Impression (writer schema id "
                    f"{self.first_id}): While parsing a protocol message, the input ended unexpectedly in the "
                    "middle of a field.  This could mean either that the input has been truncated or that an "
                    "embedded message misreported its own length.")
        if which == 4:
            return self._good(seq, event_id=None), "required field 'event_id' is missing or null"
        return None, "null value (tombstone)"



class Landed:
    """Where each record landed, (partition, offset) -> its sequence number, as a dict is read: one growable int64
    array per partition indexed by offset (-1 where none landed). 8 bytes a record where a dict of tuples took about
    150: a campaign at 60,000 records/s lands over 100 million."""

    def __init__(self, items: Any = ()):
        self._seqs: dict[int, np.ndarray] = {}
        self._count = 0
        self.max_seq = -1
        # Delivery reports come on whichever thread polls the producer (its own, and the campaign's while it waits):
        # a write into an array being grown on the other would be lost.
        self._lock = threading.Lock()
        for (partition, offset), seq in (items.items() if hasattr(items, "items") else items):
            self[partition, offset] = seq

    def __setitem__(self, key: tuple[int, int], seq: int) -> None:
        partition, offset = key
        with self._lock:
            seqs = self._seqs.get(partition)
            if seqs is None or offset >= len(seqs):
                grown = np.full(max(1024, 2 * (offset + 1)), -1, dtype=np.int64)
                if seqs is not None:
                    grown[:len(seqs)] = seqs
                self._seqs[partition] = seqs = grown
            if seqs[offset] < 0:
                self._count += 1
            seqs[offset] = seq
            self.max_seq = max(self.max_seq, seq)

    def get(self, key: tuple[int, int], default: int | None = None) -> int | None:
        partition, offset = key
        seqs = self._seqs.get(partition)
        if seqs is None or not 0 <= offset < len(seqs) or seqs[offset] < 0:
            return default
        return int(seqs[offset])

    def __getitem__(self, key: tuple[int, int]) -> int:
        seq = self.get(key)
        if seq is None:
            raise KeyError(key)
        return seq

    def assign(self, partition: int, offsets: np.ndarray, seqs: np.ndarray) -> None:
        """Many records of one partition at once: `seqs[i]` landed at `offsets[i]` (a journal read back)."""
        if not len(offsets):
            return
        with self._lock:
            current = self._seqs.get(partition)
            size = int(offsets.max()) + 1
            if current is None or size > len(current):
                grown = np.full(max(1024, size), -1, dtype=np.int64)
                if current is not None:
                    grown[:len(current)] = current
                self._seqs[partition] = current = grown
            self._count += int(np.count_nonzero(current[offsets] < 0))
            current[offsets] = seqs
            self.max_seq = max(self.max_seq, int(seqs.max()))

    def counts(self) -> dict[int, int]:
        """Per partition, how many records landed."""
        with self._lock:
            return {partition: int(np.count_nonzero(seqs >= 0)) for partition, seqs in self._seqs.items()}

    def next_offsets(self) -> dict[int, int]:
        """Per partition, the offset after the last record landed."""
        return {partition: int(seqs[-1]) + 1 if len(seqs) else 0
                for partition, seqs in ((p, np.flatnonzero(a >= 0)) for p, a in self.partitions().items())}

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self.get(key) is not None  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self._count

    def partitions(self) -> dict[int, np.ndarray]:
        """Per partition, the sequence number at each offset (-1: none landed there), trimmed after the last."""
        trimmed = {}
        with self._lock:
            arrays = {partition: seqs.copy() for partition, seqs in self._seqs.items()}
        for partition, seqs in arrays.items():
            landed = np.flatnonzero(seqs >= 0)
            trimmed[partition] = seqs[:landed[-1] + 1] if len(landed) else seqs[:0]
        return trimmed

    def items(self) -> Iterator[tuple[tuple[int, int], int]]:
        for partition, seqs in self.partitions().items():
            for offset in np.flatnonzero(seqs >= 0):
                yield (partition, int(offset)), int(seqs[offset])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return (key for key, _ in self.items())

    def values(self) -> Iterator[int]:
        return (seq for _, seq in self.items())


def append_journal(path: Path, landed: list[tuple[int, int, int]]) -> None:
    """Append records' landings (partition, offset, sequence number) to a campaign's journal, a line each; a last
    line an interruption cut short is dropped first (a resumed campaign read that record back from Kafka)."""
    with path.open("a+b") as journal:
        size = journal.seek(0, os.SEEK_END)
        journal.seek(max(0, size - 64))
        tail = journal.read()
        if tail and not tail.endswith(b"\n"):
            journal.truncate(size - len(tail) + tail.rfind(b"\n") + 1)
        journal.writelines(f"{p}\t{o}\t{seq}\n".encode() for p, o, seq in landed)


def read_journal(path: Path) -> Landed:
    """The landings a journal holds; a last line cut short by an interruption is left out (Kafka still has it).

    Parsed by numpy, not line by line: a campaign at 60,000 records/s journals a hundred million."""
    landed = Landed()
    if not path.exists():
        return landed
    text = path.read_bytes()
    text = text[:text.rfind(b"\n") + 1]
    if not text:
        return landed
    rows = np.fromstring(text, dtype=np.int64, sep=" ").reshape(-1, 3)  # any whitespace separates
    for partition in np.unique(rows[:, 0]):
        mine = rows[rows[:, 0] == partition]
        landed.assign(int(partition), mine[:, 1], mine[:, 2])
    return landed


class SequenceProducer:
    """Background producer of sequence-numbered records; remembers where each one landed."""

    def __init__(self, servers: str, topic: str, rate: float, landed: Landed | dict[tuple[int, int], int] | None = None,
                 entity_partitions: int | None = None,
                 records: JsonRecords | AvroRecords | ProtobufRecords | None = None,
                 delivery_timeout: float = 120, change_events: bool = False, typed: bool = False):
        self.topic = topic
        self.records = records or JsonRecords()
        self.rate = rate
        # An entity campaign: each entity's records in one partition (as a keyed producer's are), chosen here because
        # the keys also carry the sequence number.
        self.entity_partitions = entity_partitions
        self.change_events = change_events  # an entity campaign's records as Debezium's change events
        self.typed = typed  # ... of the typed table (typed_events.py)
        # With the deployment's Kafka settings (security), as every client of the project; log_level 2: no
        # connection errors while a broker restarts.
        self.servers, self.delivery_timeout = servers, delivery_timeout
        self.producer = self._new_producer()
        # (partition, offset) -> seq; a resumed campaign starts from what earlier sessions produced.
        self.landed = landed if isinstance(landed, Landed) else Landed(landed or {})
        self.delivered: Counter = Counter(self.landed.counts())  # partition -> records delivered
        self.journal: list[tuple[int, int, int]] = []  # landed since the last checkpoint
        self.errors: list[str] = []
        self.failed: list[int] = []  # sequence numbers whose delivery failed, not yet produced again
        self.notes: list[str] = []  # what the producer had to redo, for the campaign's report
        self.next_seq = self.landed.max_seq + 1
        self.quota = self.next_seq
        self.produced_here = self.reports_here = 0
        self.lock = threading.Lock()
        self.reporting = threading.Lock()
        self.producing = threading.Lock()  # held while the thread produces: a new producer is not swapped in then
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
                self.failed.append(seq)
            else:
                self._landed(msg.partition(), msg.offset(), seq)
        return on_delivery

    def _landed(self, partition: int, offset: int, seq: int) -> None:
        self.landed[(partition, offset)] = seq
        with self.reporting:  # reports come on two polling threads: a count is read, then written
            self.delivered[partition] += 1
        self.journal.append((partition, offset, seq))

    def _new_producer(self):  # noqa: ANN202 - confluent_kafka.Producer, imported lazily
        from confluent_kafka import Producer

        # With the deployment's Kafka settings (security), as every client of the project; log_level 2: no
        # connection errors while a broker restarts. A record not delivered in time is reported failed (and
        # produced again by settle) rather than waited for: a producer stuck after a broker restart stays stuck.
        return Producer(kafka_for(self.servers).confluent(**{"enable.idempotence": True, "acks": "all",
                                                             "linger.ms": 20, "log_level": 2,
                                                             "message.timeout.ms": int(self.delivery_timeout * 1000)}))

    def _produce_one(self, seq: int) -> None:
        entity = self.entity_partitions is not None
        where = {"partition": seq % ENTITIES % self.entity_partitions} if entity else {}
        value = (change_event(seq, self.typed) if self.change_events else record_value(seq, entity)) if entity else \
            self.records.value(seq)
        self.producer.produce(self.topic, key=record_key(seq, entity), value=value,
                              on_delivery=self._report(seq), **where)
        self.produced_here += 1

    def _deliver_again(self) -> None:
        """After failed deliveries (every report in): a new producer writes again those Kafka does not hold.

        A record reported failed may have been written all the same (its acknowledgement lost), so Kafka is read
        back first: such a record counts where it landed, and is not written twice."""
        failed, errors = sorted(self.failed), self.errors[:3]
        self.failed, self.errors = [], []
        with self.producing:
            old, self.producer = self.producer, self._new_producer()
        old.purge()
        old.flush(10)
        wanted = set(failed)
        found = {seq: rid for rid, seq in records_by_key(self.servers, self.topic).items()
                 if seq in wanted and rid not in self.landed}
        for seq, (partition, offset) in sorted(found.items()):
            self._landed(partition, offset, seq)
        again = [seq for seq in failed if seq not in found]
        with self.producing:
            for seq in again:
                while True:
                    try:
                        self._produce_one(seq)
                        break
                    except BufferError:
                        self.producer.poll(0.1)
        self.notes.append(f"{len(failed)} record(s) not delivered (e.g. {'; '.join(errors)}): {len(found)} found "
                          f"in Kafka all the same, {len(again)} produced again by a new producer")

    def _produce(self) -> None:
        started, sent = time.monotonic(), 0
        while not self.stopping.is_set() or self.next_seq < self.quota:
            with self.lock:
                todo = min(self.quota - self.next_seq, 50)
            if todo <= 0:
                self.producer.poll(0.05)
                started, sent = time.monotonic(), 0
                continue
            with self.producing:
                for _ in range(todo):
                    while True:
                        try:
                            self._produce_one(self.next_seq)
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
            if self.failed and self.reports_here >= self.produced_here:
                self._deliver_again()  # a record reported failed may be in Kafka, below the positions
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
        for attempt in range(4):
            while self.next_seq < self.quota or self.reports_here < self.produced_here:
                if time.monotonic() > deadline:
                    raise CampaignFailure(f"producer did not settle: {self.next_seq} of {self.quota} produced, "
                                          f"{sum(self.delivered.values())} delivered")
                self.producer.poll(0.1)
            if not self.failed:
                break
            if attempt == 3:
                raise CampaignFailure(f"{len(self.failed)} records were not delivered by 4 producers: "
                                      f"{self.errors[:5]}")
            self._deliver_again()
            deadline = time.monotonic() + timeout
        new, self.journal = self.journal, []
        return new

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        if self.failed:
            self.settle()
        if self.errors:
            raise CampaignFailure(f"{len(self.errors)} records were not delivered: {self.errors[:5]}")


def records_by_key(servers: str, topic: str, timeout: float = 300, after: dict[int, int] | None = None,
                   offsets: dict[Any, Any] | None = None) -> dict[tuple[int, int], int]:
    """The records of `topic` read back from Kafka (each partition from `after`'s offset, if it names one):
    (partition, offset) -> the sequence number in its key. `offsets`: the topic's partition offsets, when the
    caller looked them up already."""
    from kafka_ledger.kafka.offsets import partition_offsets
    from kafka_ledger.ops.readback import read_back

    kafka = kafka_for(servers)
    offsets = {tp: replace(o, log_start=max(o.log_start, min((after or {}).get(tp.partition, 0), o.end)))
               for tp, o in (offsets if offsets is not None else partition_offsets(kafka, [topic])).items()}
    return {(m.partition(), m.offset()): sequence_number(m.key()) for m in read_back(kafka, [topic], timeout, offsets)}
