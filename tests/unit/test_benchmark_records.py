"""The benchmarks' records: the value template writes exactly what json.dumps would."""

from __future__ import annotations

import json

from tools.benchmark_peers import record, record_value


def test_a_records_value_is_json_dumps_of_the_record_byte_for_byte():
    for i in [*range(2_000), 10**9 + 7, 2**53 + 1, 123_456_789_012]:
        expected = json.dumps({**record(i), "event_time": "2026-11-21T10:00:00Z"}).encode()
        assert record_value(i) == expected, i
    assert record_value(12, users=5) == json.dumps({**record(12, 5), "event_time": "2026-11-21T10:00:00Z"}).encode()
