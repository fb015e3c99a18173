"""The dashboard, the alert rules and the monitoring docs ask only for series the endpoint serves, and name them all."""

import json
import re
from pathlib import Path

import yaml

from kafka_ledger.ops import metrics

ROOT = Path(__file__).resolve().parents[2]
SERIES = re.compile(r"\b(?:kafka_ledger|kafka_consumergroup)_\w+")


def dashboard() -> dict:
    return json.loads((ROOT / "monitoring" / "grafana-dashboard.json").read_text())


def dashboard_queries() -> list[str]:
    board = dashboard()
    queries = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    return queries + [variable["definition"] for variable in board["templating"]["list"] if "definition" in variable]


def test_every_dashboard_query_names_series_the_endpoint_serves():
    asked = {name for query in dashboard_queries() for name in SERIES.findall(query)}
    assert asked and asked <= metrics.served_series(), asked - metrics.served_series()


def test_the_dashboard_shows_what_operators_look_for():
    asked = {name for query in dashboard_queries() for name in SERIES.findall(query)}
    assert {"kafka_ledger_partition_lag_records", "kafka_ledger_partition_oldest_unread_timestamp_seconds",
            "kafka_ledger_newest_published_timestamp_seconds", "kafka_ledger_records_published_total",
            "kafka_ledger_dead_letters_total", "kafka_ledger_batch_duration_seconds_bucket",
            "kafka_ledger_partition_log_start_offset"} <= asked


def test_the_dashboard_is_ready_to_provision():
    """A provisioned dashboard keeps its uid, and picks its Prometheus through a variable rather than a fixed uid."""
    board = dashboard()
    assert board["uid"] == "kafka-ledger" and board.get("id") is None
    sources = {json.dumps(panel["datasource"]) for panel in board["panels"]}
    assert sources == {json.dumps({"type": "prometheus", "uid": "${datasource}"})}
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])


def test_every_alert_rule_names_series_the_endpoint_serves():
    rules = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    asked = {name for group in rules["groups"] for rule in group["rules"] for name in SERIES.findall(rule["expr"])}
    assert asked and asked <= metrics.served_series(), asked - metrics.served_series()


def test_the_monitoring_page_names_every_series():
    page = (ROOT / "docs" / "monitoring.md").read_text()
    shown = set(SERIES.findall(page))
    served = {re.sub(r"_(bucket|sum|count)$", "", name) for name in metrics.served_series()}
    assert served - shown == set()
    assert {re.sub(r"_(bucket|sum|count)$", "", name) for name in shown} <= served
