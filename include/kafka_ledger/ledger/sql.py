"""Every SQL statement of the ledger, in one place (the schema itself is in migrations/; an output table's statements
are its sink's: sinks/postgres/sql.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from psycopg2 import sql

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.model.columns import DEAD_LETTER, STAGING_HEAD, Column, names

if TYPE_CHECKING:
    from kafka_ledger.model.ranges import OffsetRange

STAGING_SCHEMA = "kafka_ledger_staging"

# Serialises planning and committing of one pipeline across processes, held to the end of the transaction.
PIPELINE_LOCK_KEY = "hashtextextended('kafka_ledger:' || %(pipeline)s, 0)"
LOCK_PIPELINE = f"SELECT pg_advisory_xact_lock({PIPELINE_LOCK_KEY})"
# Who holds a pipeline's lock: Postgres keeps a bigint advisory key as classid (high half) and objid.
PIPELINE_LOCK_HOLDERS = f"""
    SELECT a.pid, a.application_name, a.state, date_trunc('second', now() - a.xact_start)::text
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND ((l.classid::int8 << 32) | l.objid::int8) = {PIPELINE_LOCK_KEY}
"""

# Every ledger connection's bounds, for the session (a lock wait too is a wait for the plan, commit or reset
# holding it); a batch's publish and commit widen the statement bound for their own transaction
# (SET_TRANSACTION_STATEMENT_TIMEOUT): they run as long as the batch.
SET_SESSION_TIMEOUTS = """
    SELECT set_config('statement_timeout', %(statement_timeout)s, false),
           set_config('lock_timeout', %(lock_timeout)s, false)
"""
SET_TRANSACTION_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', %(statement_timeout)s, true)"

BATCH_COLUMNS = """
    batch_id, pipeline, status, attempts, staged_attempt, dag_id, run_id, planned_at, started_at,
    written_at, committed_at, failed_at, records_read, records_written, records_dead_lettered,
    read_seconds, commit_seconds, last_error, kind, replay_of, requested_by, reason, window_start, window_end,
    snapshot_id
"""

UNFINISHED = "status NOT IN ('committed', 'abandoned')"

SELECT_OPEN_BATCH = f"""
    SELECT {BATCH_COLUMNS} FROM kafka_ledger.batches
    WHERE pipeline = %(pipeline)s AND {UNFINISHED} AND kind = 'catch_up'
"""

# Unfinished batches of every kind: rewrites may be in flight beside the catch-up batch.
SELECT_IN_FLIGHT_BATCH_IDS = f"""
    SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %(pipeline)s AND {UNFINISHED} ORDER BY batch_id
"""

# The unfinished batch a DAG run already recorded: a retried plan task resumes it instead of planning anew.
SELECT_RUN_OPEN_BATCH = f"""
    SELECT batch_id FROM kafka_ledger.batches
    WHERE pipeline = %(pipeline)s AND dag_id = %(dag_id)s AND run_id = %(run_id)s AND {UNFINISHED}
"""

# The batches a DAG run committed, oldest first: a cleared run replays them rather than planning anew.
SELECT_RUN_COMMITTED_BATCH_IDS = """
    SELECT batch_id FROM kafka_ledger.batches
    WHERE pipeline = %(pipeline)s AND dag_id = %(dag_id)s AND run_id = %(run_id)s AND status = 'committed'
    ORDER BY batch_id
"""

LIST_BATCHES = f"""
    SELECT {BATCH_COLUMNS} FROM kafka_ledger.batches
    WHERE pipeline = %(pipeline)s AND (%(status)s::text IS NULL OR status = %(status)s)
    ORDER BY batch_id DESC LIMIT %(limit)s
"""

SELECT_BATCH = f"SELECT {BATCH_COLUMNS} FROM kafka_ledger.batches WHERE batch_id = %(batch_id)s"
SELECT_BATCH_FOR_UPDATE = SELECT_BATCH + " FOR UPDATE"

SELECT_BATCH_RANGES = """
    SELECT topic, partition, from_offset, until_offset, skipped_from FROM kafka_ledger.batch_ranges
    WHERE batch_id = %(batch_id)s ORDER BY topic, partition
"""

INSERT_BATCH = """
    INSERT INTO kafka_ledger.batches
        (pipeline, dag_id, run_id, kind, replay_of, requested_by, reason, window_start, window_end)
    VALUES (%(pipeline)s, %(dag_id)s, %(run_id)s, %(kind)s, %(replay_of)s, %(requested_by)s, %(reason)s,
            %(window_start)s, %(window_end)s)
    RETURNING batch_id
"""

# A range records the id its topic is anchored to: planning checked it against Kafka's a moment before.
# A batch's ranges in one statement (psycopg2.extras.execute_values fills VALUES %s with rows of the template
# beside it): a batch can have 10,000 partitions, and a statement each cost 10,000 executions.
INSERT_BATCH_RANGES = """
    INSERT INTO kafka_ledger.batch_ranges
        (batch_id, topic, partition, from_offset, until_offset, skipped_from, end_offset, topic_id)
    SELECT r.batch_id, r.topic, r.partition, r.from_offset, r.until_offset, r.skipped_from, r.end_offset, a.topic_id
    FROM (VALUES %s) AS r (batch_id, pipeline, topic, partition, from_offset, until_offset, skipped_from, end_offset)
    LEFT JOIN kafka_ledger.topic_anchors a ON a.pipeline = r.pipeline AND a.topic = r.topic
