"""Each partition's log start as plans saw it move: the rate at which retention deletes, for the headroom.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The log start a plan saw last and when a plan first saw it there; the value before it likewise. The two
    # give the rate at which retention moved the log start (offsets per second), whatever deleted them
    # (retention.ms, retention.bytes, delete-records).
    op.execute(
        """
        CREATE TABLE kafka_ledger.log_starts (
            pipeline            text        NOT NULL,
            topic               text        NOT NULL,
            partition           integer     NOT NULL,
            log_start           bigint      NOT NULL,
            since               timestamptz NOT NULL,
            previous_log_start  bigint,
            previous_since      timestamptz,
            PRIMARY KEY (pipeline, topic, partition)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.log_starts")
