"""The direct publish's client side: COPY bytes from a stream of Arrow tables, dead letters kept apart, stats."""

import pyarrow as pa
import pytest

from kafka_ledger.planning import PartitionReadStats, check_read_coverage
from kafka_ledger.publish import LINE_COLUMNS, CopyStream


def table(rows: list[tuple[str, int, int, bool, str]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in LINE_COLUMNS]
    types = [pa.string(), pa.int32(), pa.int64(), pa.bool_(), pa.string()]
    return pa.table([pa.array(c, type=t) for c, t in zip(columns, types, strict=True)], names=LINE_COLUMNS)


def drain(stream: CopyStream, size: int) -> bytes:
    out = b""
    while chunk := stream.read(size):
        assert len(chunk) <= size
        out += chunk
    return out


@pytest.mark.parametrize("size", [1, 7, 1 << 20])
def test_output_lines_stream_in_order_whatever_the_read_size(size):
    tables = [
        table([("t", 0, 0, True, "a,0\n"), ("t", 0, 1, False, "dead-1\n"), ("t", 1, 0, True, "b,\"x\"\"y\"\n")]),
        table([]),
        table([("t", 0, 2, True, "c\n")]),
    ]
    stream = CopyStream(iter(tables))
    assert drain(stream, size) == b'a,0\nb,"x""y"\nc\n'
    assert stream.dead_letter_lines() == b"dead-1\n"
    assert stream.records == 4


def test_a_sliced_arrow_array_gives_only_its_own_values():
    whole = table([("t", 0, i, True, f"line{i}\n") for i in range(5)])
    stream = CopyStream([whole.slice(2, 2)])
    assert drain(stream, 1 << 20) == b"line2\nline3\n"


def test_read_stats_feed_the_coverage_check():
    from kafka_ledger.planning import OffsetRange

    stream = CopyStream([
        table([("t", 0, 5, True, "x\n"), ("t", 0, 6, False, "d\n"), ("t", 1, 0, True, "y\n")]),
        table([("t", 0, 6, True, "again\n")]),
    ])
    drain(stream, 1 << 20)
    stats = sorted(stream.read_stats(), key=lambda s: (s.topic, s.partition))
    assert stats == [PartitionReadStats("t", 0, 3, 2, 5, 6, 1), PartitionReadStats("t", 1, 1, 1, 0, 0, 0)]
    # The offset read twice is caught before anything is committed.
    problems = check_read_coverage([OffsetRange("t", 0, 5, 7), OffsetRange("t", 1, 0, 1)], stats)
    assert "t-0 [5, 7): 1 offsets read more than once" in problems


def test_nothing_read_gives_no_bytes_and_no_stats():
    stream = CopyStream(iter(()))
    assert stream.read(100) == b"" and stream.read_stats() == [] and stream.dead_letter_lines() == b""


def test_a_failing_row_stream_is_remembered_for_a_clear_error():
    def tables():
        yield table([("t", 0, 0, True, "a\n")])
        raise ConnectionError("server went away")

    stream = CopyStream(tables())
    assert stream.read(100) == b"a\n"
    with pytest.raises(ConnectionError):
        stream.read(100)
    assert isinstance(stream.error, ConnectionError)


def test_the_stream_times_its_first_rows_and_the_waits_after_them():
    import time

    def tables():
        time.sleep(0.05)  # before the first rows: the gap, not a wait of COPY
        yield table([])
        yield table([("t", 0, 0, True, "a\n")])
        time.sleep(0.1)  # COPY waits for Spark's next rows
        yield table([("t", 0, 1, True, "b\n")])

    before = time.monotonic()
    stream = CopyStream(tables())
    assert drain(stream, 1 << 20) == b"a\nb\n"
    assert stream.first_rows_at is not None and stream.first_rows_at - before >= 0.05
    assert 0.1 <= stream.waiting_seconds < 0.5


def test_a_stream_without_rows_has_no_first_rows():
    stream = CopyStream([table([])])
    assert drain(stream, 100) == b"" and stream.first_rows_at is None and stream.waiting_seconds == 0.0