"""
BATCH_RANGE_VALUES = "(%s::bigint, %s, %s, %s::int, %s::bigint, %s::bigint, %s::bigint, %s::bigint)"

# The schema each topic's values (and keys, where pinned) of a batch are read with (a registry format's:
# formats/base.SchemaPin).
INSERT_BATCH_READER_SCHEMA = """
    INSERT INTO kafka_ledger.batch_reader_schemas (batch_id, topic, subject, schema_id, version, chosen, part)
    VALUES (%(batch_id)s, %(topic)s, %(subject)s, %(schema_id)s, %(version)s, %(chosen)s, %(part)s)
"""
SELECT_BATCH_READER_SCHEMAS = """
    SELECT topic, subject, schema_id, version, chosen, part FROM kafka_ledger.batch_reader_schemas
    WHERE batch_id = %(batch_id)s ORDER BY part DESC, topic
"""

# The columns an Avro pipeline without `columns:` took from its reader schema at its first plan (batch/columns.py):
# the first plan's insert wins a race, and the loser reads the winner's.
INSERT_PIPELINE_COLUMNS = """
    INSERT INTO kafka_ledger.pipeline_columns (pipeline, subject, schema_id, version, columns)
    VALUES (%(pipeline)s, %(subject)s, %(schema_id)s, %(version)s, %(columns)s)
    ON CONFLICT (pipeline) DO NOTHING
"""
# A newer version's fields added to them (batch/columns.py), at a plan, under the pipeline's lock.
UPDATE_PIPELINE_COLUMNS = """
    UPDATE kafka_ledger.pipeline_columns
    SET schema_id = %(schema_id)s, version = %(version)s, columns = %(columns)s, recorded_at = now()
    WHERE pipeline = %(pipeline)s
"""
SELECT_PIPELINE_COLUMNS = """
    SELECT subject, schema_id, version, columns FROM kafka_ledger.pipeline_columns WHERE pipeline = %(pipeline)s
"""

# The declared columns a pipeline has published into its Postgres output table (sinks/postgres/evolution.py).
SELECT_OUTPUT_COLUMNS = """
    SELECT name, type FROM kafka_ledger.output_columns WHERE pipeline = %(pipeline)s
"""
UPSERT_OUTPUT_COLUMN = """
    INSERT INTO kafka_ledger.output_columns (pipeline, name, type, batch_id)
    VALUES (%(pipeline)s, %(name)s, %(type)s, %(batch_id)s)
    ON CONFLICT (pipeline, name) DO UPDATE SET type = excluded.type, batch_id = excluded.batch_id,
                                               recorded_at = now()
"""
DELETE_OUTPUT_COLUMN = """
    DELETE FROM kafka_ledger.output_columns WHERE pipeline = %(pipeline)s AND name = %(name)s
"""
# A table's columns with their types as Postgres names them (format_type: `numeric(12,2)`, `timestamp with time zone`).
SELECT_COLUMN_TYPES = """
    SELECT a.attname, format_type(a.atttypid, a.atttypmod)
    FROM pg_attribute a
    WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
"""

# The topic id each topic of a batch was read under: as planned, or (ranges planned before ids were recorded)
# the topic's anchor.
SELECT_BATCH_TOPIC_IDS = """
    SELECT DISTINCT r.topic, coalesce(r.topic_id, a.topic_id)
    FROM kafka_ledger.batch_ranges r
    JOIN kafka_ledger.batches b USING (batch_id)
    LEFT JOIN kafka_ledger.topic_anchors a ON a.pipeline = b.pipeline AND a.topic = r.topic
    WHERE r.batch_id = %(batch_id)s
"""

# Every read stretch of a pipeline with the topic id its batch read it under (NULL: planned before ids were kept).
SELECT_READ_COVERAGE_TOPIC_IDS = """
    SELECT c.topic, c.partition, c.from_offset, c.until_offset, r.topic_id
    FROM kafka_ledger.committed_ranges c
    LEFT JOIN kafka_ledger.batch_ranges r ON r.batch_id = c.batch_id AND r.topic = c.topic AND r.partition = c.partition
    WHERE c.pipeline = %(pipeline)s AND c.disposition = 'read'
    ORDER BY c.topic, c.partition, c.from_offset
"""

UPDATE_BATCH_OWNER = """
    UPDATE kafka_ledger.batches SET dag_id = %(dag_id)s, run_id = %(run_id)s WHERE batch_id = %(batch_id)s
"""

SELECT_POSITIONS = """
    SELECT topic, partition, position FROM kafka_ledger.positions WHERE pipeline = %(pipeline)s
"""

# New partitions get their start position once; an existing position is never overwritten here.
INSERT_START_POSITIONS = """
    INSERT INTO kafka_ledger.positions (pipeline, topic, partition, position, start_offset)
    SELECT p.pipeline, p.topic, p.partition, p.position, p.position
    FROM (VALUES %s) AS p (pipeline, topic, partition, position)
    ON CONFLICT (pipeline, topic, partition) DO NOTHING
