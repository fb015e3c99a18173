"""Each pipeline's topics are anchored to their Kafka topic id, so a recreated topic is refused, not read on.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The topic id (KIP-516) the pipeline's positions refer to. Anchored when planning first meets a topic
    # (existing pipelines: at their first plan after this revision); moved only by a position reset.
    op.execute(
        """
        CREATE TABLE kafka_ledger.topic_anchors (
            pipeline     text        NOT NULL,
            topic        text        NOT NULL,
            topic_id     text        NOT NULL,
            anchored_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, topic)
        )
        """
    )
    # A reset that re-anchors records, per topic, the id it left and the id it anchored to.
    op.execute("ALTER TABLE kafka_ledger.position_resets ADD COLUMN topic_ids jsonb NOT NULL DEFAULT '{}'")


def downgrade() -> None:
    op.execute("ALTER TABLE kafka_ledger.position_resets DROP COLUMN topic_ids")
    op.execute("DROP TABLE kafka_ledger.topic_anchors")
