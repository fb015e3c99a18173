"""Decoding on the real Spark: the lean path agrees with the full one, and every timestamp form end to end."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg2
import pytest
from integration_support import (
    CASES,
    COLUMNS,
    RICH_COLUMNS,
    assert_exactly_once,
    catch_up,
    good_value,
    nested,
    query,
)

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.sinks import sink_for

pytestmark = pytest.mark.integration

# Values that test the edges of the cheap checks: each must get the same reason (or none) on both paths.
TRICKY: list[bytes | None] = [
    *(value for value, _, _ in CASES.values()),
    good_value(7),
    b'{"event_id": "a"} trailing words',
    b'{"event_id": "a"}}',
    b'[{"event_id": "a"}]',
    b"123",
    b'"just text"',
    b"",
    b"   ",
    b'{"event_id": "a", "event_id": "b"}',
    b'{"event_id": "{not json"}',
    b'{"event_id": "[1, 2]"}',
    b'{"event_id": ["a"]}',
    b'{"event_id": "nul \\u0000 inside"}',
    b'{"event_id": "caf\xc3\xa9 \\u00e9 \xf0\x9f\x98\x80"}',
    b'{"event_id": null}',
    b'{"event_id": 42}',
    b'{"event_id": "x", "amount": true}',
    b'{"event_id": "x", "amount": 1.5}',
    b'{"event_id": "x", "amount": 9223372036854775808}',
    b'{"event_id": "x", "price": "NaN"}',
    b'{"event_id": "x", "price": 1e400}',
    b'{"event_id": "x", "ok": "yes"}',
    b'{"event_id": "x", "event_time": 1700000000}',
    b'{"event_id": "x", "event_time": 1700000000123}',
    b'{"event_id": "x", "event_time": "1700000000"}',
    b'{"event_id": "x", "event_time": "yesterday"}',
    b'{"event_id": "x", "event_time": {"a": 1, "a": 2}}',
    b'{"event_id": "x", "event_time": "0001-01-01T00:00:00Z"}',
    b'{"event_id": "x", "extra": 1}',
    ('{"event_id": "d", "n": ' + nested(999) + "}").encode(),
]


@pytest.mark.parametrize("extra_fields", ["ignore", "dead_letter"])
def test_lean_decoding_gives_every_record_the_reason_and_values_of_the_full_one(spark, extra_fields):
    from kafka_ledger.formats.decode import decode_records

    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "columns": COLUMNS, "extra_fields": extra_fields}}}))["p"]
    records = spark.createDataFrame(
        [("t", 0, offset, datetime(2026, 11, 21, tzinfo=UTC), b"k", value) for offset, value in enumerate(TRICKY)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary",
    )

    def decoded(lean: bool) -> dict[int, tuple]:
        frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean)
        columns = ["error", *[c["name"] for c in COLUMNS]]
        return {row["kafka_offset"]: tuple(str(row[c]) for c in columns) for row in frame.collect()}

    lean, full = decoded(True), decoded(False)
    assert len(lean) == len(TRICKY)
    mismatches = {TRICKY[offset]: (lean[offset], full[offset]) for offset in lean if lean[offset] != full[offset]}
    assert mismatches == {}
    assert lean[TRICKY.index(good_value(7))][0] == "None"  # a good record is published


def framed(document: bytes, schema_id: int = 1) -> bytes:
    """A value as Confluent's serializers frame it: a magic byte 0, the schema id in 4 big-endian bytes, the payload."""
    return b"\x00" + schema_id.to_bytes(4, "big") + document


