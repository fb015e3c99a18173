"""The columns of an Avro pipeline that leaves `columns:` out: its reader schema's fields, taken at its first plan.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Taken once: every later batch (and its output table, made then) has the same columns, whatever versions the
    # subject gains; a batch still decodes with its own pinned reader schema, which must fill them.
    op.execute(
        """
        CREATE TABLE kafka_ledger.pipeline_columns (
            pipeline     text        PRIMARY KEY,
            subject      text        NOT NULL,
            schema_id    bigint      NOT NULL,
            version      integer,
            columns      jsonb       NOT NULL,
            recorded_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.pipeline_columns")
