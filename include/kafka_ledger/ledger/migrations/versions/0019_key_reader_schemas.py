"""A batch's reader schemas of its records' keys beside its values' (a Protobuf pipeline whose keys are Protobuf too):
each pin is of a topic's values or of its keys.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every pin recorded so far is of a topic's values.
    op.execute(
        """
        ALTER TABLE kafka_ledger.batch_reader_schemas
            ADD COLUMN part text NOT NULL DEFAULT 'value' CHECK (part IN ('value', 'key')),
            DROP CONSTRAINT batch_reader_schemas_pkey,
            ADD PRIMARY KEY (batch_id, topic, part)
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DELETE FROM kafka_ledger.batch_reader_schemas WHERE part = 'key';
        ALTER TABLE kafka_ledger.batch_reader_schemas
            DROP CONSTRAINT batch_reader_schemas_pkey,
            ADD PRIMARY KEY (batch_id, topic),
            DROP COLUMN part
        """
    )