def _decoded(spark, pipeline, values: list[bytes | None], lean: bool) -> dict[int, tuple]:
    from kafka_ledger.formats.decode import decode_records

    records = spark.createDataFrame(
        [("t", 0, offset, datetime(2026, 11, 21, tzinfo=UTC), b"k", value) for offset, value in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary")
    frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean)
    columns = ["error", *[c["name"] for c in COLUMNS]]
    return {row["kafka_offset"]: tuple(str(row[c]) for c in columns) for row in frame.collect()}


@pytest.mark.parametrize("extra_fields", ["ignore", "dead_letter"])
def test_a_framed_value_decodes_as_its_document_and_an_unframed_one_is_a_dead_letter(spark, extra_fields):
    """`framing: confluent` is transparent: each framed value gets what its bare document gets without framing (on
    both paths), whatever its schema id; a value without the frame is a dead letter saying so."""
    from kafka_ledger.formats.framing import NOT_FRAMED
    from kafka_ledger.formats.json import FRAMED_LIKE_CONFLUENT

    def pipeline(framing: str):
        return parse_pipelines(json.dumps({"pipelines": {"p": {
            "topics": ["t"], "output_table": "t", "columns": COLUMNS, "extra_fields": extra_fields,
            "value": {"format": "json", "framing": framing}}}}))["p"]

    documents = [value for value in TRICKY if value is not None]
    ids = [1, 255, 70_000, 2**31 - 1]
    unframed = [good_value(7), b"", b"\x00\x00\x00\x01", b"\x01" + framed(good_value(7))[1:], b"{}" + framed(b"{}")]
    values = [framed(document, ids[i % len(ids)]) for i, document in enumerate(documents)] + unframed + [None]
    lean, full = (_decoded(spark, pipeline("confluent"), values, lean) for lean in (True, False))
    assert {o: (lean[o], full[o]) for o in lean if lean[o] != full[o]} == {}
    bare = _decoded(spark, pipeline("none"), documents, True)
    assert [lean[offset] for offset in range(len(documents))] == [bare[offset] for offset in range(len(documents))]
    assert [lean[len(documents) + i][0] for i in range(len(unframed) + 1)] == [NOT_FRAMED] * len(unframed) + [
        "null value (tombstone)"]
    assert lean[documents.index(good_value(7))][0] == "None"
    # Without `framing`, a framed value is a dead letter that says what to declare.
    plain = _decoded(spark, pipeline("none"), [framed(good_value(7)), framed(good_value(7), 70_000)], True)
    assert {offset: row[0] for offset, row in plain.items()} == {0: FRAMED_LIKE_CONFLUENT, 1: FRAMED_LIKE_CONFLUENT}


@pytest.mark.parametrize("runtime", ["connect", pytest.param("submit", marks=pytest.mark.long)])
def test_framed_values_are_published_exactly_and_unframed_ones_dead_lettered(
        dsn, servers, pipeline_factory, producer, runtime):
    from kafka_ledger.formats.framing import NOT_FRAMED

    pipeline = pipeline_factory(f"framed_{runtime}", partitions=2)
    values = [framed(good_value(i), 1 + i * 40_000) for i in range(20)] + [good_value(20), b"\x00\x00", framed(b"[]")]
    landed = producer.send(pipeline.topics[0], values)
    assert run_pipeline_dag(pipeline).state == "success"
    assert_exactly_once(dsn, servers, pipeline, {
        landed[20]: NOT_FRAMED, landed[21]: NOT_FRAMED, landed[22]: "malformed JSON (not a JSON object)"})
    published = {(p, o): (event_id, amount) for p, o, event_id, amount in query(
        dsn, f"SELECT kafka_partition, kafka_offset, event_id, amount FROM {pipeline.qualified_output_table}")}
    assert published == {landed[i][1:]: (f"e{i}", i) for i in range(20)}


GOOD = {"id": "a", "customer": {"id": 7, "address": {"city": "Lyon"}}, "amount": 12.5, "ordered_on": "2026-11-26",
        "doc": {"x": [1, 2.50, {"y": None}]}, "meta": {"at": "2026-11-21T10:00:00Z"}, "span": "P1Y2M3DT4H5M6.5S"}
# Intervals as Postgres prints them (each published row's, by its case; the first is GOOD's), and in the lake.
SPANS = {0: ("1 year 2 mons 3 days 04:05:06.5", "P14M3DT14706.500000S"),
         1: ("1 year 2 mons 3 days 04:05:06.5", "P14M3DT14706.500000S"),
         2: ("-00:00:03.5", "P0M0DT-3.500000S"),
         3: ("-1 mons +2 days -03:00:00.5", "P-1M2DT-10800.500000S"),
         4: ("36:00:00", "P0M0DT129600.000000S")}
_BAD_SPAN = ("field 'span' is not a valid interval (ISO-8601 text with designators, e.g. P1Y2M3DT4H5M6.5S, or "
             "seconds)")
# (value, key, headers) -> the reason (None: published).
RICH_CASES: list[tuple[dict | bytes | None, bytes | None, list[tuple[str, bytes]], str | None]] = [
    (GOOD, b"order-1", [("tenant", b"42"), ("trace", b'{"id": "t-1"}')], None),
    ({**GOOD, "amount": "12.50"}, b"k", [], None),  # a decimal as text
    ({**GOOD, "amount": -0.01, "span": -3.5}, None, [("tenant", b" 5 "), ("tenant", b"x")], None),  # first header
    ({**GOOD, "span": "P-1M2DT-3H-0.5S"}, b"k", [], None),  # a sign on each part, as Debezium writes them
    ({**GOOD, "span": "PT36H"}, b"k", [], None),
    ({**GOOD, "span": "1 day"}, b"k", [], _BAD_SPAN),
    ({**GOOD, "span": "PT"}, b"k", [], _BAD_SPAN),
    ({**GOOD, "span": "PT0.0000001S"}, b"k", [], "field 'span' is not a valid interval (more than 6 digits after the "
                                                 "second: they would be lost)"),
    ({**GOOD, "amount": 1.005}, b"k", [], "field 'amount' is not a valid decimal(12,2) (it does not fit exactly: more "
                                         "than 2 digit(s) after the point or 10 before it)"),
    ({**GOOD, "amount": 12345678901.5}, b"k", [], "field 'amount' is not a valid decimal(12,2) (it does not fit "
                                                  "exactly: more than 2 digit(s) after the point or 10 before it)"),
    (b'{"id": "e", "amount": 1.5e3}', b"k", [], "field 'amount' is not a valid decimal(12,2) (a number in exponent "
                                                "notation or of more than 38 digits cannot be kept exactly)"),
    ({**GOOD, "amount": "12,50"}, b"k", [], "field 'amount' is not a valid decimal(12,2)"),
    ({**GOOD, "amount": True}, b"k", [], "field 'amount' is not a valid decimal(12,2)"),
    ({**GOOD, "ordered_on": "2026-02-30"}, b"k", [], "field 'ordered_on' is not a valid date (YYYY-MM-DD)"),
    ({**GOOD, "ordered_on": "2026-11-26T10:00:00"}, b"k", [], "field 'ordered_on' is not a valid date (YYYY-MM-DD)"),
    ({**GOOD, "ordered_on": "0900-01-01"}, b"k", [], "field 'ordered_on' is not a valid date (outside 1900-2199)"),
    ({**GOOD, "doc": "not an object"}, b"k", [], "field 'doc' is not a valid jsonb (a JSON object or array)"),
    (b'{"id": "j", "doc": {"big": 1e400}}', b"k", [], "field 'doc' holds a number that cannot be kept exactly (in "
                                                     "exponent notation, or of more than 38 digits)"),
    ({**GOOD, "doc": {"s": "nul \\u0000"}}, b"k", [], None),  # a backslash, then u0000: no NUL
    ({**GOOD, "doc": {"s": "nul \x00"}}, b"k", [], "field 'doc' contains a NUL character, which Postgres jsonb cannot "
                                                    "store"),
    ({**GOOD, "customer": {"id": "seven"}}, b"k", [], "field 'customer.id' is not a valid long"),
    ({**GOOD, "customer": 5}, b"k", [], "value does not match the declared schema"),
    ({**GOOD, "meta": {"at": "soon"}}, b"k", [], "field 'meta.at' is not a valid timestamp"),
    (GOOD, b"k", [("tenant", b"many")], "header 'tenant' is not a valid long"),
    (GOOD, b"k", [("trace", b"not json")], "header 'trace' is not a JSON object"),
    (GOOD, b"k", [("trace", b'{"id": 5}')], None),  # a number's text in a string column, as from_json gives it
    (GOOD, b"\xff", [], "the Kafka key is not valid UTF-8"),
    ({**GOOD, "id": None}, b"k", [], "required field 'id' is missing or null"),
    # A duplicate key elsewhere in the document leaves an exact column its value (a variant of the whole document
    # could not hold it: every exact column read NULL, published).
    (b'{"id": "dup", "amount": "12.50", "customer": {"id": 7, "id": 8}}', b"k", [], None),
    # A duplicate key inside a jsonb field: no value Postgres would keep as sent (it keeps the last), never NULL.
    (b'{"id": "dupdoc", "doc": {"a": 1, "a": 2}}', b"k", [], "value does not match the declared schema"),
]
# The offset of the case whose exact column sits beside a duplicate key.
_DUPLICATE_KEY_ELSEWHERE = len(RICH_CASES) - 2


def _rich_records(spark):
    rows = []
    for offset, (value, key, headers, _) in enumerate(RICH_CASES):
        raw = value if isinstance(value, bytes | None) else json.dumps(value).encode()
        rows.append(("t", 0, offset, datetime(2026, 11, 21, tzinfo=UTC), key, raw,
                     [{"key": k, "value": v} for k, v in headers]))
    return spark.createDataFrame(rows, "topic string, partition int, offset long, timestamp timestamp, key binary, "
                                       "value binary, headers array<struct<key: string, value: binary>>")


@pytest.mark.parametrize("extra_fields", ["ignore", "dead_letter"])
def test_nested_fields_decimals_dates_jsonb_keys_and_headers_decode_exactly_on_both_paths(spark, extra_fields):
    from decimal import Decimal

    from kafka_ledger.formats.decode import decode_records

    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "columns": RICH_COLUMNS, "extra_fields": extra_fields}}}))["p"]
    records = _rich_records(spark)
    names = [c["name"] for c in RICH_COLUMNS]

    def decoded(lean: bool) -> dict[int, dict]:
        frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean)
        return {row["kafka_offset"]: row.asDict() for row in frame.select("kafka_offset", "error", *names).collect()}

    lean, full = decoded(True), decoded(False)
    assert {o: (lean[o], full[o]) for o in lean if lean[o] != full[o]} == {}
    reasons = {offset: lean[offset]["error"] for offset in lean}
    assert reasons == {offset: case[3] for offset, case in enumerate(RICH_CASES)}
    first = dict(lean[0])
    first.pop("span")
    assert first.pop("at").replace(tzinfo=None) == datetime(2026, 11, 21, 10)  # the session's zone is UTC
    assert first == {"kafka_offset": 0, "error": None, "id": "a", "city": "Lyon", "customer_id": 7,
                     "amount": Decimal("12.50"), "ordered_on": datetime(2026, 11, 26).date(),
                     "doc": '{"x":[1,2.5,{"y":null}]}', "order_key": "order-1", "tenant": 42, "trace": "t-1"}
    assert (lean[1]["amount"], lean[2]["amount"], lean[2]["tenant"], lean[2]["order_key"]) == (
        Decimal("12.50"), Decimal("-0.01"), 5, None)
    assert lean[18]["doc"] == '{"s":"nul \\\\u0000"}'
    assert {o: lean[o]["span"] for o in SPANS} == {o: lake for o, (_, lake) in SPANS.items()}
    assert (lean[_DUPLICATE_KEY_ELSEWHERE]["amount"], lean[_DUPLICATE_KEY_ELSEWHERE]["customer_id"]) == (
        Decimal("12.50"), 8)


