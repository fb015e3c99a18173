"""Protobuf values on the real Spark and the stack's schema registry: schemas registered as .proto text with a
reference (as Java's serializers register them) or as base64 descriptors (as Confluent's Python ProtobufSerializer
does), values framed with the message index in both forms, decoded by kafka-ledger with the batch's reader schema;
every value published exactly or dead-lettered with its reason, in both runtimes and both sinks."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference
from integration_support import PROTOBUF_COLUMNS, lean_decoded, published_rows

from kafka_ledger.config import settings
from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.formats.base import SchemaPin
from kafka_ledger.formats.framing import NOT_FRAMED
from kafka_ledger.formats.protobuf import message_class

pytestmark = pytest.mark.integration

ADDRESS = """syntax = "proto3";
package shop;
message Address { string city = 1; optional string zip = 2; }
"""
ORDER = """syntax = "proto3";
package shop;
import "address.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
message Order {
  string order_id = 1;
  int64 quantity = 2;
  string amount = 3;
  google.protobuf.Timestamp at = 4;
  Address address = 5;
  Status status = 6;
  repeated string tags = 7;
  map<string, int32> counts = 8;
  sint32 total = 9;
  bytes digest = 10;
  google.protobuf.Int64Value discount = 11;
  google.protobuf.Duration took = 12;
  uint64 big = 13;
  oneof payment { string card = 14; string iban = 15; }
  google.protobuf.Duration waited = 17;
  message Line { string sku = 1; }
}
enum Status { NEW = 0; PAID = 1; }
"""
# The keys of the entity table's orders (key_format protobuf).
ORDER_KEY = 'syntax = "proto3";\npackage shop;\nmessage OrderKey { string id = 1; int64 region = 2; }\n'
# Version 2 adds a field: values written with it are read with version 1 (the pinned reader), the field skipped.
ORDER_V2 = ORDER.replace("oneof payment", "string channel = 16;\n  oneof payment")


def classes(text: str):
    """The Order and Order.Line message classes of a schema, built from its descriptors as a batch builds them."""
    imports = {"address.proto": ADDRESS}
    return message_class(text, "shop.Order", imports), message_class(text, "shop.Order.Line", imports)


def order(cls, i: int, **changes):
    fields = {"order_id": f"o{i}", "quantity": 2**53 + i, "amount": f"{i}.50", "status": 1, "tags": ["a", "b"],
              "counts": {"x": i}, "total": -i, "digest": bytes([0, 0xFF, i % 256]), "big": 2**64 - 1 - i,
              "card": f"card{i}"}
    if "iban" in changes:
        del fields["card"]  # one member of the oneof
    message = cls(**{**fields, **changes})
    message.at.FromDatetime(datetime(2026, 11, 27, 10, 0, i % 60, 123456, tzinfo=UTC))
    message.address.city = "Lyon"
    message.took.FromMilliseconds(1500 + i)
    message.waited.FromMicroseconds(-2_500_000 - i)
    return message


def nanos(message):
    """The order with an instant that has nanoseconds: more than a timestamp column holds."""
    message.at.nanos = 123_456_789
    return message


def register_text(client, subject: str, text: str) -> int:
    """`text` registered as .proto text under `subject`, its import a reference to the text of address.proto (a
    subject of its own: Confluent's Python serializer registers its descriptors under the import's name)."""
    client.register_schema("address-text.proto", Schema(ADDRESS, "PROTOBUF"))
    version = client.get_latest_version("address-text.proto").version
    return client.register_schema(subject, Schema(text, "PROTOBUF", [SchemaReference("address.proto",
                                                                                      "address-text.proto", version)]))


TRUNCATED = "(truncated)"


def framed(schema_id: int, message, index: bytes = b"\x00") -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + index + message.SerializeToString()


def test_values_decode_with_the_reader_schema_and_bad_ones_are_dead_letters(spark):
    from kafka_ledger.formats.protobuf import ProtobufFormat, topic_schemas

    client = settings.schema_registry().client()
    topic = f"it-protobuf-{uuid.uuid4().hex[:8]}"
    subject = f"{topic}-value"
    v1_id, v2_id = register_text(client, subject, ORDER), register_text(client, subject, ORDER_V2)
    order_v1, line = classes(ORDER)
    order_v2, _ = classes(ORDER_V2)
    values: list[tuple[bytes | None, str | None]] = [
        (framed(v1_id, order(order_v1, 1)), None),
        (framed(v2_id, order(order_v2, 2, channel="app")), None),            # a newer writer: its field skipped
        (framed(v1_id, order(order_v1, 3, iban="FR76"), b"\x02\x00"), None),  # the message index's full form [0]
        (framed(v1_id, order_v1(order_id="o4", amount="4")), None),           # every other field unset
        (b'{"order_id": "json"}', NOT_FRAMED),
        (b"\x00" + v1_id.to_bytes(4, "big"), f"bad message index after schema id {v1_id} (the value ends inside it)"),
        (framed(999_999, order(order_v1, 6)), "schema id 999999 is not a version of the topic's subject"),
        (framed(v1_id, order(order_v1, 7), b"\x02\x0a"), "bad message index [5]: schema id "
                                                         f"{v1_id} has no such message"),
        (framed(v1_id, order(order_v1, 8))[:9], TRUNCATED),  # cut in order_id: the reason is protobuf-java's
        # [0, 1]: Order's second nested message (its map's entry type is the first, as Confluent counts them).
        (framed(v1_id, line(sku="s"), b"\x04\x00\x02"), "value is a shop.Order.Line message, and the pipeline reads "
                                                        "shop.Order"),
        (framed(v1_id, order(order_v1, 9, amount="1.234")),
         "field 'amount' is not a valid decimal(10,2) (it does not fit exactly: more than 2 digit(s) after the point "
         "or 8 before it)"),
        (None, "null value (tombstone)"),
        (framed(v1_id, nanos(order(order_v1, 10))), "field 'at' is not a valid timestamp (more than 6 digits after "
                                                    "the second: they would be lost)"),
    ]
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": [topic], "output_table": "t", "columns": PROTOBUF_COLUMNS, "value": {"format": "protobuf"}}}}))["p"]
    records = spark.createDataFrame(
        [(topic, 0, offset, datetime(2026, 11, 27, tzinfo=UTC), f"c{offset}".encode(), value, [])
         for offset, (value, _) in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
        "headers array<struct<key: string, value: binary>>")
    fmt = ProtobufFormat({topic: topic_schemas(client, subject, v1_id)})
    lean = lean_decoded(records, pipeline, fmt, [c["name"] for c in PROTOBUF_COLUMNS])
    reasons = {offset: row["error"] for offset, row in lean.items()}
    cut = next(offset for offset, (_, reason) in enumerate(values) if reason == TRUNCATED)
    truncated = reasons.pop(cut)
    assert truncated.startswith(f"value does not decode as message shop.Order (writer schema id {v1_id}): "), truncated
    assert reasons == {offset: reason for offset, (_, reason) in enumerate(values) if offset != cut}
    assert lean[0] == {
        "kafka_offset": 0, "error": None, "order_id": "o1", "quantity": 2**53 + 1, "amount": Decimal("1.50"),
        "at": lean[0]["at"], "city": "Lyon", "zip": None, "status": "PAID", "tags": '["a","b"]',
        "counts": '{"x":1}', "total": -1, "digest": bytes([0, 0xFF, 1]), "discount": None,
        "took": Decimal("1.501000000"), "waited": "P0M0DT-2.500001S", "big": Decimal(2**64 - 2), "card": "card1",
        "iban": None, "customer": "c0"}
    assert lean[0]["at"].astimezone(UTC) == datetime(2026, 11, 27, 10, 0, 1, 123456, tzinfo=UTC)
    assert (lean[1]["order_id"], lean[1]["quantity"]) == ("o2", 2**53 + 2)
    assert (lean[2]["card"], lean[2]["iban"]) == (None, "FR76")
    # Unset proto3 scalars read as their defaults; unset fields with presence (a message, optional, a wrapper, a
    # oneof member) as NULL.
    unset = lean[3]
    assert {n: unset[n] for n in ("quantity", "status", "tags", "counts", "total", "digest", "big", "city", "zip",
                                  "discount", "card", "at", "took", "waited")} == {
        "quantity": 0, "status": "NEW", "tags": "[]", "counts": "{}", "total": 0, "digest": b"", "big": Decimal(0),
        "city": None, "zip": None, "discount": None, "card": None, "at": None, "took": None, "waited": None}


def test_a_proto2_string_that_is_not_utf8_is_a_dead_letter_never_replacement_characters(spark):
    """proto2 does not check a string field's UTF-8 (proto3 does): protobuf-java would hand back replacement
    characters, a value not the producer's. Such a value is a dead letter; a valid one is read as written."""
    from kafka_ledger.formats.protobuf import ProtobufFormat, topic_schemas

    client = settings.schema_registry().client()
    topic = f"it-protobuf2-{uuid.uuid4().hex[:8]}"
    schema_id = client.register_schema(f"{topic}-value", Schema(
        'syntax = "proto2";\npackage p2;\nmessage Note { optional string text = 1; }\n', "PROTOBUF"))
    # Field 1, length-delimited: valid UTF-8 (and a replacement character the producer did write), then bytes that
    # are not UTF-8.
    valid, invalid = "é \ufffd".encode(), b"\xff\xfe"
    values = [b"\x00" + schema_id.to_bytes(4, "big") + b"\x00\x0a" + bytes([len(text)]) + text
              for text in (valid, invalid)]
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": [topic], "output_table": "t", "columns": [{"name": "text", "type": "string"}],
        "value": {"format": "protobuf"}}}}))["p"]
    records = spark.createDataFrame(
        [(topic, 0, offset, datetime(2026, 11, 29, tzinfo=UTC), None, value, [])
         for offset, value in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
        "headers array<struct<key: string, value: binary>>")
    fmt = ProtobufFormat({topic: topic_schemas(client, f"{topic}-value", schema_id)})
    decoded = lean_decoded(records, pipeline, fmt, ["text"])
    assert (decoded[0]["text"], decoded[0]["error"]) == ("é \ufffd", None)
    assert decoded[1]["text"] is None
    assert decoded[1]["error"] == (f"value does not decode as message p2.Note (writer schema id {schema_id}): Protocol "
                                   "message had invalid UTF-8.")


def test_a_float_a_uint64_beyond_a_long_and_the_fields_no_column_reads(spark):
    """The decoder hands Spark typed fields: a float as the double of its text (as JSON's reader of that text gets
    it), a uint64 beyond a long a dead letter (never wrapped), and, with extra_fields dead_letter, the fields no column
    reads that the message has (a proto3 scalar always; a message only when set, and then inside it)."""
    from kafka_ledger.formats.protobuf import ProtobufFormat, topic_schemas

    client = settings.schema_registry().client()
    topic = f"it-protobuf3-{uuid.uuid4().hex[:8]}"
    text = ('syntax = "proto3";\npackage t3;\nmessage M {\n  float f = 1;\n  uint64 u = 2;\n  string s = 3;\n'
            '  Inner inner = 4;\n  message Inner { string a = 1; int32 b = 2; }\n}\n')
    schema_id = client.register_schema(f"{topic}-value", Schema(text, "PROTOBUF"))
    cls = message_class(text, "t3.M")
    values = [cls(f=0.1, u=5, s="x", inner=cls.Inner(a="y", b=1)), cls(f=1.5, u=2**64 - 1), cls(f=float("-inf"))]
    records = spark.createDataFrame(
        [(topic, 0, offset, datetime(2026, 12, 2, tzinfo=UTC), None, framed(schema_id, value), [])
         for offset, value in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
        "headers array<struct<key: string, value: binary>>")
    fmt = ProtobufFormat({topic: topic_schemas(client, f"{topic}-value", schema_id)})

    def decoded(extra_fields: str) -> dict[int, dict]:
        pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
            "topics": [topic], "output_table": "t", "value": {"format": "protobuf"}, "extra_fields": extra_fields,
            "columns": [{"name": "f", "type": "double"}, {"name": "u", "type": "long"},
                        {"name": "a", "type": "string", "path": "inner.a"}]}}}))["p"]
        return lean_decoded(records, pipeline, fmt, ["f", "u", "a"])

    kept = decoded("ignore")
    assert [(row["f"], row["u"], row["a"], row["error"]) for row in list(kept.values())[:2]] == [
        (0.1, 5, "y", None), (1.5, None, None, "value does not match the declared schema")]
    assert (kept[2]["f"], kept[2]["u"], kept[2]["a"], kept[2]["error"]) == (float("-inf"), 0, None, None)
    assert {offset: row["error"] for offset, row in decoded("dead_letter").items()} == {
        0: "unexpected field(s): inner.b, s", 1: "unexpected field(s): s", 2: "unexpected field(s): s"}


