"""The Spark Connect session each pipeline's batches work in, kept between batches.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A pipeline without a row works in its default session (runtimes/connect.py: pipeline_session_id); a row
    # names the one that replaced it after the server closed it (idle past its session timeout).
    op.execute(
        """
        CREATE TABLE kafka_ledger.spark_sessions (
            pipeline    text        PRIMARY KEY,
            session_id  uuid        NOT NULL,
            since       timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.spark_sessions")
