"""Versioned ledger schema migrations (Alembic); `python -m kafka_ledger.ledger.migrations` upgrades to head."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from kafka_ledger.config.settings import ledger_dsn, sqlalchemy_url

MIGRATIONS_DIR = Path(__file__).resolve().parent


def alembic_config(dsn: str) -> Config:
    """An Alembic config for the ledger database at `dsn` (version table in the kafka_ledger schema)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return cfg


def upgrade(dsn: str | None = None, revision: str = "head") -> None:
    """Apply every migration up to `revision` (idempotent)."""
    command.upgrade(alembic_config(dsn or ledger_dsn()), revision)
