"""Alembic environment: runs the ledger migrations online against the configured database."""

from alembic import context
from sqlalchemy import create_engine, text

LEDGER_SCHEMA = "kafka_ledger"

engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    # The version table lives in the ledger's own schema, which must exist before Alembic looks for it.
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {LEDGER_SCHEMA}"))
    connection.commit()
    context.configure(connection=connection, version_table_schema=LEDGER_SCHEMA, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
