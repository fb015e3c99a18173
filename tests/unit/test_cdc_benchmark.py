"""The CDC benchmark's change events: the op mix the issue names, and a history Debezium could have written."""

from __future__ import annotations

import json
from collections import Counter

from tools.benchmark import cdc_events, cdc_value


def test_the_events_are_a_source_tables_possible_history_in_the_named_mix():
    history = cdc_events(100_000, 10_000)  # the 1,000,000 over 100,000, a tenth
    assert Counter(op for op, _ in history) == {"r": 20_000, "u": 60_000, "d": 10_000, "c": 10_000}
    alive: set[int] = set()
    for op, key in history:
        if op in ("u", "d"):
            assert key in alive, (op, key)
        if op == "c":
            assert key not in alive, (op, key)
        alive = alive - {key} if op == "d" else alive | {key}
    assert alive == set(range(10_000))


def test_a_delete_carries_its_key_in_the_old_row_image_and_no_row_image():
    event = json.loads(cdc_value("d", 7, 42))
    assert (event["op"], event["before"]["id"], event["after"], event["source"]["lsn"]) == ("d", 7, None, 42)
    assert json.loads(cdc_value("u", 7, 43))["after"]["balance"] == "-9999.57"
