"""Each planned range records the Kafka topic id it was planned against, so a commit and verify can check it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The topic's anchored id when the range was planned. NULL for ranges planned before this revision: a commit
    # then checks the anchor, and verify counts their offsets as read before topic ids were recorded.
    op.execute("ALTER TABLE kafka_ledger.batch_ranges ADD COLUMN topic_id text")


def downgrade() -> None:
    op.execute("ALTER TABLE kafka_ledger.batch_ranges DROP COLUMN topic_id")
