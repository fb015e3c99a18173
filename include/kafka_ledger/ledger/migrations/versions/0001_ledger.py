"""The offset ledger: batches, their ranges, committed ranges, positions and dead letters.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # btree_gist lets one exclusion constraint combine equality (pipeline, topic, partition) with
    # range overlap, so the database itself refuses to commit any offset twice.
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    op.execute("CREATE SCHEMA IF NOT EXISTS kafka_ledger_staging")
    op.execute(
        """
        CREATE TABLE kafka_ledger.batches (
            batch_id              bigserial PRIMARY KEY,
            pipeline              text        NOT NULL,
            status                text        NOT NULL DEFAULT 'planned'
                                  CHECK (status IN ('planned', 'written', 'committed', 'failed')),
            attempts              integer     NOT NULL DEFAULT 0,
            staged_attempt        integer,
            dag_id                text,
            run_id                text,
            planned_at            timestamptz NOT NULL DEFAULT now(),
            started_at            timestamptz,
            written_at            timestamptz,
            committed_at          timestamptz,
            failed_at             timestamptz,
            records_read          bigint,
            records_written       bigint,
            records_dead_lettered bigint,
            read_seconds          double precision,
            commit_seconds        double precision,
            last_error            text,
            CHECK (status <> 'committed' OR committed_at IS NOT NULL),
            CHECK (status NOT IN ('written', 'committed') OR staged_attempt IS NOT NULL)
        )
        """
    )
    # At most one unfinished batch per pipeline: a failed batch is resumed, never planned around.
    op.execute(
        "CREATE UNIQUE INDEX batches_one_open_per_pipeline ON kafka_ledger.batches (pipeline) "
        "WHERE status <> 'committed'"
    )
    op.execute(
        """
        CREATE TABLE kafka_ledger.batch_ranges (
            batch_id      bigint  NOT NULL REFERENCES kafka_ledger.batches ON DELETE CASCADE,
            topic         text    NOT NULL,
            partition     integer NOT NULL,
            from_offset   bigint  NOT NULL,
            until_offset  bigint  NOT NULL,
            records_read  bigint,
            PRIMARY KEY (batch_id, topic, partition),
            CHECK (0 <= from_offset AND from_offset < until_offset)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE kafka_ledger.committed_ranges (
            pipeline      text        NOT NULL,
            topic         text        NOT NULL,
            partition     integer     NOT NULL,
            from_offset   bigint      NOT NULL,
            until_offset  bigint      NOT NULL,
            batch_id      bigint      NOT NULL REFERENCES kafka_ledger.batches,
            committed_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, topic, partition, from_offset),
            CHECK (0 <= from_offset AND from_offset < until_offset),
            CONSTRAINT committed_ranges_no_overlap EXCLUDE USING gist (
                pipeline WITH =, topic WITH =, partition WITH =,
                int8range(from_offset, until_offset) WITH &&
            )
        )
        """
    )
    op.execute(
        """
        CREATE TABLE kafka_ledger.positions (
            pipeline      text        NOT NULL,
            topic         text        NOT NULL,
            partition     integer     NOT NULL,
            position      bigint      NOT NULL CHECK (position >= 0),
            last_batch_id bigint      REFERENCES kafka_ledger.batches,
            updated_at    timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, topic, partition)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE kafka_ledger.dead_letters (
            pipeline         text        NOT NULL,
            kafka_topic      text        NOT NULL,
            kafka_partition  integer     NOT NULL,
            kafka_offset     bigint      NOT NULL,
            kafka_timestamp  timestamptz,
            kafka_key        bytea,
            kafka_value      bytea,
            error            text        NOT NULL,
            batch_id         bigint      NOT NULL REFERENCES kafka_ledger.batches,
            dead_lettered_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, kafka_topic, kafka_partition, kafka_offset)
        )
        """
    )


def downgrade() -> None:
    op.execute(
        "DROP TABLE kafka_ledger.dead_letters, kafka_ledger.positions, kafka_ledger.committed_ranges, "
        "kafka_ledger.batch_ranges, kafka_ledger.batches"
    )
