"""The direct publish's client side: output rows encoded as binary COPY, dead letters kept apart, stats."""

import math
import struct
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.model.columns import DEAD_LETTER_LINE, PUBLISHED
from kafka_ledger.model.ranges import PartitionReadStats, check_read_coverage
from kafka_ledger.sinks import sink_for
from kafka_ledger.sinks.postgres.copy import CopyStream, output_rows, output_schema

PIPELINE = PipelineConfig.model_validate(
    {"name": "p", "topics": ["t"], "output_table": "out", "columns": [{"name": "name", "type": "string"}]})
PUBLISHED_COLUMNS = sink_for(PIPELINE).published_columns()
SCHEMA = output_schema(PUBLISHED_COLUMNS)
AT = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)
TIMESTAMP = pa.timestamp("us", tz="UTC")
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def numeric(raw: bytes) -> Decimal:
    """Postgres's binary numeric: digit count, weight, sign, display scale, then base-10000 digits."""
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHH", raw)
    digits = struct.unpack_from(f">{ndigits}H", raw, 8)
    value = sum((Decimal(d) * Decimal(10000) ** (weight - i) for i, d in enumerate(digits)), Decimal(0))
    value = value.quantize(Decimal(1).scaleb(-dscale))
    return -value if sign == 0x4000 else value


# How Postgres's binary receive functions read each kind's value (the wire forms of the kinds' Postgres types).
READ_VALUE = {
    "string": lambda raw: raw.decode(), "long": lambda raw: struct.unpack(">q", raw)[0],
    "int": lambda raw: struct.unpack(">i", raw)[0], "double": lambda raw: struct.unpack(">d", raw)[0],
    "boolean": lambda raw: raw == b"\x01",
    "timestamp": lambda raw: PG_EPOCH + timedelta(microseconds=struct.unpack(">q", raw)[0]),
    "date": lambda raw: date(2000, 1, 1) + timedelta(days=struct.unpack(">i", raw)[0]),
    "decimal(12,2)": numeric,
    # jsonb: a version byte (1), then the text.
    "jsonb": lambda raw: (raw[:1], raw[1:].decode()),
}
KINDS = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(), "boolean": pa.bool_(),
         "timestamp": TIMESTAMP}


def copy_rows(data: bytes, pipeline: PipelineConfig = PIPELINE) -> list[tuple]:
    """The rows of binary COPY data as Postgres reads them into the pipeline's output columns: the signature and
    header, then each row's field count and fields (length, -1 for NULL, then the bytes), then the trailer."""
    assert data[:11] == b"PGCOPY\n\xff\r\n\x00"
    flags, extension = struct.unpack_from(">iI", data, 11)
    assert flags == 0
    kinds = [str(kind) for kind in sink_for(pipeline).published_columns().values()]
    pos, rows = 19 + extension, []
    while True:
        (count,) = struct.unpack_from(">h", data, pos)
        pos += 2
        if count == -1:
            assert pos == len(data), "bytes after the trailer"
            return rows
        assert count == len(kinds)
        row = []
        for kind in kinds:
            (size,) = struct.unpack_from(">i", data, pos)
            pos += 4
            row.append(None if size == -1 else READ_VALUE[kind](data[pos:pos + size]))
            pos += max(size, 0)
        rows.append(tuple(row))


def table(rows: list[tuple[str, int, int, str | None, str | None]]) -> pa.Table:
    """A publish_frame table of PIPELINE: (topic, partition, offset, name, dead letter line); a row with a dead
    letter line is a dead letter."""
    topics, partitions, offsets, names, dead = (list(c) for c in zip(*rows, strict=True)) if rows else ([],) * 5
    return pa.table({
        "kafka_topic": pa.array(topics, pa.string()), "kafka_partition": pa.array(partitions, pa.int32()),
        "kafka_offset": pa.array(offsets, pa.int64()), PUBLISHED: pa.array([d is None for d in dead], pa.bool_()),
        "name": pa.array(names, pa.string()),
        # publish_frame carries output values for published rows only: a dead letter's timestamp is null.
        "kafka_timestamp": pa.array([AT if d is None else None for d in dead], TIMESTAMP),
        DEAD_LETTER_LINE: pa.array(dead, pa.string()),
    })


def stream_of(tables, batch_id: int = 7) -> CopyStream:
    return CopyStream(tables, PUBLISHED_COLUMNS, batch_id)


def drain(stream: CopyStream, size: int) -> bytes:
    out = b""
    while chunk := stream.read(size):
        assert len(chunk) <= size
        out += chunk
    return out


