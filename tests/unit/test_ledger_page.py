"""The Kafka Ledger page's pure parts: partition figures, shown payloads, charts, relative links, the guard."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import Depends, HTTPException
from fastapi.testclient import TestClient

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.ledger.db import PositionRow
from kafka_ledger.model.ranges import Coverage, PartitionOffsets, TopicPartition
from kafka_ledger.ops import overview
from kafka_ledger.ops.web.app import create_app
from kafka_ledger.ops.web.charts import Point, bar_chart

NOW = datetime(2026, 11, 23, tzinfo=UTC)


def pipeline(**overrides) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "clicks", "topics": ["clicks"], "output_table": "clicks",
        "columns": [{"name": "id", "type": "string"}], **overrides,
    })


def test_partition_report_gives_lag_skipped_lost_and_partitions_not_read_yet():
    tp0, tp1, tp2, gone = (TopicPartition("clicks", p) for p in range(4))
    offsets = {tp0: PartitionOffsets(0, 100), tp1: PartitionOffsets(50, 60), tp2: PartitionOffsets(5, 9)}
    rows = {tp0: PositionRow("clicks", 0, 70, 0, 3, NOW), tp1: PositionRow("clicks", 1, 40, 0, 3, NOW),
            gone: PositionRow("clicks", 3, 12, 0, 2, NOW)}
    coverage = {tp0: [Coverage(0, 60, "read", 1, None), Coverage(60, 70, "skipped", 2, None)]}

    report = overview.partition_report(pipeline(), offsets, rows, coverage)

    assert [(p["partition"], p["position"], p["lag"], p["skipped_offsets"], p["lost_offsets"], p["note"])
            for p in report] == [
        (0, 70, 30, 10, 0, ""),
        (1, 40, 20, 0, 10, "LOST 10 offsets (retention)"),
        # Never read: the lag counts from where the pipeline starts (earliest by default: the log start).
        (2, None, 4, 0, 0, "not read yet"),
        (3, 12, None, 0, 0, "not in Kafka"),
    ]
    assert report[0]["last_batch_id"] == 3


def test_freshness_is_the_newest_published_records_age_and_how_long_the_oldest_waiting_one_has_waited():
    published = NOW - timedelta(seconds=90)
    # Caught up: no lag in seconds, however old the newest record is.
    assert overview.freshness(0, published, None, NOW) == {"age_seconds": 90.0, "lag_seconds": 0.0}
    # Behind: the oldest record not yet published came 60 s ago.
    assert overview.freshness(500, published, NOW - timedelta(seconds=60), NOW) == {
        "age_seconds": 90.0, "lag_seconds": 60.0}
    # Nothing published yet; the oldest waiting record's time unknown: not a guess.
    assert overview.freshness(500, None, NOW, NOW) == {"age_seconds": None, "lag_seconds": 0.0}
    assert overview.freshness(500, published, None, NOW)["lag_seconds"] is None


def test_the_partition_report_carries_each_partitions_freshness():
    tp0, tp1 = TopicPartition("clicks", 0), TopicPartition("clicks", 1)
    offsets = {tp0: PartitionOffsets(0, 100), tp1: PartitionOffsets(0, 40)}
    newest = NOW - timedelta(minutes=5)
    rows = {tp0: PositionRow("clicks", 0, 70, 0, 3, NOW, newest), tp1: PositionRow("clicks", 1, 40, 0, 3, NOW, newest)}
    report = overview.partition_report(pipeline(), offsets, rows, {}, oldest_waiting={tp0: NOW - timedelta(minutes=4)},
                                       now=NOW)
    assert [(p["newest_published_at"], p["age_seconds"], p["lag_seconds"]) for p in report] == [
        (newest, 300.0, 240.0), (newest, 300.0, 0.0)]
    assert overview.instant(newest) == "2026-11-22 23:55:00Z" and overview.instant(None) == "-"


def test_shown_bytes_escapes_what_is_not_utf8_and_cuts_long_payloads():
    assert overview.shown_bytes(None) is None
    assert overview.shown_bytes(b'{"id": "\xe2\x82\xac"}') == '{"id": "€"}'
    assert overview.shown_bytes(b"\xff\x00<b>") == "\\xff\x00<b>"
    long = overview.shown_bytes(b"x" * 1000)
    assert long.startswith("x" * overview.SHOWN_BYTES) and long.endswith("… (1000 bytes)")


def test_bar_chart_escapes_its_text_scales_to_the_maximum_and_leaves_unknown_values_out():
    chart = bar_chart([Point("1", 10, "<script>"), Point("2", None, "unknown"), Point("3", 40, "b3")], "Lag <x>")
    assert "<script>" not in chart and "&lt;script&gt;" in chart and "Lag &lt;x&gt;" in chart
    assert chart.count("<rect") == 2 and ">40<" in chart
    assert "nothing to show yet" in bar_chart([Point("1", None, "")], "Lag")


@pytest.mark.parametrize("path", ["/api/pipelines", "/api/pipelines/clicks", "/api/pipelines/clicks/batches/1", "/",
                                  "/pipelines/clicks", "/pipelines/clicks/batches/1", "/dags/kafka_ledger__clicks"])
def test_every_route_is_behind_the_guard_it_is_given(path):
    def deny() -> None:
        raise HTTPException(401, "Not authenticated")

    client = TestClient(create_app(dependencies=[Depends(deny)]))
    response = client.get(path)
    assert response.status_code == 401 and "clicks" not in response.text
    assert client.post("/pipelines/clicks/verify").status_code == 401


def test_links_are_relative_to_the_app_root_whatever_prefix_serves_it(tmp_path: Path, monkeypatch):
    from kafka_ledger.ops.web import app as web_app

    monkeypatch.setattr(web_app, "_pipelines", lambda: ({"clicks": pipeline()}, {}))
    client = TestClient(create_app(), root_path="/behind/a/proxy/kafka-ledger")
    response = client.get("/dags/kafka_ledger__clicks", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "../pipelines/clicks"
    assert client.get("/dags/kafka_ledger__other").status_code == 404


def test_the_plugin_links_the_page_relative_to_the_ui_in_the_navigation_and_on_every_dag():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins"))
    try:
        from kafka_ledger_plugin import KafkaLedgerPlugin
    finally:
        sys.path.pop(0)
    (mounted,) = KafkaLedgerPlugin.fastapi_apps
    assert mounted["url_prefix"] == "/kafka-ledger"
    views = {v["destination"]: v for v in KafkaLedgerPlugin.external_views}
    assert views["nav"]["href"] == "kafka-ledger/" and views["nav"]["url_route"] == "kafka-ledger"
    assert views["dag"]["href"] == "kafka-ledger/dags/{DAG_ID}"


def test_a_rewrite_says_what_it_re_reads():
    from kafka_ledger.ledger.db import Batch
    from kafka_ledger.model.ranges import OffsetRange

    def summary(**fields) -> dict:
        return overview.batch_summary(Batch(7, "clicks", "committed", 1, 1, None, None, NOW, **fields))

    ranges = [OffsetRange("clicks", 0, 10, 20), OffsetRange("clicks", 1, 0, 5)]
    assert summary(ranges=ranges)["rewrites"] is None  # a catch-up rewrites nothing
    assert summary(kind="replay", replay_of=3, ranges=ranges)["rewrites"] == "batch 3"
    assert summary(kind="backfill", window_start=NOW, window_end=NOW.replace(hour=1))["rewrites"] \
        == "2026-11-23 00:00 to 2026-11-23 01:00"
    assert summary(kind="offset_ranges", ranges=ranges)["rewrites"] == "clicks-0 [10, 20) and 1 more"


def test_airflows_param_error_for_a_pipeline_trigger_is_cut_to_its_sentence():
    from fastapi import FastAPI

    from kafka_ledger.ops.web.refusals import ShortParamErrors

    dump = ("Invalid input for param mode: 'sideways' is not one of ['catch_up', 'replay_batch']\n\n"
            "Failed validating 'enum' in schema:\n    {'type': 'string', 'description_md': '...'}\n\nOn instance:\n"
            "    'sideways'")
    app = FastAPI()

    @app.post("/api/v2/dags/{dag_id}/dagRuns")
    def trigger(dag_id: str) -> None:
        raise HTTPException(400, dump)

    client = TestClient(ShortParamErrors(app))
    short = client.post("/api/v2/dags/kafka_ledger__clicks/dagRuns")
    assert short.status_code == 400
    assert short.json() == {"detail": dump.split("\n", 1)[0]}
    assert int(short.headers["content-length"]) == len(short.content)
    # Other DAGs' replies are Airflow's own.
    assert client.post("/api/v2/dags/other/dagRuns").json() == {"detail": dump}