def test_unexpected_fields_are_found_inside_the_objects_a_path_goes_through(spark):
    from kafka_ledger.formats.decode import decode_records

    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "extra_fields": "dead_letter", "columns": [
            {"name": "id", "type": "string"}, {"name": "city", "type": "string", "path": "customer.address.city"}]}}}
    ))["p"]
    values = [b'{"id": "a", "customer": {"address": {"city": "Lyon"}}}',
              b'{"id": "a", "customer": {"address": {"city": "Lyon", "zip": "69001"}, "vip": true}, "x": 1}',
              b'{"id": "a", "customer": "flat"}']
    records = spark.createDataFrame(
        [("t", 0, o, datetime(2026, 11, 21, tzinfo=UTC), None, v) for o, v in enumerate(values)],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary")
    errors = {lean: {r["kafka_offset"]: r["error"] for r in decode_records(
        records, pipeline, sink_for(pipeline).envelope, lean=lean).collect()} for lean in (True, False)}
    assert errors[True] == errors[False] == {
        0: None, 1: "unexpected field(s): customer.address.zip, customer.vip, x",
        2: "value does not match the declared schema"}


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_each_timestamp_form_is_published_exactly_or_dead_lettered_with_its_reason(
    dsn, servers, pipeline_factory, producer
):
    pipeline = pipeline_factory("timestamps", partitions=1)
    when = "2026-11-21T10:00:00.123456+00:00"
    seconds, millis, micros = 1_795_255_200, 1_795_255_200_123, 1_795_255_200_123_456
    good = {  # field -> (JSON value, the timestamp published)
        "iso": [("2026-11-21T10:00:00Z", ts("2026-11-21T10:00:00+00:00")),
                ("2026-11-21T12:00:00.123456+02:00", ts(when)),
                ("2026-11-21", ts("2026-11-21T00:00:00+00:00"))],
        "seconds": [(seconds, ts("2026-11-21T10:00:00+00:00")), (seconds + 0.5, ts("2026-11-21T10:00:00.5+00:00")),
                    (str(seconds), ts("2026-11-21T10:00:00+00:00"))],
        "millis": [(millis, ts("2026-11-21T10:00:00.123+00:00"))],
        "micros": [(micros, ts(when)), ("2026-11-21T10:00:00.123456Z", ts(when))],
        "either": [("2026-11-21T10:00:00Z", ts("2026-11-21T10:00:00+00:00")),
                   (seconds, ts("2026-11-21T10:00:00+00:00"))],
    }
    bad = {  # field -> (JSON value, dead-letter reason)
        "iso": [(seconds, "field 'iso' is not a valid timestamp (a number; declared formats: iso8601)"),
                ("3026-01-01T00:00:00Z", "field 'iso' is not a valid timestamp (a date outside 1900-2199)"),
                ("2026-13-45T99:00:00Z", "field 'iso' is not a valid timestamp"),
                (True, "field 'iso' is not a valid timestamp")],
        "seconds": [(millis, "field 'seconds' is not a valid timestamp (a number outside 1900-2199 read as "
                             "epoch_seconds)"),
                    ("2026-11-21T10:00:00Z", "field 'seconds' is not a valid timestamp (ISO-8601 text; declared "
                                             "formats: epoch_seconds)")],
        "millis": [(micros, "field 'millis' is not a valid timestamp (a number outside 1900-2199 read as "
                            "epoch_millis)")],
        "micros": [("soon", "field 'micros' is not a valid timestamp")],
        # Milliseconds in a column of the default forms: the year 58859, never published.
        "either": [(millis, "field 'either' is not a valid timestamp (a number outside 1900-2199 read as "
                            "epoch_seconds)")],
    }
    values = [({"event_id": f"g-{field}-{i}", field: raw}, (field, expected))
              for field, cases in good.items() for i, (raw, expected) in enumerate(cases)]
    values += [({"event_id": f"b-{field}-{i}", field: raw}, reason)
               for field, cases in bad.items() for i, (raw, reason) in enumerate(cases)]
    landed = producer.send(pipeline.topics[0], [json.dumps(value).encode() for value, _ in values])

    assert run_pipeline_dag(pipeline).state == "success"
    expected_dead = {landed[i]: outcome for i, (_, outcome) in enumerate(values) if isinstance(outcome, str)}
    assert_exactly_once(dsn, servers, pipeline, expected_dead)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT event_id, iso, seconds, millis, micros, either FROM "
                    f"{pipeline.qualified_output_table}")
        published = {row[0]: dict(zip(["iso", "seconds", "millis", "micros", "either"], row[1:], strict=True))
                     for row in cur.fetchall()}
    conn.close()
    for value, outcome in values:
        if not isinstance(outcome, str):
            field, expected = outcome
            assert published[value["event_id"]][field] == expected, (value, published[value["event_id"]])