@pytest.mark.parametrize("size", [1, 7, 1 << 20])
def test_output_rows_stream_in_order_whatever_the_read_size(size):
    tables = [
        table([("t", 0, 0, "a", None), ("t", 0, 1, None, "dead-1\n"), ("t", 1, 0, 'x"y', None)]),
        table([]),
        table([("t", 0, 2, None, None)]),
    ]
    stream = stream_of(iter(tables))
    assert copy_rows(drain(stream, size)) == [
        ("a", "t", 0, 0, AT, 7), ('x"y', "t", 1, 0, AT, 7), (None, "t", 0, 2, AT, 7)]
    assert stream.dead_letter_lines() == b"dead-1\n"
    assert stream.records == 4


def test_every_type_is_encoded_as_postgres_binary_copy_reads_it():
    kinds = ["string", "long", "int", "double", "boolean", "timestamp"]
    pipeline = PipelineConfig.model_validate({"name": "p", "topics": ["t"], "output_table": "out", "columns": [
        {"name": kind, "type": kind} for kind in kinds]})
    values = {
        "string": ["", None, 'say "hi"', "a,b\nc", "\\.", "é", "plain"],
        "long": [-2**63, 2**63 - 1, None, 0, 1, 2, 3],
        "int": [-2**31, 2**31 - 1, None, 0, 1, 2, 3],
        "double": [0.1, -0.0, None, float("nan"), float("inf"), 5e-324, 1e300],
        "boolean": [True, False, None, True, False, True, False],
        "timestamp": [datetime(1900, 1, 1, tzinfo=UTC), AT, None,
                      datetime(2199, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC),
                      datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), AT],
    }
    frame = pa.table({**{kind: pa.array(values[kind], KINDS[kind]) for kind in kinds},
                      "kafka_topic": pa.array(["t"] * 7), "kafka_partition": pa.array([0] * 7, pa.int32()),
                      "kafka_offset": pa.array(range(7), pa.int64()), "kafka_timestamp": pa.array([AT] * 7, TIMESTAMP)})
    published = sink_for(pipeline).published_columns()
    stream = CopyStream([frame.append_column(PUBLISHED, pa.array([True] * 7))], published, 3)
    rows = copy_rows(drain(stream, 1 << 20), pipeline)
    for i, row in enumerate(rows):
        *declared, topic, partition, offset, kafka_timestamp, batch_id = row
        assert (topic, partition, offset, kafka_timestamp, batch_id) == ("t", 0, i, AT, 3)
        for kind, value in zip(kinds, declared, strict=True):
            expected = values[kind][i]
            if kind == "double" and expected is not None:  # NaN is not equal to itself; -0.0 equals 0.0
                same_bits = struct.pack(">d", value) == struct.pack(">d", expected)
                assert math.isnan(value) if math.isnan(expected) else same_bits
            else:
                assert value == expected, (kind, i)
    assert len(rows) == 7


def test_decimals_dates_and_jsonb_are_encoded_as_postgres_binary_copy_reads_them():
    pipeline = PipelineConfig.model_validate({"name": "p", "topics": ["t"], "output_table": "out", "columns": [
        {"name": "amount", "type": "decimal(12,2)"}, {"name": "day", "type": "date"},
        {"name": "doc", "type": "jsonb"}]})
    amounts = [Decimal("0.00"), Decimal("-12.50"), None, Decimal("9999999999.99"), Decimal("0.01")]
    days = [date(2026, 11, 26), date(1900, 1, 1), None, date(2199, 12, 31), date(2000, 1, 1)]
    docs = ['{"a": 1}', "[1, 2.50]", None, '{"nested": {"x": [true, null]}}', "{}"]
    frame = pa.table({"amount": pa.array(amounts, pa.decimal128(12, 2)), "day": pa.array(days, pa.date32()),
                      "doc": pa.array(docs, pa.string()), "kafka_topic": pa.array(["t"] * 5),
                      "kafka_partition": pa.array([0] * 5, pa.int32()), "kafka_offset": pa.array(range(5), pa.int64()),
                      "kafka_timestamp": pa.array([AT] * 5, TIMESTAMP), PUBLISHED: pa.array([True] * 5)})
    rows = copy_rows(drain(CopyStream([frame], sink_for(pipeline).published_columns(), 3), 1 << 20), pipeline)
    assert [r[0] for r in rows] == amounts
    assert [r[1] for r in rows] == days
    assert [r[2] for r in rows] == [None if d is None else (b"\x01", d) for d in docs]


def test_columns_are_encoded_in_their_kinds_types_and_a_value_that_does_not_fit_is_refused():
    frame = table([("t", 0, 0, "a", None)])
    wide = frame.set_column(frame.schema.get_field_index("kafka_partition"), "kafka_partition",
                            frame["kafka_partition"].cast(pa.int64()))
    assert output_rows(wide, SCHEMA, 1).schema == SCHEMA
    assert output_rows(wide, SCHEMA, 1) == output_rows(frame, SCHEMA, 1)
    too_big = wide.set_column(wide.schema.get_field_index("kafka_partition"), "kafka_partition",
                              pa.array([2**40], pa.int64()))
    with pytest.raises(pa.ArrowInvalid):
        output_rows(too_big, SCHEMA, 1)


