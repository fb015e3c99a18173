"""A status of many partitions in pages (ops/overview.partition_page): kafka-ledger status and the pipeline's page."""

from __future__ import annotations

import pytest

from kafka_ledger.ops import overview


def status(partitions: int, lagging: dict[int, tuple[int, float | None]] | None = None) -> dict:
    lagging = lagging or {}
    return {"pipeline": "wide", "partitions": [
        {"topic": "t", "partition": p, "lag": lagging.get(p, (0, None))[0], "lag_seconds": lagging.get(p, (0, None))[1]}
        for p in range(partitions)]}


def test_a_page_holds_its_share_of_the_partitions_in_order_and_says_how_many_there_are():
    page = overview.partition_page(status(10_000), page=3)
    assert [p["partition"] for p in page["partitions"]] == list(range(200, 300))
    assert (page["page"], page["pages"], page["partitions_total"], page["partitions_lagging"]) == (3, 100, 10_000, 0)
    last = overview.partition_page(status(250), page=3)
    assert [p["partition"] for p in last["partitions"]] == list(range(200, 250))


def test_all_partitions_on_one_page_and_a_small_pipeline_is_one_page():
    assert len(overview.partition_page(status(10_000), size=None)["partitions"]) == 10_000
    assert overview.partition_page(status(4))["pages"] == 1


def test_the_most_behind_partitions_come_from_every_page_by_lag_in_seconds_then_offsets():
    page = overview.partition_page(status(1_000, {5: (10, 2.0), 900: (3, 60.0), 901: (500, None), 7: (40, 2.0)}))
    assert [p["partition"] for p in page["most_behind"]] == [900, 7, 5, 901]
    assert page["partitions_lagging"] == 4


def test_a_page_beyond_the_last_is_refused_naming_how_many_there_are():
    with pytest.raises(overview.PageError, match="page 4 does not exist: wide has 250 partition"):
        overview.partition_page(status(250), page=4)
