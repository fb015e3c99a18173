"""Running totals for the metrics endpoint (ops/metrics.py), kept by triggers in the transaction that changes what
they count: a scrape reads a few rows per pipeline, however many batches and dead letters the ledger holds.

- `dead_letter_counts`: dead letters held, by pipeline and reason (a rewrite's delete and re-insert net out).
- `batch_totals`: per pipeline, the batches ended (committed, abandoned), their attempts, the records the committed
  ones published, the offsets they skipped (`skipped_from`: retention's losses, or latest_only's skips), the newest
  commit.
- `batch_duration_counts`: committed batches by stage and by the smallest bucket bound their seconds fit under
  (ops/metrics.py's DURATION_BUCKETS, checked equal by tests/unit/test_metrics.py), with their seconds summed.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

BUCKETS = "ARRAY[0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600]::double precision[]"


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE kafka_ledger.dead_letter_counts (
            pipeline     text   NOT NULL,
            reason       text   NOT NULL,
            dead_letters bigint NOT NULL,
            PRIMARY KEY (pipeline, reason)
        );
        CREATE TABLE kafka_ledger.batch_totals (
            pipeline          text        PRIMARY KEY,
            committed         bigint      NOT NULL DEFAULT 0,
            abandoned         bigint      NOT NULL DEFAULT 0,
            attempts          bigint      NOT NULL DEFAULT 0,
            records_published bigint      NOT NULL DEFAULT 0,
            skipped_offsets   bigint      NOT NULL DEFAULT 0,
            last_committed_at timestamptz
        );
        CREATE TABLE kafka_ledger.batch_duration_counts (
            pipeline text             NOT NULL,
            stage    text             NOT NULL,
            le       double precision NOT NULL,  -- 'Infinity': above the last bound
            batches  bigint           NOT NULL,
            seconds  double precision NOT NULL,
            PRIMARY KEY (pipeline, stage, le)
        );
        -- Unfinished batches, found without reading every batch a pipeline ever had.
        CREATE INDEX batches_unfinished ON kafka_ledger.batches (pipeline)
            WHERE status NOT IN ('committed', 'abandoned');
        """
    )
    op.execute(
        """
        CREATE FUNCTION kafka_ledger.count_dead_letters() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO kafka_ledger.dead_letter_counts AS c (pipeline, reason, dead_letters)
                SELECT pipeline, error, count(*) FROM new_rows GROUP BY pipeline, error
                ON CONFLICT (pipeline, reason) DO UPDATE SET dead_letters = c.dead_letters + EXCLUDED.dead_letters;
            ELSE
                UPDATE kafka_ledger.dead_letter_counts AS c SET dead_letters = c.dead_letters - gone.n
                FROM (SELECT pipeline, error, count(*) AS n FROM old_rows GROUP BY pipeline, error) AS gone
                WHERE c.pipeline = gone.pipeline AND c.reason = gone.error;
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER dead_letters_counted_in AFTER INSERT ON kafka_ledger.dead_letters
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kafka_ledger.count_dead_letters();
        CREATE TRIGGER dead_letters_counted_out AFTER DELETE ON kafka_ledger.dead_letters
            REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kafka_ledger.count_dead_letters();
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION kafka_ledger.count_ended_batch() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            committed boolean := NEW.status = 'committed';
            skipped bigint := 0;
            timed record;  -- not `stage`: a column of the table it counts into
        BEGIN
            IF committed THEN
                SELECT coalesce(sum(from_offset - skipped_from), 0) INTO skipped FROM kafka_ledger.batch_ranges
                WHERE batch_id = NEW.batch_id AND skipped_from IS NOT NULL;
            END IF;
            INSERT INTO kafka_ledger.batch_totals AS t
                (pipeline, committed, abandoned, attempts, records_published, skipped_offsets, last_committed_at)
            VALUES (NEW.pipeline, committed::int, (NOT committed)::int, NEW.attempts,
                    CASE WHEN committed THEN coalesce(NEW.records_written, 0) ELSE 0 END, skipped,
                    CASE WHEN committed THEN NEW.committed_at END)
            ON CONFLICT (pipeline) DO UPDATE SET
                committed = t.committed + EXCLUDED.committed, abandoned = t.abandoned + EXCLUDED.abandoned,
                attempts = t.attempts + EXCLUDED.attempts,
                records_published = t.records_published + EXCLUDED.records_published,
                skipped_offsets = t.skipped_offsets + EXCLUDED.skipped_offsets,
                last_committed_at = greatest(t.last_committed_at, EXCLUDED.last_committed_at);
            IF committed THEN
                FOR timed IN
                    SELECT s.name, s.seconds FROM (VALUES
                        ('queued', extract(epoch FROM NEW.started_at - NEW.planned_at)::double precision),
                        ('read', NEW.read_seconds), ('commit', NEW.commit_seconds),
                        ('total', extract(epoch FROM NEW.committed_at - NEW.planned_at)::double precision)
                    ) AS s (name, seconds) WHERE s.seconds IS NOT NULL
                LOOP
                    INSERT INTO kafka_ledger.batch_duration_counts AS d (pipeline, stage, le, batches, seconds)
                    VALUES (NEW.pipeline, timed.name,
                            coalesce((SELECT min(b) FROM unnest({BUCKETS}) AS b WHERE timed.seconds <= b),
                                     'Infinity'),
                            1, timed.seconds)
                    ON CONFLICT (pipeline, stage, le) DO UPDATE
                    SET batches = d.batches + 1, seconds = d.seconds + EXCLUDED.seconds;
                END LOOP;
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER batches_counted AFTER UPDATE OF status ON kafka_ledger.batches
            FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ('committed', 'abandoned'))
            EXECUTE FUNCTION kafka_ledger.count_ended_batch();
        """
    )
    # What the ledger holds already.
    op.execute(
        f"""
        INSERT INTO kafka_ledger.dead_letter_counts (pipeline, reason, dead_letters)
        SELECT pipeline, error, count(*) FROM kafka_ledger.dead_letters GROUP BY pipeline, error;
        INSERT INTO kafka_ledger.batch_totals
            (pipeline, committed, abandoned, attempts, records_published, skipped_offsets, last_committed_at)
        SELECT b.pipeline, count(*) FILTER (WHERE b.status = 'committed'),
               count(*) FILTER (WHERE b.status = 'abandoned'), sum(b.attempts),
               coalesce(sum(b.records_written) FILTER (WHERE b.status = 'committed'), 0),
               coalesce(sum(r.skipped), 0), max(b.committed_at)
        FROM kafka_ledger.batches b
        LEFT JOIN (SELECT batch_id, sum(from_offset - skipped_from) AS skipped FROM kafka_ledger.batch_ranges
                   WHERE skipped_from IS NOT NULL GROUP BY batch_id) r
               ON r.batch_id = b.batch_id AND b.status = 'committed'
        WHERE b.status IN ('committed', 'abandoned')
        GROUP BY b.pipeline;
        INSERT INTO kafka_ledger.batch_duration_counts (pipeline, stage, le, batches, seconds)
        SELECT b.pipeline, s.name,
               coalesce((SELECT min(x) FROM unnest({BUCKETS}) AS x WHERE s.seconds <= x), 'Infinity') AS le,
               count(*), sum(s.seconds)
        FROM kafka_ledger.batches b CROSS JOIN LATERAL (VALUES
            ('queued', extract(epoch FROM b.started_at - b.planned_at)::double precision),
            ('read', b.read_seconds), ('commit', b.commit_seconds),
            ('total', extract(epoch FROM b.committed_at - b.planned_at)::double precision)) AS s (name, seconds)
        WHERE b.status = 'committed' AND s.seconds IS NOT NULL
        GROUP BY b.pipeline, s.name, le;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER batches_counted ON kafka_ledger.batches;
        DROP TRIGGER dead_letters_counted_in ON kafka_ledger.dead_letters;
        DROP TRIGGER dead_letters_counted_out ON kafka_ledger.dead_letters;
        DROP FUNCTION kafka_ledger.count_ended_batch();
        DROP FUNCTION kafka_ledger.count_dead_letters();
        DROP INDEX kafka_ledger.batches_unfinished;
        DROP TABLE kafka_ledger.batch_duration_counts, kafka_ledger.batch_totals, kafka_ledger.dead_letter_counts;
        """
    )