"""
START_POSITION_VALUES = "(%s, %s, %s::int, %s::bigint)"

# Every partition's position row of the pipelines: one pipeline's (verify, commit), or all a look covers at once (the
# doorbells' lookout, the metrics, the status of every pipeline).
SELECT_POSITION_ROWS = """
    SELECT pipeline, topic, partition, position, start_offset, last_batch_id, updated_at, newest_timestamp
    FROM kafka_ledger.positions
    WHERE pipeline = ANY(%(pipelines)s) ORDER BY pipeline, topic, partition
"""

# A reset: the position moves, and a start moved back makes the re-read stretch part of what must be tiled.
UPSERT_POSITION = """
    INSERT INTO kafka_ledger.positions (pipeline, topic, partition, position, start_offset)
    VALUES (%(pipeline)s, %(topic)s, %(partition)s, %(position)s, %(position)s)
    ON CONFLICT (pipeline, topic, partition) DO UPDATE
    SET position = EXCLUDED.position, start_offset = least(kafka_ledger.positions.start_offset, EXCLUDED.position),
        last_batch_id = NULL, updated_at = now()
"""

INSERT_RESET = """
    INSERT INTO kafka_ledger.position_resets
        (pipeline, requested_by, reason, target, partitions, abandoned_batches, topic_ids)
    VALUES (%(pipeline)s, %(requested_by)s, %(reason)s, %(target)s, %(partitions)s, %(abandoned_batches)s,
            %(topic_ids)s)
    RETURNING reset_id, requested_at
"""

# --- topic identity ---------------------------------------------------------------------------------------------
SELECT_TOPIC_ANCHORS = "SELECT topic, topic_id FROM kafka_ledger.topic_anchors WHERE pipeline = %(pipeline)s"

UPSERT_TOPIC_ANCHOR = """
    INSERT INTO kafka_ledger.topic_anchors (pipeline, topic, topic_id) VALUES (%(pipeline)s, %(topic)s, %(topic_id)s)
    ON CONFLICT (pipeline, topic) DO UPDATE SET topic_id = EXCLUDED.topic_id, anchored_at = now()
"""

# A plan's sighting of each partition's log start: a moved log start keeps the one before (a log start that went
# back, a recreated topic's, starts the history again).
OBSERVE_LOG_STARTS = """
    INSERT INTO kafka_ledger.log_starts AS o (pipeline, topic, partition, log_start, since) VALUES %s
    ON CONFLICT (pipeline, topic, partition) DO UPDATE SET
        previous_log_start = CASE WHEN EXCLUDED.log_start > o.log_start THEN o.log_start END,
        previous_since = CASE WHEN EXCLUDED.log_start > o.log_start THEN o.since END,
        log_start = EXCLUDED.log_start, since = EXCLUDED.since
    WHERE o.log_start <> EXCLUDED.log_start
"""

# Offsets per second retention moved each partition's log start, between the plans that first saw its last two
# values.
SELECT_LOG_START_RATES = """
    SELECT topic, partition, (log_start - previous_log_start) / extract(epoch FROM since - previous_since)
    FROM kafka_ledger.log_starts
    WHERE pipeline = %(pipeline)s AND previous_log_start IS NOT NULL AND since > previous_since
"""

# --- Spark Connect sessions (the connect runtime) -----------------------------------------------------------------
# The statuses of the batches that stamped an Iceberg table's snapshots (lake_maintenance: what may expire).
SELECT_BATCH_STATUSES = """
    SELECT batch_id, status FROM kafka_ledger.batches WHERE pipeline = %(pipeline)s AND batch_id = ANY(%(batch_ids)s)
"""

# A run carrying a doorbell pipeline's batches holds this lease (renewed before each batch) until it ends.
HOLD_CARRYING_LEASE = """
    INSERT INTO kafka_ledger.carrying_runs (pipeline, dag_id, run_id, until)
    VALUES (%(pipeline)s, %(dag_id)s, %(run_id)s, now() + make_interval(secs => %(seconds)s))
    ON CONFLICT (pipeline) DO UPDATE SET dag_id = EXCLUDED.dag_id, run_id = EXCLUDED.run_id,
        since = CASE WHEN carrying_runs.run_id = EXCLUDED.run_id THEN carrying_runs.since ELSE now() END,
        until = EXCLUDED.until
"""

RELEASE_CARRYING_LEASE = """
    DELETE FROM kafka_ledger.carrying_runs
    WHERE pipeline = %(pipeline)s AND dag_id = %(dag_id)s AND run_id = %(run_id)s
"""

LEASE_HELD = "until > now()"

SELECT_CARRYING_RUN = f"""
    SELECT run_id FROM kafka_ledger.carrying_runs WHERE pipeline = %(pipeline)s AND {LEASE_HELD}
"""

# --- the doorbells' look (airflow/doorbell.py): every pipeline of a triggerer in one transaction, at each poll ----
DOORBELL_CARRYING = f"""
    SELECT pipeline FROM kafka_ledger.carrying_runs WHERE pipeline = ANY(%(pipelines)s) AND {LEASE_HELD}
