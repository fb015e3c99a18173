"""The direct publish's client side: output rows rendered as COPY CSV, dead letters kept apart, stats."""

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from kafka_ledger.config import PipelineConfig
from kafka_ledger.planning import PartitionReadStats, check_read_coverage
from kafka_ledger.publish import DEAD_LETTER_LINE, PUBLISHED, CopyStream, output_csv

PIPELINE = PipelineConfig.model_validate(
    {"name": "p", "topics": ["t"], "output_table": "out", "columns": [{"name": "name", "type": "string"}]})
AT = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)
STAMP = '"2026-11-21 10:00:00.123456+00"'  # as text, quoted like every string
TIMESTAMP = pa.timestamp("us", tz="UTC")


def table(rows: list[tuple[str, int, int, str | None, str | None]]) -> pa.Table:
    """A publish_frame table of PIPELINE: (topic, partition, offset, name, dead letter line); a row with a dead
    letter line is a dead letter."""
    topics, partitions, offsets, names, dead = (list(c) for c in zip(*rows, strict=True)) if rows else ([],) * 5
    return pa.table({
        "kafka_topic": pa.array(topics, pa.string()), "kafka_partition": pa.array(partitions, pa.int32()),
        "kafka_offset": pa.array(offsets, pa.int64()), PUBLISHED: pa.array([d is None for d in dead], pa.bool_()),
        "name": pa.array(names, pa.string()), "kafka_timestamp": pa.array([AT] * len(rows), TIMESTAMP),
        DEAD_LETTER_LINE: pa.array(dead, pa.string()),
    })


def stream_of(tables, batch_id: int = 7) -> CopyStream:
    return CopyStream(tables, PIPELINE, batch_id)


def drain(stream: CopyStream, size: int) -> bytes:
    out = b""
    while chunk := stream.read(size):
        assert len(chunk) <= size
        out += chunk
    return out


@pytest.mark.parametrize("size", [1, 7, 1 << 20])
def test_output_lines_stream_in_order_whatever_the_read_size(size):
    tables = [
        table([("t", 0, 0, "a", None), ("t", 0, 1, None, "dead-1\n"), ("t", 1, 0, 'x"y', None)]),
        table([]),
        table([("t", 0, 2, None, None)]),
    ]
    stream = stream_of(iter(tables))
    assert drain(stream, size) == (f'"a","t",0,0,{STAMP},7\n"x""y","t",1,0,{STAMP},7\n,"t",0,2,{STAMP},7\n').encode()
    assert stream.dead_letter_lines() == b"dead-1\n"
    assert stream.records == 4


def test_every_type_is_written_as_postgres_csv_copy_reads_it():
    pipeline = PipelineConfig.model_validate({"name": "p", "topics": ["t"], "output_table": "out", "columns": [
        {"name": "s", "type": "string"}, {"name": "l", "type": "long"}, {"name": "i", "type": "int"},
        {"name": "d", "type": "double"}, {"name": "b", "type": "boolean"}, {"name": "ts", "type": "timestamp"}]})
    values = {
        # An empty string is quoted and a NULL is not: COPY tells them apart that way.
        "s": pa.array(["", None, 'say "hi"', "a,b\nc", "\\.", "é", "plain"]),
        "l": pa.array([-2**63, 2**63 - 1, None, 0, 1, 2, 3], pa.int64()),
        "i": pa.array([-2**31, 2**31 - 1, None, 0, 1, 2, 3], pa.int32()),
        # Doubles in their shortest exact form; Postgres reads nan, inf and -inf as well.
        "d": pa.array([0.1, -0.0, None, float("nan"), float("inf"), 5e-324, 1e300]),
        "b": pa.array([True, False, None, True, False, True, False]),
        "ts": pa.array([datetime(1900, 1, 1, tzinfo=UTC), AT, None, datetime(2199, 12, 31, 23, 59, 59, 999999,
                                                                               tzinfo=UTC), AT, AT, AT], TIMESTAMP),
    }
    frame = pa.table({**values, "kafka_topic": pa.array(["t"] * 7), "kafka_partition": pa.array([0] * 7, pa.int32()),
                      "kafka_offset": pa.array(range(7), pa.int64()), "kafka_timestamp": pa.array([AT] * 7, TIMESTAMP)})
    lines = output_csv(frame, pipeline, 3).to_pybytes().decode().splitlines(keepends=True)
    tail = f'"t",0,{{}},{STAMP},3\n'
    assert "".join(lines) == "".join([
        f'"",-9223372036854775808,-2147483648,0.1,true,"1900-01-01 00:00:00.000000+00",{tail.format(0)}',
        f',9223372036854775807,2147483647,-0,false,{STAMP},{tail.format(1)}',
        f'"say ""hi""",,,,,,{tail.format(2)}',
        f'"a,b\nc",0,0,nan,true,"2199-12-31 23:59:59.999999+00",{tail.format(3)}',
        f'"\\.",1,1,inf,false,{STAMP},{tail.format(4)}',
        f'"é",2,2,5e-324,true,{STAMP},{tail.format(5)}',
        f'"plain",3,3,1e+300,false,{STAMP},{tail.format(6)}',
    ])


