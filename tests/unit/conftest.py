"""Unit-test fixtures: every test starts without KAFKA_LEDGER_* settings from the caller's environment."""

import os

import pytest


@pytest.fixture(autouse=True)
def _clear_kafka_ledger_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KAFKA_LEDGER_"):
            monkeypatch.delenv(name)