"""

SELECT_SPARK_SESSION = "SELECT session_id::text FROM kafka_ledger.spark_sessions WHERE pipeline = %(pipeline)s"

# Replaces the pipeline's session only if it is still the closed one: racing replacements settle on one session.
REPLACE_SPARK_SESSION = """
    INSERT INTO kafka_ledger.spark_sessions AS s (pipeline, session_id) VALUES (%(pipeline)s, %(replacement)s)
    ON CONFLICT (pipeline) DO UPDATE SET session_id = EXCLUDED.session_id, since = now()
    WHERE s.session_id = %(closed)s
    RETURNING session_id::text
"""

SELECT_RESETS = """
    SELECT reset_id, requested_by, requested_at, reason, target, partitions, abandoned_batches
    FROM kafka_ledger.position_resets WHERE pipeline = %(pipeline)s ORDER BY reset_id DESC LIMIT %(limit)s
"""

ABANDON_UNFINISHED_BATCHES = f"""
    UPDATE kafka_ledger.batches SET status = 'abandoned', last_error = %(error)s
    WHERE pipeline = %(pipeline)s AND {UNFINISHED}
    RETURNING batch_id
"""

SELECT_COVERAGE = """
    SELECT topic, partition, from_offset, until_offset, disposition, batch_id, reset_id
    FROM kafka_ledger.committed_ranges WHERE pipeline = %(pipeline)s ORDER BY topic, partition, from_offset
"""

DELETE_COVERAGE = """
    DELETE FROM kafka_ledger.committed_ranges
    WHERE pipeline = %(pipeline)s AND topic = %(topic)s AND partition = %(partition)s AND from_offset = %(from_offset)s
"""

INSERT_COVERAGE = """
    INSERT INTO kafka_ledger.committed_ranges
        (pipeline, topic, partition, from_offset, until_offset, disposition, batch_id, reset_id)
    VALUES (%(pipeline)s, %(topic)s, %(partition)s, %(from_offset)s, %(until_offset)s, %(disposition)s,
            %(batch_id)s, %(reset_id)s)
"""

# A new attempt of the Spark job: it stages rows tagged with this attempt number.
BEGIN_ATTEMPT = """
    UPDATE kafka_ledger.batches
    SET attempts = attempts + 1, status = 'planned', started_at = now(), last_error = NULL
    WHERE batch_id = %(batch_id)s AND status IN ('planned', 'failed')
    RETURNING attempts
"""

# Only the newest attempt may declare the batch written: a zombie attempt's update matches no row.
MARK_WRITTEN = """
    UPDATE kafka_ledger.batches
    SET status = 'written', staged_attempt = %(attempt)s, written_at = now(),
        records_read = %(records_read)s, read_seconds = %(read_seconds)s
    WHERE batch_id = %(batch_id)s AND attempts = %(attempt)s AND status = 'planned'
"""

UPDATE_RANGES_RECORDS_READ = """
    UPDATE kafka_ledger.batch_ranges AS r SET records_read = v.records_read, newest_timestamp = v.newest_timestamp
    FROM (VALUES %s) AS v (batch_id, topic, partition, records_read, newest_timestamp)
    WHERE r.batch_id = v.batch_id AND r.topic = v.topic AND r.partition = v.partition
"""
RANGE_RECORDS_READ_VALUES = "(%s::bigint, %s, %s::int, %s::bigint, %s::timestamptz)"

# A batch that was never written goes to failed; a written one keeps its staged rows for the commit.
MARK_FAILED = """
    UPDATE kafka_ledger.batches SET status = 'failed', failed_at = now(), last_error = %(error)s
    WHERE batch_id = %(batch_id)s AND status = 'planned'
"""

# A committed batch keeps no error: a task failing after a racing attempt committed it changes nothing.
RECORD_ERROR = """
    UPDATE kafka_ledger.batches SET last_error = %(error)s WHERE batch_id = %(batch_id)s AND status <> 'committed'
"""

# A catch-up batch's coverage: the ranges it read, and the stretches a latest_only batch skipped.
INSERT_COMMITTED_RANGES = """
    INSERT INTO kafka_ledger.committed_ranges
        (pipeline, topic, partition, from_offset, until_offset, batch_id, disposition)
    SELECT %(pipeline)s, topic, partition, from_offset, until_offset, batch_id, 'read'
    FROM kafka_ledger.batch_ranges WHERE batch_id = %(batch_id)s AND from_offset < until_offset
    UNION ALL
    SELECT %(pipeline)s, topic, partition, skipped_from, from_offset, batch_id, 'skipped'
    FROM kafka_ledger.batch_ranges WHERE batch_id = %(batch_id)s AND skipped_from IS NOT NULL
"""

# Compare-and-set: a position advances only from exactly the offset the batch started at.
# Each range finds its position by the primary key (the LATERAL look-up, OFFSET 0 keeping it one), then the row by
# its ctid. Joined directly, a pipeline's first batches over thousands of new partitions (before autovacuum had
# analyzed the tables: one row expected on each side) compared every position with every range: 16 s at 10,000
# partitions, 67 ms this way. A position updated meanwhile has a new ctid: its row is skipped, the count falls short,
# and the commit fails as for any other moved position.
ADVANCE_POSITIONS = """
    UPDATE kafka_ledger.positions p
    SET position = r.until_offset, last_batch_id = r.batch_id, updated_at = now(),
        newest_timestamp = greatest(p.newest_timestamp, r.newest_timestamp)
    FROM kafka_ledger.batch_ranges r CROSS JOIN LATERAL (
        SELECT q.ctid FROM kafka_ledger.positions q
        WHERE q.pipeline = %(pipeline)s AND q.topic = r.topic AND q.partition = r.partition
        OFFSET 0) found
    WHERE r.batch_id = %(batch_id)s AND p.ctid = found.ctid AND p.pipeline = %(pipeline)s
      AND p.position = coalesce(r.skipped_from, r.from_offset)
    RETURNING p.topic, p.partition