def test_a_pipeline_of_several_topics_decodes_each_with_its_own_subject(spark):
    """Two topics of one pipeline, each its own subject and message (the same fields by name, other numbers),
    their records interleaved in one frame: each decodes with its topic's schema."""
    from kafka_ledger.formats.protobuf import ProtobufFormat, topic_schemas

    client = settings.schema_registry().client()
    texts = {"a": 'syntax = "proto3";\npackage pa;\nmessage Click { string id = 1; int64 n = 2; }\n',
             "b": 'syntax = "proto3";\npackage pb;\nmessage Tap { int64 n = 1; string id = 2; }\n'}
    topics = {side: f"it-protobuf-{side}-{uuid.uuid4().hex[:8]}" for side in texts}
    ids = {side: client.register_schema(f"{topics[side]}-value", Schema(text, "PROTOBUF"))
           for side, text in texts.items()}
    messages = {"a": message_class(texts["a"], "pa.Click"), "b": message_class(texts["b"], "pb.Tap")}
    rows = [(topics[side], 0, i, datetime(2026, 11, 29, tzinfo=UTC), None, b"\x00" + ids[side].to_bytes(4, "big")
             + b"\x00" + messages[side](id=f"{side}{i}", n=i).SerializeToString(), [])
            for i, side in enumerate("ababba")]
    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": list(topics.values()), "output_table": "t", "value": {"format": "protobuf"},
        "columns": [{"name": "id", "type": "string"}, {"name": "n", "type": "long"}]}}}))["p"]
    records = spark.createDataFrame(rows, "topic string, partition int, offset long, timestamp timestamp, key binary, "
                                          "value binary, headers array<struct<key: string, value: binary>>")
    fmt = ProtobufFormat({topics[side]: topic_schemas(client, f"{topics[side]}-value", ids[side]) for side in texts})
    decoded = lean_decoded(records, pipeline, fmt, ["id", "n"])
    assert {o: (r["id"], r["n"], r["error"]) for o, r in decoded.items()} == {
        i: (f"{side}{i}", i, None) for i, side in enumerate("ababba")}


