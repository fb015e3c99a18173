"""The declared columns a pipeline has published into its Postgres output table, each since the batch whose commit
added it (sinks/postgres/evolution.py): a column no longer declared but still in the table is refused, not left to
fill with NULLs.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch_id NULL: the column was in the table when the pipeline's columns were first recorded (made by its first
    # plan, by hand, or before this table existed).
    op.execute(
        """
        CREATE TABLE kafka_ledger.output_columns (
            pipeline     text        NOT NULL,
            name         text        NOT NULL,
            type         text        NOT NULL,
            batch_id     bigint,
            recorded_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, name)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.output_columns")
