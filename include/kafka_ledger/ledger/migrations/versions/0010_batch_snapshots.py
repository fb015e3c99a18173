"""The Iceberg snapshot that published each batch of a pipeline with an Iceberg sink.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Set by the commit that found the batch's snapshot in the table's current history: the offsets moved with it.
    op.execute("ALTER TABLE kafka_ledger.batches ADD COLUMN snapshot_id bigint")


def downgrade() -> None:
    op.execute("ALTER TABLE kafka_ledger.batches DROP COLUMN snapshot_id")
