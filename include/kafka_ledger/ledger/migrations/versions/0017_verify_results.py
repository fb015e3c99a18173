"""The last verify of each pipeline and what it concluded (the metrics' `kafka_ledger_last_verify_*`): an entity
table's verify, which checks the ledger only and never advances the verified point, is recorded too.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # result: ok (nothing found), problems (something lost, doubled or misplaced), unverified (it could not check:
    # Kafka unreachable, a topic gone, the deadline passed). concluded_at: the last verify that was ok or found
    # problems (one that could not check concludes nothing).
    op.execute(
        """
        CREATE TABLE kafka_ledger.verify_results (
            pipeline     text        PRIMARY KEY,
            verified_at  timestamptz NOT NULL DEFAULT now(),
            mode         text        NOT NULL CHECK (mode IN ('incremental', 'full')),
            result       text        NOT NULL CHECK (result IN ('ok', 'problems', 'unverified')),
            problems     integer     NOT NULL,
            concluded_at timestamptz
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.verify_results")
