"""Each batch range records its partition's end offset when the batch was planned: the lag of that moment.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null for ranges planned before this revision: their lag was never observed and is not invented. No
    # check constraint: an observation must never be the reason a batch cannot be recorded.
    op.execute("ALTER TABLE kafka_ledger.batch_ranges ADD COLUMN end_offset bigint")


def downgrade() -> None:
    op.execute("ALTER TABLE kafka_ledger.batch_ranges DROP COLUMN end_offset")
