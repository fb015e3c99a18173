"""A batch range may read nothing when its partition's unread offsets were lost and skipped (on_data_loss: skip).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE kafka_ledger.batch_ranges DROP CONSTRAINT batch_ranges_check, "
        "ADD CONSTRAINT batch_ranges_check CHECK (0 <= from_offset AND (from_offset < until_offset "
        "OR (skipped_from IS NOT NULL AND from_offset = until_offset)))"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE kafka_ledger.batch_ranges DROP CONSTRAINT batch_ranges_check, "
        "ADD CONSTRAINT batch_ranges_check CHECK (0 <= from_offset AND from_offset < until_offset)"
    )
