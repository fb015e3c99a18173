"""The verified point of each pipeline: where an incremental `kafka-ledger verify` starts.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch_id: every batch of the pipeline up to this id was finished and its committed ranges checked
    # against Kafka by a verify that found no problem (see verify.py for why a batch id, not a time).
    # No foreign key: the point may be an id between batches, and deleting a pipeline removes it too.
    op.execute(
        """
        CREATE TABLE kafka_ledger.verified_points (
            pipeline     text        PRIMARY KEY,
            batch_id     bigint      NOT NULL CHECK (batch_id >= 0),
            verified_at  timestamptz NOT NULL DEFAULT now(),
            mode         text        NOT NULL CHECK (mode IN ('incremental', 'full'))
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.verified_points")