"""

SELECT_POSITION_MISMATCHES = """
    SELECT r.topic, r.partition, coalesce(r.skipped_from, r.from_offset), p.position
    FROM kafka_ledger.batch_ranges r
    LEFT JOIN kafka_ledger.positions p
      ON p.pipeline = %(pipeline)s AND p.topic = r.topic AND p.partition = r.partition
    WHERE r.batch_id = %(batch_id)s AND p.position IS DISTINCT FROM coalesce(r.skipped_from, r.from_offset)
    ORDER BY r.topic, r.partition
"""

# Replace, not append: a replay (or a re-read after a backward reset) first removes what the offsets
# published before, so each record ends up exactly once whatever ran earlier.
# A batch's offset ranges as rows (topic, partition, from_offset, until_offset), from the four arrays of
# ranges_params: one statement removes what all of a batch's ranges published, however many partitions it has.
_RANGE_ARRAYS = """unnest(%(topics)s::text[], %(partitions)s::integer[], %(from_offsets)s::bigint[],
                             %(until_offsets)s::bigint[])"""
RANGES = _RANGE_ARRAYS + " AS r(topic, partition, from_offset, until_offset)"
# The same, numbered from 1 in the order given (range_no): what is found in them comes back in that order.
NUMBERED_RANGES = _RANGE_ARRAYS + " WITH ORDINALITY AS r(topic, partition, from_offset, until_offset, range_no)"


def ranges_params(ranges: Iterable[OffsetRange]) -> dict[str, list[Any]]:
    """The parameters of RANGES for these ranges."""
    ranges = list(ranges)
    return {"topics": [r.topic for r in ranges], "partitions": [r.partition for r in ranges],
            "from_offsets": [r.from_offset for r in ranges], "until_offsets": [r.until_offset for r in ranges]}


def delete_within_ranges(table: sql.Composable, rows_of: str = "") -> sql.Composed:
    """DELETE the rows of `table` inside RANGES' ranges (`rows_of`: a further condition on its rows `t`, ending in
    AND): each range looked up in the table's btree on (..., kafka_topic, kafka_partition, kafka_offset), then its
    rows deleted by their row ids. Joined to the ranges directly, the planner hashed them and read the whole table
    for every batch (0.19 s at 738,000 rows of output, growing with them; this way 0.2 ms). OFFSET 0 keeps the
    planner from flattening the look-up back into that join."""
    return sql.SQL("""
        DELETE FROM {table} WHERE ctid = ANY (ARRAY(
            SELECT found.ctid FROM {ranges} CROSS JOIN LATERAL (
                SELECT t.ctid FROM {table} t
                WHERE {rows_of}t.kafka_topic = r.topic AND t.kafka_partition = r.partition
                  AND t.kafka_offset >= r.from_offset AND t.kafka_offset < r.until_offset
                OFFSET 0) found))
    """).format(table=table, ranges=sql.SQL(RANGES), rows_of=sql.SQL(rows_of))


DELETE_DEAD_LETTER_RANGES = delete_within_ranges(sql.SQL("kafka_ledger.dead_letters"), "t.pipeline = %(pipeline)s AND ")


def offsets_within_ranges(table: sql.Composable, rows_of: str = "") -> sql.Composed:
    """SELECT (range_no, kafka_offset) of the rows of `table` inside NUMBERED_RANGES' ranges, in the ranges' order
    and then by offset: each range looked up in the table's btree on its coordinates as in delete_within_ranges,
    so that thousands of small ranges cost one statement, not a query each (verify)."""
    return sql.SQL("""
        SELECT r.range_no, found.kafka_offset FROM {ranges} CROSS JOIN LATERAL (
            SELECT t.kafka_offset FROM {table} t
            WHERE {rows_of}t.kafka_topic = r.topic AND t.kafka_partition = r.partition
              AND t.kafka_offset >= r.from_offset AND t.kafka_offset < r.until_offset
            OFFSET 0) found
        ORDER BY r.range_no, found.kafka_offset
    """).format(table=table, ranges=sql.SQL(NUMBERED_RANGES), rows_of=sql.SQL(rows_of))


SELECT_DEAD_LETTER_OFFSETS_WITHIN_RANGES = offsets_within_ranges(
    sql.SQL("kafka_ledger.dead_letters"), "t.pipeline = %(pipeline)s AND ")

# The Iceberg snapshot that published the batch (an Iceberg sink), recorded by the commit that moves the offsets.
RECORD_BATCH_SNAPSHOT = "UPDATE kafka_ledger.batches SET snapshot_id = %(snapshot_id)s WHERE batch_id = %(batch_id)s"

# committed_at is the statement's clock, not the transaction's start (now()): a commit transaction streams the whole
# batch first, and freshness is measured to the moment its rows became visible.
MARK_COMMITTED = """
    UPDATE kafka_ledger.batches
    SET status = 'committed', committed_at = clock_timestamp(), records_written = %(records_written)s,
        records_dead_lettered = %(records_dead_lettered)s, commit_seconds = %(commit_seconds)s,
        last_error = NULL
    WHERE batch_id = %(batch_id)s AND status = 'written'