def _produce(servers: str, topic: str, values: list[tuple[bytes | None, bytes]]) -> list[tuple[str, int, int]]:
    from integration_support import RecordedProducer

    return RecordedProducer(servers).send(topic, [v for v, _ in values], keys=[k for _, k in values])


def _published(dsn: str, pipeline) -> dict[tuple[int, int], dict]:
    return published_rows(dsn, pipeline, [c["name"] for c in PROTOBUF_COLUMNS])


# The connect runtime into Postgres in the default run; spark-submit's and the Iceberg sink's twins in the long lane
# (the decoding is the same Spark function in both runtimes, the sinks publish what decoding gives them).
@pytest.mark.parametrize("key", ["protobuf_connect", pytest.param("protobuf_submit", marks=pytest.mark.long),
                                 pytest.param("protobuf_iceberg", marks=pytest.mark.long)])
def test_protobuf_values_are_published_exactly_and_a_replay_decodes_with_its_batchs_reader(
        dsn, servers, pipeline_factory, key):
    """Values written by Confluent's ProtobufSerializer (its schema registered as base64 descriptors, its import as a
    reference), read with the newest version at plan time; a version registered later changes nothing for a replay."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from integration_support import assert_exactly_once, catch_up

    from kafka_ledger.batch.plan import plan_batch
    from kafka_ledger.batch.requests import BatchRequest
    from kafka_ledger.config.settings import services_for
    from kafka_ledger.ledger import db as ledger
    from kafka_ledger.runtimes import run_batch

    pipeline = pipeline_factory(key, partitions=2)
    topic = pipeline.topics[0]
    client = settings.schema_registry().client()
    order_v1, _ = classes(ORDER)
    serialize = ProtobufSerializer(order_v1, client, conf={"auto.register.schemas": True})
    context = SerializationContext(topic, MessageField.VALUE)
    values = [(serialize(order(order_v1, i), context), f"c{i}".encode()) for i in range(20)]
    values += [(serialize(order(order_v1, 20, amount="x"), context), b"c20"), (b'{"order_id": "json"}', b"c21")]
    landed = _produce(servers, topic, values)
    if key == "protobuf_connect":  # the server's warm-up reads them with the subject's newest version, as a batch would
        from kafka_ledger.runtimes.connect.warm_up import warm_up

        done = warm_up(1_000, [pipeline], services_for(dsn, servers))
        assert (done.skipped, done.pipeline_records) == ({}, {pipeline.name: len(values)})
    first = catch_up(dsn, servers, pipeline)
    assert_exactly_once(dsn, servers, pipeline, {
        landed[20]: "field 'amount' is not a valid decimal(10,2)",
        landed[21]: NOT_FRAMED})
    rows = _published(dsn, pipeline)
    assert {landed[i][1:]: (rows[landed[i][1:]]["order_id"], rows[landed[i][1:]]["quantity"], rows[landed[i][1:]][
        "amount"], rows[landed[i][1:]]["customer"]) for i in range(20)} == {
        landed[i][1:]: (f"o{i}", 2**53 + i, Decimal(f"{i}.50"), f"c{i}") for i in range(20)}
    assert bytes(rows[landed[3][1:]]["digest"]) == bytes([0, 0xFF, 3])
    services = services_for(dsn, servers)
    v1_id = int.from_bytes(values[0][0][1:5], "big")
    with ledger.session(services.ledger) as conn, conn.cursor() as cur:
        assert ledger.schema_pins(cur, first.batch_id) == {
            ("value", topic): SchemaPin(topic, f"{topic}-value", v1_id, 1, "newest")}

    # Version 2 (a field added): the replay keeps version 1 and publishes the same rows.
    order_v2, _ = classes(ORDER_V2)
    ProtobufSerializer(order_v2, client, conf={"auto.register.schemas": True})(order(order_v2, 30), context)
    replay = plan_batch(services, pipeline, BatchRequest(mode="replay_batch", batch_id=first.batch_id,
                                                         reason="test"))
    run_batch(pipeline, replay.batch_id, services)
    with ledger.session(services.ledger) as conn, conn.cursor() as cur:
        assert ledger.schema_pins(cur, replay.batch_id) == {
            ("value", topic): SchemaPin(topic, f"{topic}-value", v1_id, 1, "pinned")}
    assert _published(dsn, pipeline) == rows


# spark-submit's twin in the long lane: its job binds the batch's key schemas as the connect runtime's task does.
@pytest.mark.parametrize("key", ["protobuf_keys_connect", pytest.param("protobuf_keys_submit", marks=pytest.mark.long)])
def test_protobuf_keys_name_an_entity_tables_entities_and_a_tombstone_deletes_one(dsn, servers, pipeline_factory, key):
    """Keys written by Confluent's ProtobufSerializer (subject <topic>-key), pinned per batch beside the values: each
    order's newest version is its entity's row, a tombstone deletes it, a key not in the wire format is a dead letter,
    and a replay of every range as a new batch changes nothing."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from integration_support import batches, drain, positions_equal_end_offsets, query

    from kafka_ledger.batch.plan import plan_batch
    from kafka_ledger.batch.requests import BatchRequest
    from kafka_ledger.config.settings import services_for
    from kafka_ledger.formats.framing import KEY_NOT_FRAMED
    from kafka_ledger.ledger import db as ledger
    from kafka_ledger.runtimes import run_batch

    pipeline = pipeline_factory(key, partitions=2)
    topic = pipeline.topics[0]
    client = settings.schema_registry().client()
    order_v1, _ = classes(ORDER)
    order_key = message_class(ORDER_KEY, "shop.OrderKey")
    values = ProtobufSerializer(order_v1, client, conf={"auto.register.schemas": True})
    keys = ProtobufSerializer(order_key, client, conf={"auto.register.schemas": True})
    value_context = SerializationContext(topic, MessageField.VALUE)
    key_context = SerializationContext(topic, MessageField.KEY)

    def keyed(i: int) -> bytes:
        return keys(order_key(id=f"o{i}", region=i % 3), key_context)

    records = [(values(order(order_v1, i), value_context), keyed(i)) for i in range(6)]
    records += [(values(order(order_v1, i, quantity=100 + i), value_context), keyed(i)) for i in (1, 2)]
    records += [(None, keyed(2)), (values(order(order_v1, 7), value_context), b"plain"), (None, b"plain")]
    landed = _produce(servers, topic, records)
    services = services_for(dsn, servers)
    drain(dsn, servers, pipeline)

    def entities() -> dict[str, tuple]:
        return {order_id: (region, quantity, (partition, offset)) for order_id, region, quantity, partition, offset
                in query(dsn, f"SELECT order_id, region, quantity, kafka_partition, kafka_offset FROM "
                              f"{pipeline.output_schema}.{pipeline.output_table}")}

    newest = {f"o{i}": records.index((values(order(order_v1, i), value_context), keyed(i))) for i in (0, 3, 4, 5)}
    expected = {f"o{i}": (i % 3, 2**53 + i, landed[newest[f"o{i}"]][1:]) for i in (0, 3, 4, 5)}
    expected["o1"] = (1, 101, landed[6][1:])
    assert entities() == expected
    dead = {(t, p, o): error for t, p, o, error in query(
        dsn, "SELECT kafka_topic, kafka_partition, kafka_offset, error FROM kafka_ledger.dead_letters "
             "WHERE pipeline = %s", pipeline.name)}
    assert dead == {landed[9]: KEY_NOT_FRAMED,
                    landed[10]: "tombstone's Kafka key does not name its entity (field 'id' of the Kafka key is "
                                "missing or null)"}
    positions_equal_end_offsets(dsn, servers, pipeline)
    key_id = int.from_bytes(records[0][1][1:5], "big")
    batch_id = batches(dsn, pipeline)[0].batch_id
    with ledger.session(services.ledger) as conn, conn.cursor() as cur:
        pins = ledger.schema_pins(cur, batch_id)
    assert pins[("key", topic)] == SchemaPin(topic, f"{topic}-key", key_id, 1, "newest", "key")

    replay = plan_batch(services, pipeline, BatchRequest(mode="replay_batch", batch_id=batch_id, reason="test"))
    run_batch(pipeline, replay.batch_id, services)
    assert entities() == expected
