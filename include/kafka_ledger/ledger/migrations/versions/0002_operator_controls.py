"""Operator controls: batch kinds (replays, windows, backfills), skipped ranges, position resets.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE kafka_ledger.position_resets (
            reset_id           bigserial   PRIMARY KEY,
            pipeline           text        NOT NULL,
            requested_by       text        NOT NULL,
            requested_at       timestamptz NOT NULL DEFAULT now(),
            reason             text        NOT NULL,
            target             text        NOT NULL,
            partitions         jsonb       NOT NULL,
            abandoned_batches  bigint[]    NOT NULL DEFAULT '{}'
        )
        """
    )
    # What a batch is for: the regular catch-up (it alone moves positions) or a rewrite of offsets
    # already behind the position (explicit ranges, a time window, a replay, a backfill run).
    op.execute(
        """
        ALTER TABLE kafka_ledger.batches
            ADD COLUMN kind text NOT NULL DEFAULT 'catch_up'
                CHECK (kind IN ('catch_up', 'offset_ranges', 'time_window', 'replay', 'backfill')),
            ADD COLUMN replay_of bigint REFERENCES kafka_ledger.batches,
            ADD COLUMN requested_by text,
            ADD COLUMN reason text,
            ADD COLUMN window_start timestamptz,
            ADD COLUMN window_end timestamptz,
            DROP CONSTRAINT batches_status_check,
            ADD CONSTRAINT batches_status_check
                CHECK (status IN ('planned', 'written', 'committed', 'failed', 'abandoned'))
        """
    )
    # One unfinished catch-up batch per pipeline; rewrites may be in flight beside it (never overlapping).
    op.execute("DROP INDEX kafka_ledger.batches_one_open_per_pipeline")
    op.execute(
        "CREATE UNIQUE INDEX batches_one_open_catch_up_per_pipeline ON kafka_ledger.batches (pipeline) "
        "WHERE status NOT IN ('committed', 'abandoned') AND kind = 'catch_up'"
    )
    op.execute("CREATE INDEX batches_pipeline_run ON kafka_ledger.batches (pipeline, dag_id, run_id)")
    # latest_only batches skip the older part of a partition's backlog: [skipped_from, from_offset).
    op.execute(
        """
        ALTER TABLE kafka_ledger.batch_ranges
            ADD COLUMN skipped_from bigint CHECK (skipped_from >= 0 AND skipped_from < from_offset)
        """
    )
    # Coverage of each partition: ranges read and published, or deliberately skipped (latest_only, a
    # forward reset). Both kinds take part in the no-overlap constraint.
    op.execute(
        """
        ALTER TABLE kafka_ledger.committed_ranges
            ADD COLUMN disposition text NOT NULL DEFAULT 'read' CHECK (disposition IN ('read', 'skipped')),
            ADD COLUMN reset_id bigint REFERENCES kafka_ledger.position_resets,
            ALTER COLUMN batch_id DROP NOT NULL,
            ADD CONSTRAINT committed_ranges_has_origin CHECK (batch_id IS NOT NULL OR reset_id IS NOT NULL)
        """
    )
    # Where the pipeline began reading each partition: coverage must tile [start_offset, position).
    op.execute("ALTER TABLE kafka_ledger.positions ADD COLUMN start_offset bigint")
    op.execute(
        """
        UPDATE kafka_ledger.positions p SET start_offset = coalesce(
            (SELECT min(c.from_offset) FROM kafka_ledger.committed_ranges c
             WHERE c.pipeline = p.pipeline AND c.topic = p.topic AND c.partition = p.partition),
            p.position)
        """
    )
    op.execute(
        "ALTER TABLE kafka_ledger.positions ALTER COLUMN start_offset SET NOT NULL, "
        "ADD CONSTRAINT positions_start_before_position CHECK (start_offset >= 0 AND start_offset <= position)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE kafka_ledger.positions DROP COLUMN start_offset")
    op.execute("DELETE FROM kafka_ledger.committed_ranges WHERE batch_id IS NULL")
    op.execute(
        "ALTER TABLE kafka_ledger.committed_ranges DROP COLUMN disposition, DROP COLUMN reset_id, "
        "ALTER COLUMN batch_id SET NOT NULL"
    )
    op.execute("ALTER TABLE kafka_ledger.batch_ranges DROP COLUMN skipped_from")
    op.execute("DROP INDEX kafka_ledger.batches_pipeline_run")
    op.execute("DROP INDEX kafka_ledger.batches_one_open_catch_up_per_pipeline")
    op.execute(
        "CREATE UNIQUE INDEX batches_one_open_per_pipeline ON kafka_ledger.batches (pipeline) "
        "WHERE status <> 'committed'"
    )
    op.execute(
        "ALTER TABLE kafka_ledger.batches DROP COLUMN kind, DROP COLUMN replay_of, DROP COLUMN requested_by, "
        "DROP COLUMN reason, DROP COLUMN window_start, DROP COLUMN window_end"
    )
    op.execute("DROP TABLE kafka_ledger.position_resets")
