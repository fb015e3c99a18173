"""The DAG run that is carrying a doorbell pipeline's batches, one after another, so that its doorbell keeps quiet.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A lease, not a lock: a run that dies without removing its row stops counting at `until`, and the doorbell
    # rings again then (airflow/doorbell.RingRule).
    op.execute(
        """
        CREATE TABLE kafka_ledger.carrying_runs (
            pipeline  text        PRIMARY KEY,
            dag_id    text        NOT NULL,
            run_id    text        NOT NULL,
            since     timestamptz NOT NULL DEFAULT now(),
            until     timestamptz NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.carrying_runs")