def test_a_column_can_narrow_its_years_to_catch_seconds_read_as_milliseconds(spark):
    from kafka_ledger.formats.decode import decode_records

    pipeline = parse_pipelines(json.dumps({"pipelines": {"p": {"topics": ["t"], "output_table": "t", "columns": [
        {"name": "at", "type": "timestamp", "formats": ["epoch_millis"], "years": [2000, 2100]}]}}}))["p"]
    records = spark.createDataFrame(
        [("t", 0, 0, datetime(2026, 1, 1, tzinfo=UTC), None, b'{"at": 1795255200}'),  # seconds: January 1970
         ("t", 0, 1, datetime(2026, 1, 1, tzinfo=UTC), None, b'{"at": 1795255200000}')],
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary",
    )
    from pyspark.sql import functions as F

    decoded = decode_records(records, pipeline, sink_for(pipeline).envelope).select(
        "kafka_offset", "error", F.col("at").cast("string"))
    rows = {r["kafka_offset"]: (r["error"], r["at"]) for r in decoded.collect()}
    assert rows == {
        0: ("field 'at' is not a valid timestamp (a number outside 2000-2100 read as epoch_millis)", None),
        1: (None, "2026-11-21 10:00:00"),
    }


@pytest.mark.parametrize("runtime", ["connect", pytest.param("submit", marks=pytest.mark.long)])
def test_every_type_edge_value_is_published_exactly(dsn, servers, pipeline_factory, producer, runtime):
    """Values whose text form is easy to get wrong (quotes, line breaks, an empty string, extreme numbers, the
    special doubles, microseconds) come out of Postgres as they went into Kafka."""
    import math

    pipeline = pipeline_factory(f"edge_values_{runtime}", partitions=2)
    strings = ['say "hi"', "a,b\nc\r\nd", "\\.", "caf\u00e9 \U0001f600", "", "back\\slash", "tab\there", " padded "]
    longs = [-2**63, 2**63 - 1, 0]
    doubles = [0.1, 1 / 3, 1e300, 5e-324, -0.0, float("nan"), float("inf"), float("-inf"), -2.5e-10]
    values = [{"event_id": text, "amount": longs[i % len(longs)], "price": doubles[i % len(doubles)],
               "ok": [True, False, None][i % 3], "event_time": f"2026-11-21T10:00:{i:02d}.{i:06d}Z"}
              for i, text in enumerate(strings + [f"n{i}" for i in range(len(doubles))])]
    landed = producer.send(pipeline.topics[0], [json.dumps(value).encode() for value in values])

    assert run_pipeline_dag(pipeline).state == "success"
    assert_exactly_once(dsn, servers, pipeline, {})
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT kafka_partition, kafka_offset, event_id, amount, price, ok, event_time "
                    f"FROM {pipeline.qualified_output_table}")
        published = {(p, o): row for p, o, *row in cur.fetchall()}
    conn.close()
    for i, value in enumerate(values):
        event_id, amount, price, ok, event_time = published[landed[i][1:]]
        assert (event_id, amount, ok) == (value["event_id"], value["amount"], value["ok"]), value
        assert event_time == datetime(2026, 11, 21, 10, 0, i, i, tzinfo=UTC), value
        expected = value["price"]
        assert (math.isnan(price) if math.isnan(expected)
                else price == expected and math.copysign(1, price) == math.copysign(1, expected)), (value, price)


