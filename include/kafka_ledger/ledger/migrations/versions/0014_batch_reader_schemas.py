"""The reader schema each topic of an Avro batch is decoded with, pinned when the batch is planned.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A retry decodes with the very reader schema its first attempt had; a replay with its batch's (`pinned`) unless
    # it asked for the subject's newest (`newest`, as a new batch always takes).
    op.execute(
        """
        CREATE TABLE kafka_ledger.batch_reader_schemas (
            batch_id   bigint NOT NULL REFERENCES kafka_ledger.batches (batch_id) ON DELETE CASCADE,
            topic      text   NOT NULL,
            subject    text   NOT NULL,
            schema_id  bigint NOT NULL,
            version    integer,
            chosen     text   NOT NULL CHECK (chosen IN ('newest', 'pinned')),
            PRIMARY KEY (batch_id, topic)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE kafka_ledger.batch_reader_schemas")