"""

# The columns a dead letter is written with (the table adds dead_lettered_at itself).
DEAD_LETTER_COLUMNS = names(DEAD_LETTER)

INSERT_DEAD_LETTERS = sql.SQL(
    """
    INSERT INTO kafka_ledger.dead_letters ({columns})
    SELECT %(pipeline)s, {staged}
    FROM {{staging}}
    WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s AND error IS NOT NULL
    """.format(columns=", ".join(DEAD_LETTER_COLUMNS), staged=", ".join(DEAD_LETTER_COLUMNS[1:]))
)


def insert_dead_letters(rows: sql.Composable, with_: sql.Composable | None = None) -> sql.Composed:
    """Dead letters from a query whose columns are DEAD_LETTER_COLUMNS, in their order (`with_`: a WITH clause
    before the INSERT, which the query may read)."""
    return sql.SQL("{} INSERT INTO kafka_ledger.dead_letters ({}) {}").format(
        with_ or sql.SQL(""), sql.SQL(", ").join(sql.Identifier(name) for name in DEAD_LETTER_COLUMNS), rows)


# The dead letters an entity table's merge wrote without their record (sinks/postgres/sql.dead_letter_lacking), given
# the record's key and value as read again from Kafka; `gone`, when Kafka no longer holds the record, is appended to
# the reason (execute_values: rows of DEAD_LETTER_RECORD_VALUES).
COMPLETE_DEAD_LETTERS = """
    UPDATE kafka_ledger.dead_letters AS d
    SET kafka_key = r.kafka_key, kafka_value = r.kafka_value, error = d.error || coalesce(r.gone, '')
    FROM (VALUES %s) AS r (pipeline, kafka_topic, kafka_partition, kafka_offset, kafka_key, kafka_value, gone)
    WHERE d.pipeline = r.pipeline AND d.kafka_topic = r.kafka_topic AND d.kafka_partition = r.kafka_partition
      AND d.kafka_offset = r.kafka_offset
"""
DEAD_LETTER_RECORD_VALUES = "(%s, %s, %s::int, %s::bigint, %s::bytea, %s::bytea, %s)"


# The direct publish (Spark Connect runtime): rows arrive as CSV lines and are copied straight into their
# tables inside the commit's transaction, with no staging copy.
COPY_DEAD_LETTERS = "COPY kafka_ledger.dead_letters ({}) FROM STDIN WITH (FORMAT csv)".format(
    ", ".join(DEAD_LETTER_COLUMNS))

STAGED_READ_STATS = sql.SQL(
    """
    SELECT kafka_topic, kafka_partition, count(*), count(DISTINCT kafka_offset),
           min(kafka_offset), max(kafka_offset), count(*) FILTER (WHERE error IS NOT NULL),
           max(kafka_timestamp) FILTER (WHERE error IS NULL)
    FROM {staging}
    WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s
    GROUP BY kafka_topic, kafka_partition
    """
)

# Rows of earlier attempts (killed or superseded) are removed before a new attempt stages its own.
DELETE_OLDER_STAGED = sql.SQL("DELETE FROM {staging} WHERE batch_id = %(batch_id)s AND attempt < %(attempt)s")
DELETE_STAGED = sql.SQL("DELETE FROM {staging} WHERE batch_id = %(batch_id)s")

# The columns of a table's primary key (`table` a quoted, qualified name).
SELECT_PRIMARY_KEY_COLUMNS = """
    SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
    WHERE i.indrelid = to_regclass(%(table)s) AND i.indisprimary
"""

# Each index of a table, its key columns in order (a partial or expression index's too: the caller judges).
SELECT_INDEX_COLUMNS = """
    SELECT i.indexrelid::regclass::text, array(
        SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.position)
    FROM pg_index i WHERE i.indrelid = to_regclass(%(table)s) AND i.indpred IS NULL
"""

SELECT_TABLE_COLUMNS = """
    SELECT column_name FROM information_schema.columns
    WHERE table_schema = %(schema)s AND table_name = %(table)s
"""

# Any batch of the pipeline that is 'written' but whose staged rows are gone must be read again.
REOPEN_WRITTEN_BATCHES = """
    UPDATE kafka_ledger.batches SET status = 'planned', staged_attempt = NULL
    WHERE pipeline = %(pipeline)s AND status = 'written'
"""


# A pipeline's ledger rows, children before parents (foreign keys point at batches).
DELETE_PIPELINE_LEDGER_ROWS = [
    f"DELETE FROM kafka_ledger.{table} WHERE pipeline = %(pipeline)s"
    for table in ("dead_letters", "positions", "committed_ranges", "batches", "position_resets", "verified_points",
                  "topic_anchors", "log_starts", "spark_sessions", "carrying_runs", "pipeline_columns",
                  "output_columns", "verify_results", "dead_letter_counts", "batch_totals", "batch_duration_counts")
]

SELECT_DEAD_LETTER_REASONS = """
    SELECT kafka_topic, kafka_partition, kafka_offset, error FROM kafka_ledger.dead_letters
    WHERE pipeline = %(pipeline)s ORDER BY kafka_topic, kafka_partition, kafka_offset