def test_timestamps_keep_their_instant_whatever_their_zone_and_never_go_without_one():
    frame = table([("t", 0, 0, "a", None)])
    paris = frame.set_column(frame.schema.get_field_index("kafka_timestamp"), "kafka_timestamp",
                             frame["kafka_timestamp"].cast(pa.timestamp("us", tz="Europe/Paris")))
    assert output_rows(paris, SCHEMA, 1) == output_rows(frame, SCHEMA, 1)
    naive = frame.set_column(frame.schema.get_field_index("kafka_timestamp"), "kafka_timestamp",
                             frame["kafka_timestamp"].cast(pa.timestamp("us")))
    with pytest.raises(TypeError, match="without time zone"):
        output_rows(naive, SCHEMA, 1)


def test_a_sliced_arrow_table_gives_only_its_own_rows():
    whole = table([("t", 0, i, f"n{i}", None) for i in range(5)])
    stream = stream_of([whole.slice(2, 2)])
    assert copy_rows(drain(stream, 1 << 20)) == [("n2", "t", 0, 2, AT, 7), ("n3", "t", 0, 3, AT, 7)]


def test_read_stats_feed_the_coverage_check():
    from kafka_ledger.model.ranges import OffsetRange

    stream = stream_of([
        table([("t", 0, 5, "x", None), ("t", 0, 6, None, "d\n"), ("t", 1, 0, "y", None)]),
        table([("t", 0, 6, "again", None)]),
    ])
    drain(stream, 1 << 20)
    stats = sorted(stream.read_stats(), key=lambda s: (s.topic, s.partition))
    assert stats == [PartitionReadStats("t", 0, 3, 2, 5, 6, 1, AT), PartitionReadStats("t", 1, 1, 1, 0, 0, 0, AT)]
    # The offset read twice is caught before anything is committed.
    problems = check_read_coverage([OffsetRange("t", 0, 5, 7), OffsetRange("t", 1, 0, 1)], stats)
    assert "t-0 [5, 7): 1 offsets read more than once" in problems


def test_read_stats_carry_each_partitions_newest_published_timestamp_never_a_dead_letters():
    def at(seconds: int, frame: pa.Table) -> pa.Table:
        index = frame.schema.get_field_index("kafka_timestamp")
        later = pa.array([AT + timedelta(seconds=seconds) if v.is_valid else None for v in frame["kafka_timestamp"]],
                         TIMESTAMP)
        return frame.set_column(index, "kafka_timestamp", later)

    stream = stream_of([at(30, table([("t", 0, 1, "x", None)])), at(10, table([("t", 0, 2, "y", None)])),
                        table([("t", 1, 0, None, "d\n")])])
    drain(stream, 1 << 20)
    newest = {(s.topic, s.partition): s.newest_timestamp for s in stream.read_stats()}
    assert newest == {("t", 0): AT + timedelta(seconds=30), ("t", 1): None}


def test_nothing_read_gives_copy_data_without_rows_and_no_stats():
    stream = stream_of(iter(()))
    assert copy_rows(drain(stream, 100)) == [] and stream.read_stats() == [] and stream.dead_letter_lines() == b""


def test_a_failing_row_stream_is_remembered_for_a_clear_error():
    def tables():
        yield table([("t", 0, 0, "a", None)])
        raise ConnectionError("server went away")

    stream = stream_of(tables())
    with pytest.raises(ConnectionError):
        drain(stream, 100)
    assert isinstance(stream.error, ConnectionError)


def test_the_stream_times_its_first_rows_and_the_waits_after_them():
    import time

    def tables():
        time.sleep(0.05)  # before the first rows: the gap, not a wait of COPY
        yield table([])
        yield table([("t", 0, 0, "a", None)])
        time.sleep(0.1)  # COPY waits for Spark's next rows
        yield table([("t", 0, 1, "b", None)])

    before = time.monotonic()
    stream = stream_of(tables())
    assert len(copy_rows(drain(stream, 1 << 20))) == 2
    assert stream.first_rows_at is not None and stream.first_rows_at - before >= 0.05
    assert 0.1 <= stream.waiting_seconds < 0.5


def test_a_stream_without_rows_has_no_first_rows():
    stream = stream_of([table([])])
    assert copy_rows(drain(stream, 100)) == [] and stream.first_rows_at is None and stream.waiting_seconds == 0.0
