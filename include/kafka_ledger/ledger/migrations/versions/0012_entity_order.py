"""The order of an entity table's records (write: upsert): whether one record supersedes another of the same key.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The one rule every entity merge applies (sql.merge_entities). In one partition Kafka's order is the offset's:
    # a record supersedes an older offset and itself (a replay rewrites a record with its own values). Across
    # partitions (a key that moved) offsets say nothing: the later Kafka timestamp wins, and a tie goes to the
    # greater (topic, partition), so that every order of arrival ends in the same row. IMMUTABLE and plain SQL:
    # Postgres inlines it into the statements.
    op.execute("""
        CREATE FUNCTION kafka_ledger.supersedes(
            new_topic text, new_partition integer, new_offset bigint, new_timestamp timestamptz,
            old_topic text, old_partition integer, old_offset bigint, old_timestamp timestamptz)
        RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
            SELECT CASE WHEN new_topic = old_topic AND new_partition = old_partition THEN new_offset >= old_offset
                        ELSE (coalesce(new_timestamp, '-infinity'), new_topic, new_partition)
                             > (coalesce(old_timestamp, '-infinity'), old_topic, old_partition) END
        $$
    """)


def downgrade() -> None:
    op.execute("DROP FUNCTION kafka_ledger.supersedes(text, integer, bigint, timestamptz, text, integer, bigint, "
               "timestamptz)")