"""

SELECT_DEAD_LETTER_IDS = """
    SELECT kafka_topic, kafka_partition, kafka_offset FROM kafka_ledger.dead_letters WHERE pipeline = %(pipeline)s
"""

# --- verify ---------------------------------------------------------------------------------------------------

SELECT_VERIFIED_POINT = "SELECT batch_id FROM kafka_ledger.verified_points WHERE pipeline = %(pipeline)s"

# The highest batch id through which every batch of the pipeline is finished (committed or abandoned): the
# point a verify of this snapshot may advance to. An unfinished batch below the newest one (a replay still
# running) keeps the point below it, so its commit is checked by the next verify.
SELECT_FINISHED_THROUGH = f"""
    SELECT coalesce(
        (SELECT min(batch_id) - 1 FROM kafka_ledger.batches WHERE pipeline = %(pipeline)s AND {UNFINISHED}),
        (SELECT max(batch_id) FROM kafka_ledger.batches WHERE pipeline = %(pipeline)s),
        0)
"""

# The ranges of every batch committed after the verified point: catch-ups, and rewrites (replays, offset
# ranges, windows, backfills) that replaced rows of ranges verified before.
SELECT_RANGES_COMMITTED_AFTER = """
    SELECT b.batch_id, r.topic, r.partition, r.from_offset, r.until_offset
    FROM kafka_ledger.batches b JOIN kafka_ledger.batch_ranges r USING (batch_id)
    WHERE b.pipeline = %(pipeline)s AND b.status = 'committed' AND b.batch_id > %(after)s
      AND r.from_offset < r.until_offset
    ORDER BY r.topic, r.partition, r.from_offset
"""

# Never moves back: of two verifies finishing in either order, the further point stays.
ADVANCE_VERIFIED_POINT = """
    INSERT INTO kafka_ledger.verified_points (pipeline, batch_id, mode)
    VALUES (%(pipeline)s, %(batch_id)s, %(mode)s)
    ON CONFLICT (pipeline) DO UPDATE
    SET batch_id = greatest(kafka_ledger.verified_points.batch_id, EXCLUDED.batch_id),
        verified_at = now(), mode = EXCLUDED.mode
    RETURNING batch_id
"""


VERIFY_RESULTS = ("ok", "problems", "unverified")

RECORD_VERIFY_RESULT = """
    INSERT INTO kafka_ledger.verify_results AS v (pipeline, mode, result, problems, concluded_at)
    VALUES (%(pipeline)s, %(mode)s, %(result)s, %(problems)s,
            CASE WHEN %(result)s <> 'unverified' THEN now() END)
    ON CONFLICT (pipeline) DO UPDATE
    SET verified_at = now(), mode = EXCLUDED.mode, result = EXCLUDED.result, problems = EXCLUDED.problems,
        concluded_at = coalesce(EXCLUDED.concluded_at, v.concluded_at)
"""


def staging_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.Identifier(STAGING_SCHEMA, pipeline.name)


def staging_table_name(pipeline: PipelineConfig) -> str:
    """The staging table as plain text, for Spark's JDBC writer (names are validated identifiers)."""
    return f"{STAGING_SCHEMA}.{pipeline.name}"


def declared_columns(pipeline: PipelineConfig, staged: bool = False) -> list[sql.Composed]:
    """The declared columns as CREATE TABLE lines, each of its kind's Postgres type (`staged`: the type Spark's JDBC
    writer stages it in)."""
    return [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type.staging_type if staged
                                                                     else c.type.postgres_type))
            for c in pipeline.columns]


def ledger_columns(columns: Iterable[Column]) -> list[sql.Composable]:
    return [sql.SQL(c.ddl) for c in columns]


def create_staging_table(pipeline: PipelineConfig, extra: tuple[Column, ...]) -> sql.Composed:
    """Where the Spark job stages one attempt's rows: decoded columns (and the sink's `extra` ones, e.g. an entity
    table's tombstone flag), or the raw record and its error."""
    return sql.SQL(
        """
        CREATE TABLE IF NOT EXISTS {table} (
            {columns}
        );
        CREATE INDEX IF NOT EXISTS {index} ON {table} (batch_id, attempt)
        """
    ).format(
        table=staging_table(pipeline),
        # "$" cannot appear in a pipeline name, so this index name never collides with a staging table.
        index=sql.Identifier(f"{pipeline.name}$batch_attempt"),
        columns=sql.SQL(",\n            ").join(ledger_columns(STAGING_HEAD) + declared_columns(pipeline, staged=True)
                                                + ledger_columns(extra)),
    )


def staging_columns(pipeline: PipelineConfig, extra: tuple[Column, ...]) -> list[str]:
    """Columns of a staged row, in the staging table's order: the attempt and raw record, then the declared ones
    (and the sink's `extra` ones)."""
    return names(STAGING_HEAD) + [c.name for c in pipeline.columns] + names(extra)


