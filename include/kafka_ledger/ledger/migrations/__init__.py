"""Versioned ledger schema migrations (Alembic); `python -m kafka_ledger.ledger.migrations` upgrades to head."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import ledger_database

MIGRATIONS_DIR = Path(__file__).resolve().parent


def alembic_config(db: LedgerDatabase) -> Config:
    """An Alembic config for the ledger database `db` (version table in the kafka_ledger schema)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", db.sqlalchemy().replace("%", "%%"))
    return cfg


def upgrade(db: LedgerDatabase | None = None, revision: str = "head") -> None:
    """Apply every migration up to `revision` (idempotent); the deployment's ledger database unless `db`."""
    command.upgrade(alembic_config(db or ledger_database()), revision)