def test_timestamps_are_written_in_utc_whatever_their_zone_and_never_without_one():
    frame = table([("t", 0, 0, "a", None)])
    paris = frame.set_column(frame.schema.get_field_index("kafka_timestamp"), "kafka_timestamp",
                             frame["kafka_timestamp"].cast(pa.timestamp("us", tz="Europe/Paris")))
    assert output_csv(paris, PIPELINE, 1) == output_csv(frame, PIPELINE, 1)
    naive = frame.set_column(frame.schema.get_field_index("kafka_timestamp"), "kafka_timestamp",
                             frame["kafka_timestamp"].cast(pa.timestamp("us")))
    with pytest.raises(TypeError, match="without time zone"):
        output_csv(naive, PIPELINE, 1)


def test_a_sliced_arrow_table_gives_only_its_own_rows():
    whole = table([("t", 0, i, f"n{i}", None) for i in range(5)])
    stream = stream_of([whole.slice(2, 2)])
    assert drain(stream, 1 << 20) == f'"n2","t",0,2,{STAMP},7\n"n3","t",0,3,{STAMP},7\n'.encode()


def test_read_stats_feed_the_coverage_check():
    from kafka_ledger.planning import OffsetRange

    stream = stream_of([
        table([("t", 0, 5, "x", None), ("t", 0, 6, None, "d\n"), ("t", 1, 0, "y", None)]),
        table([("t", 0, 6, "again", None)]),
    ])
    drain(stream, 1 << 20)
    stats = sorted(stream.read_stats(), key=lambda s: (s.topic, s.partition))
    assert stats == [PartitionReadStats("t", 0, 3, 2, 5, 6, 1), PartitionReadStats("t", 1, 1, 1, 0, 0, 0)]
    # The offset read twice is caught before anything is committed.
    problems = check_read_coverage([OffsetRange("t", 0, 5, 7), OffsetRange("t", 1, 0, 1)], stats)
    assert "t-0 [5, 7): 1 offsets read more than once" in problems


def test_nothing_read_gives_no_bytes_and_no_stats():
    stream = stream_of(iter(()))
    assert stream.read(100) == b"" and stream.read_stats() == [] and stream.dead_letter_lines() == b""


def test_a_failing_row_stream_is_remembered_for_a_clear_error():
    def tables():
        yield table([("t", 0, 0, "a", None)])
        raise ConnectionError("server went away")

    stream = stream_of(tables())
    assert stream.read(100) == f'"a","t",0,0,{STAMP},7\n'.encode()
    with pytest.raises(ConnectionError):
        stream.read(100)
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
    assert drain(stream, 1 << 20).count(b"\n") == 2
    assert stream.first_rows_at is not None and stream.first_rows_at - before >= 0.05
    assert 0.1 <= stream.waiting_seconds < 0.5


def test_a_stream_without_rows_has_no_first_rows():
    stream = stream_of([table([])])
    assert drain(stream, 100) == b"" and stream.first_rows_at is None and stream.waiting_seconds == 0.0