def drop_staging_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(staging_table(pipeline))


def distinct_partitions(table: sql.Composable, where: sql.Composable) -> sql.Composed:
    """Distinct (topic, partition) of a table by skipping through its (topic, partition, offset) index: one
    index descent per partition instead of reading every row (a loose index scan, as a recursive query)."""
    return sql.SQL(
        """
        SELECT * FROM (WITH RECURSIVE p AS (
            (SELECT kafka_topic, kafka_partition FROM {table} WHERE {where} ORDER BY 1, 2 LIMIT 1)
            UNION ALL
            SELECT n.kafka_topic, n.kafka_partition FROM p, LATERAL (
                SELECT kafka_topic, kafka_partition FROM {table}
                WHERE {where} AND (kafka_topic, kafka_partition) > (p.kafka_topic, p.kafka_partition)
                ORDER BY 1, 2 LIMIT 1) n
        ) SELECT * FROM p) AS partitions
        """
    ).format(table=table, where=where)


# Every (topic, partition) with a dead letter of the pipeline.
SELECT_DEAD_LETTER_PARTITIONS = distinct_partitions(
    sql.Identifier("kafka_ledger", "dead_letters"), sql.SQL("pipeline = %(pipeline)s"))


# Offsets of one partition's dead letters in [from, until), ascending: an ordered scan of the primary key.
SELECT_DEAD_LETTER_OFFSETS = """
    SELECT kafka_offset FROM kafka_ledger.dead_letters
    WHERE pipeline = %(pipeline)s AND kafka_topic = %(topic)s AND kafka_partition = %(partition)s
      AND kafka_offset >= %(from_offset)s AND kafka_offset < %(until_offset)s
    ORDER BY kafka_offset
"""


# --- the ledger page and its API --------------------------------------------------------------------------------

# A pipeline's recent batches, newest first, with the lag each one found when it was planned: the offsets
# between where it started reading each partition and that partition's end then (null before migration 0005).
SELECT_BATCH_HISTORY = """
    SELECT b.batch_id, b.kind, b.status, b.planned_at, b.committed_at, b.records_read, b.records_written,
           b.records_dead_lettered,
           CASE WHEN count(r.end_offset) = count(*) AND count(*) > 0
                THEN sum(r.end_offset - coalesce(r.skipped_from, r.from_offset))::bigint END AS lag_when_planned
    FROM kafka_ledger.batches b LEFT JOIN kafka_ledger.batch_ranges r USING (batch_id)
    WHERE b.pipeline = %(pipeline)s
    GROUP BY b.batch_id ORDER BY b.batch_id DESC LIMIT %(limit)s
"""

# Dead letters by reason, the most frequent first.
SELECT_DEAD_LETTER_GROUPS = """
    SELECT error, count(*), min(dead_lettered_at), max(dead_lettered_at) FROM kafka_ledger.dead_letters
    WHERE pipeline = %(pipeline)s GROUP BY error ORDER BY count(*) DESC, error LIMIT %(limit)s
"""

# The first few dead letters of each reason, in offset order.
SELECT_DEAD_LETTER_SAMPLES = """
    SELECT error, kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_key, kafka_value, batch_id
    FROM (SELECT *, row_number() OVER (PARTITION BY error ORDER BY kafka_topic, kafka_partition, kafka_offset) AS n
          FROM kafka_ledger.dead_letters WHERE pipeline = %(pipeline)s) AS numbered
    WHERE n <= %(samples)s ORDER BY error, kafka_topic, kafka_partition, kafka_offset
"""

SELECT_RANGE_END_OFFSETS = """
    SELECT topic, partition, end_offset, records_read FROM kafka_ledger.batch_ranges WHERE batch_id = %(batch_id)s
"""

# --- metrics (ops/metrics.py): every declared pipeline's figures in one transaction, at scrape time ---------------
# The totals are kept by triggers as batches end and dead letters come and go (migration 0018): a scrape reads a few
# rows per pipeline and partition, never the pipelines' history.
METRICS_BATCH_TOTALS = """
    SELECT pipeline, committed, abandoned, attempts, records_published, skipped_offsets, last_committed_at
    FROM kafka_ledger.batch_totals WHERE pipeline = ANY(%(pipelines)s)
"""

# Through the partial index of unfinished batches.
METRICS_UNFINISHED_BATCHES = f"""
    SELECT pipeline, status, count(*), sum(attempts) FROM kafka_ledger.batches
    WHERE pipeline = ANY(%(pipelines)s) AND {UNFINISHED} GROUP BY pipeline, status
"""

METRICS_DEAD_LETTERS = """
    SELECT pipeline, reason, dead_letters FROM kafka_ledger.dead_letter_counts
    WHERE pipeline = ANY(%(pipelines)s) AND dead_letters > 0
"""

METRICS_BATCH_DURATIONS = """
    SELECT pipeline, stage, le, batches, seconds FROM kafka_ledger.batch_duration_counts
    WHERE pipeline = ANY(%(pipelines)s)
"""

METRICS_VERIFY_RESULTS = """
    SELECT pipeline, verified_at, result, concluded_at FROM kafka_ledger.verify_results
    WHERE pipeline = ANY(%(pipelines)s)
"""
