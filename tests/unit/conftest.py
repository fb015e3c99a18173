"""Unit-test fixtures: every test starts without kafka-ledger's settings from the caller's environment."""

import os

import pytest


@pytest.fixture(autouse=True)
def _clear_kafka_ledger_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        # The environment's settings and the Airflow connections that hold them (scripts/env.sh sets both).
        if name.startswith(("KAFKA_LEDGER_", "AIRFLOW_CONN_KAFKA_LEDGER_", "AIRFLOW_CONN_SPARK_")):
            monkeypatch.delenv(name)
