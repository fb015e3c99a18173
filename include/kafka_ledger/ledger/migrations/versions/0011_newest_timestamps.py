"""The Kafka timestamp of the newest record each range committed, and each partition's newest so far (freshness).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Set with the range's records_read (the newest timestamp among the records its batch read, rows and dead
    # letters), carried to the partition's position when the batch commits. Null before this revision.
    op.execute("ALTER TABLE kafka_ledger.batch_ranges ADD COLUMN newest_timestamp timestamptz")
    op.execute("ALTER TABLE kafka_ledger.positions ADD COLUMN newest_timestamp timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE kafka_ledger.positions DROP COLUMN newest_timestamp")
    op.execute("ALTER TABLE kafka_ledger.batch_ranges DROP COLUMN newest_timestamp")