@pytest.mark.parametrize("key", ["rich_connect", "rich_submit", "rich_iceberg"])
def test_nested_fields_decimals_dates_jsonb_keys_and_headers_are_published_exactly(
        dsn, servers, pipeline_factory, producer, key):
    """Each runtime and sink publishes the newer kinds and sources exactly (binary COPY, the submit runtime's staging,
    an Iceberg snapshot), and dead-letters what does not fit with its reason."""
    from decimal import Decimal

    from kafka_ledger.sinks import sink_for

    pipeline = pipeline_factory(key, partitions=2)
    values = [value if isinstance(value, bytes | None) else json.dumps(value).encode()
              for value, _, _, _ in RICH_CASES]
    landed = producer.send(pipeline.topics[0], values, keys=[k for _, k, _, _ in RICH_CASES],
                           headers=[h for _, _, h, _ in RICH_CASES])
    catch_up(dsn, servers, pipeline)
    assert_exactly_once(dsn, servers, pipeline, {landed[i]: reason for i, (*_, reason) in enumerate(RICH_CASES)
                                                 if reason is not None})
    names = [c["name"] for c in RICH_COLUMNS]
    sink = sink_for(pipeline)
    if pipeline.sink.type == "iceberg":
        table = sink.table().scan().to_arrow().to_pylist()
        rows = {(r["kafka_partition"], r["kafka_offset"]): {n: r[n] for n in names} for r in table}
    else:
        # An interval as Postgres prints it (psycopg2's timedelta would count a month as 30 days).
        selected = ", ".join(f"{n}::text" if n == "span" else n for n in names)
        rows = {(p, o): dict(zip(names, rest, strict=True)) for p, o, *rest in query(
            dsn, f"SELECT kafka_partition, kafka_offset, {selected} FROM {pipeline.qualified_output_table}")}
    held = 1 if pipeline.sink.type == "iceberg" else 0
    assert {i: rows[landed[i][1:]]["span"] for i in SPANS} == {i: forms[held] for i, forms in SPANS.items()}
    first = rows[landed[0][1:]]
    first.pop("span")
    at = first.pop("at")
    assert at == datetime(2026, 11, 21, 10, tzinfo=UTC)
    doc = first.pop("doc")
    # jsonb in Postgres comes back parsed; the lake keeps the JSON text.
    assert (json.loads(doc) if isinstance(doc, str) else doc) == {"x": [1, 2.5, {"y": None}]}
    assert first == {"id": "a", "city": "Lyon", "customer_id": 7, "amount": Decimal("12.50"),
                     "ordered_on": datetime(2026, 11, 26).date(), "order_key": "order-1", "tenant": 42, "trace": "t-1"}
    assert [rows[landed[i][1:]]["amount"] for i in (1, 2)] == [Decimal("12.50"), Decimal("-0.01")]
    assert (rows[landed[2][1:]]["tenant"], rows[landed[2][1:]]["order_key"]) == (5, None)
    if pipeline.sink.type == "postgres":
        [(column_types,)] = query(dsn, "SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY "
                                       "ordinal_position) FROM information_schema.columns WHERE table_schema = %s "
                                       "AND table_name = %s AND column_name IN ('amount', 'ordered_on', 'doc', 'span')",
                                  pipeline.output_schema, pipeline.output_table)
        assert column_types == "amount numeric, ordered_on date, doc jsonb, span interval"
