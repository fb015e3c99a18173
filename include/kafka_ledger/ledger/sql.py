"""Every SQL statement kafka-ledger runs, in one place (the schema itself is in migrations/)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from psycopg2 import sql

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.model.columns import (
    COORDINATES,
    DEAD_LETTER,
    OUTPUT_TRAILER,
    POSTGRES_TYPES,
    STAGING_HEAD,
    TOMBSTONE,
    names,
)

if TYPE_CHECKING:
    from kafka_ledger.model.ranges import OffsetRange

STAGING_SCHEMA = "kafka_ledger_staging"
# An entity table's deleted keys (write: upsert), one table per pipeline: what a tombstone deleted, kept so that
# an older record of the key (a replay, a backfill) cannot bring the entity back.
TOMBSTONES_SCHEMA = "kafka_ledger_tombstones"
# An entity table's publish: the batch's rows, then the newest of them per key; dropped with the transaction.
INCOMING_TABLE = "kafka_ledger_incoming"
NEWEST_TABLE = "kafka_ledger_newest"

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

# The first batch a DAG run committed: a cleared run replays it rather than planning anew.
SELECT_RUN_COMMITTED_BATCH = """
    SELECT batch_id FROM kafka_ledger.batches
    WHERE pipeline = %(pipeline)s AND dag_id = %(dag_id)s AND run_id = %(run_id)s AND status = 'committed'
    ORDER BY batch_id LIMIT 1
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
INSERT_BATCH_RANGE = """
    INSERT INTO kafka_ledger.batch_ranges
        (batch_id, topic, partition, from_offset, until_offset, skipped_from, end_offset, topic_id)
    VALUES (%(batch_id)s, %(topic)s, %(partition)s, %(from_offset)s, %(until_offset)s, %(skipped_from)s,
            %(end_offset)s, (SELECT topic_id FROM kafka_ledger.topic_anchors
                             WHERE pipeline = %(pipeline)s AND topic = %(topic)s))
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
INSERT_START_POSITION = """
    INSERT INTO kafka_ledger.positions (pipeline, topic, partition, position, start_offset)
    VALUES (%(pipeline)s, %(topic)s, %(partition)s, %(position)s, %(position)s)
    ON CONFLICT (pipeline, topic, partition) DO NOTHING
"""

SELECT_POSITION_ROWS = """
    SELECT topic, partition, position, start_offset, last_batch_id, updated_at, newest_timestamp
    FROM kafka_ledger.positions
    WHERE pipeline = %(pipeline)s ORDER BY topic, partition
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

UPDATE_RANGE_RECORDS_READ = """
    UPDATE kafka_ledger.batch_ranges SET records_read = %(records_read)s, newest_timestamp = %(newest_timestamp)s
    WHERE batch_id = %(batch_id)s AND topic = %(topic)s AND partition = %(partition)s
"""

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
ADVANCE_POSITIONS = """
    UPDATE kafka_ledger.positions p
    SET position = r.until_offset, last_batch_id = r.batch_id, updated_at = now(),
        newest_timestamp = greatest(p.newest_timestamp, r.newest_timestamp)
    FROM kafka_ledger.batch_ranges r
    WHERE r.batch_id = %(batch_id)s AND p.pipeline = %(pipeline)s
      AND p.topic = r.topic AND p.partition = r.partition AND p.position = coalesce(r.skipped_from, r.from_offset)
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
_RANGES = """unnest(%(topics)s::text[], %(partitions)s::integer[], %(from_offsets)s::bigint[],
                       %(until_offsets)s::bigint[]) AS r(topic, partition, from_offset, until_offset)"""


def ranges_params(ranges: Iterable[OffsetRange]) -> dict[str, list[Any]]:
    """The parameters of _RANGES for these ranges."""
    ranges = list(ranges)
    return {"topics": [r.topic for r in ranges], "partitions": [r.partition for r in ranges],
            "from_offsets": [r.from_offset for r in ranges], "until_offsets": [r.until_offset for r in ranges]}


DELETE_DEAD_LETTER_RANGES = f"""
    DELETE FROM kafka_ledger.dead_letters d USING {_RANGES}
    WHERE d.pipeline = %(pipeline)s AND d.kafka_topic = r.topic AND d.kafka_partition = r.partition
      AND d.kafka_offset >= r.from_offset AND d.kafka_offset < r.until_offset
"""

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
                  "topic_anchors", "log_starts", "spark_sessions")
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


def staging_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.Identifier(STAGING_SCHEMA, pipeline.name)


def staging_table_name(pipeline: PipelineConfig) -> str:
    """The staging table as plain text, for Spark's JDBC writer (names are validated identifiers)."""
    return f"{STAGING_SCHEMA}.{pipeline.name}"


def output_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.Identifier(pipeline.output_schema, pipeline.output_table)


def _declared_columns(pipeline: PipelineConfig) -> list[sql.Composed]:
    return [
        sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(POSTGRES_TYPES[c.type])) for c in pipeline.columns
    ]


def _ledger_columns(columns: tuple) -> list[sql.Composable]:
    return [sql.SQL(c.ddl) for c in columns]


def _key(pipeline: PipelineConfig, alias: str | None = None) -> sql.Composed:
    """An entity table's key columns (write: upsert), as a list, of a table's alias if given."""
    return sql.SQL(", ").join(sql.Identifier(*([alias] if alias else []), name) for name in pipeline.key)


def create_output_table(pipeline: PipelineConfig) -> sql.Composed:
    """The published table: declared columns plus the Kafka coordinates, unique per record.

    An at_least_once pipeline's table has a plain index instead of the key: a re-delivered record is
    appended again rather than failing the write (that is what at-least-once means). An entity table
    (write: upsert) is unique per key instead: one row per entity.
    """
    coordinates = sql.SQL(", ".join(names(COORDINATES)))
    if pipeline.is_entity_table:
        key = [sql.SQL("PRIMARY KEY ({})").format(_key(pipeline))]
        index = sql.SQL("")
    elif pipeline.delivery_mode == "at_least_once":
        key = []
        index = sql.SQL("; CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(f"{pipeline.output_table}$kafka_record"), output_table(pipeline), coordinates
        )
    else:
        key = [sql.SQL("PRIMARY KEY ({})").format(coordinates)]
        index = sql.SQL("")
    return sql.SQL(
        """
        CREATE SCHEMA IF NOT EXISTS {schema};
        CREATE TABLE IF NOT EXISTS {table} (
            {columns}
        ){index}
        """
    ).format(
        schema=sql.Identifier(pipeline.output_schema),
        table=output_table(pipeline),
        columns=sql.SQL(",\n            ").join(_declared_columns(pipeline) + _ledger_columns(OUTPUT_TRAILER) + key),
        index=index,
    )


def create_staging_table(pipeline: PipelineConfig) -> sql.Composed:
    """Where the Spark job stages one attempt's rows: decoded columns, or the raw record and its error."""
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
        columns=sql.SQL(",\n            ").join(_ledger_columns(STAGING_HEAD) + _declared_columns(pipeline)
                                                + ([sql.SQL("kafka_tombstone boolean")] if pipeline.is_entity_table
                                                   else [])),
    )


def staging_columns(pipeline: PipelineConfig) -> list[str]:
    """Columns of a staged row, in the staging table's order: the attempt and raw record, then the declared ones
    (and an entity table's tombstone flag)."""
    return names(STAGING_HEAD) + [c.name for c in pipeline.columns] + _tombstone_flag(pipeline)


def _tombstone_flag(pipeline: PipelineConfig) -> list[str]:
    return [TOMBSTONE.name] if pipeline.is_entity_table else []


def drop_staging_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(staging_table(pipeline))


def drop_pipeline_tables(pipeline: PipelineConfig) -> sql.Composed:
    """The pipeline's tables in the ledger's database: its staging table, a Postgres sink's output table and an
    entity table's tombstones."""
    tables = [staging_table(pipeline), tombstone_table(pipeline)]
    if pipeline.output_table is not None:
        tables.append(output_table(pipeline))
    return sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(", ").join(tables))


def select_output_record_ids(pipeline: PipelineConfig) -> sql.Composed:
    return sql.SQL("SELECT kafka_topic, kafka_partition, kafka_offset FROM {}").format(output_table(pipeline))


def _distinct_partitions(table: sql.Composable, where: sql.Composable) -> sql.Composed:
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


def select_output_partitions(pipeline: PipelineConfig) -> sql.Composed:
    """Every (topic, partition) with a row in the Postgres output table."""
    return _distinct_partitions(output_table(pipeline), sql.SQL("true"))


# Every (topic, partition) with a dead letter of the pipeline.
SELECT_DEAD_LETTER_PARTITIONS = _distinct_partitions(
    sql.Identifier("kafka_ledger", "dead_letters"), sql.SQL("pipeline = %(pipeline)s"))


def select_output_offsets(pipeline: PipelineConfig) -> sql.Composed:
    """Offsets of one partition's output rows in [from, until), ascending: an ordered scan of the primary key
    (or, at_least_once, of the coordinates index)."""
    return sql.SQL(
        """
        SELECT kafka_offset FROM {output}
        WHERE kafka_topic = %(topic)s AND kafka_partition = %(partition)s
          AND kafka_offset >= %(from_offset)s AND kafka_offset < %(until_offset)s
        ORDER BY kafka_offset
        """
    ).format(output=output_table(pipeline))


# Offsets of one partition's dead letters in [from, until), ascending: an ordered scan of the primary key.
SELECT_DEAD_LETTER_OFFSETS = """
    SELECT kafka_offset FROM kafka_ledger.dead_letters
    WHERE pipeline = %(pipeline)s AND kafka_topic = %(topic)s AND kafka_partition = %(partition)s
      AND kafka_offset >= %(from_offset)s AND kafka_offset < %(until_offset)s
    ORDER BY kafka_offset
"""


def delete_output_ranges(pipeline: PipelineConfig) -> sql.Composed:
    """Remove the published rows of the offsets [from, until) of some partitions (ranges_params), before they are
    written again."""
    return sql.SQL(
        """
        DELETE FROM {output} t USING {ranges}
        WHERE t.kafka_topic = r.topic AND t.kafka_partition = r.partition
          AND t.kafka_offset >= r.from_offset AND t.kafka_offset < r.until_offset
        """
    ).format(output=output_table(pipeline), ranges=sql.SQL(_RANGES))


def output_columns(pipeline: PipelineConfig) -> list[str]:
    """Columns of an output row: the declared ones, then the Kafka coordinates and the batch."""
    return [c.name for c in pipeline.columns] + names(OUTPUT_TRAILER)


def published_columns(pipeline: PipelineConfig) -> list[str]:
    """Columns of the rows a batch publishes: an output row's, and an entity table's tombstone flag."""
    return output_columns(pipeline) + _tombstone_flag(pipeline)


def _publish_target(pipeline: PipelineConfig) -> sql.Composable:
    """Where a batch's rows go first: the output table, or an entity table's incoming rows (merge_entities)."""
    return sql.Identifier(INCOMING_TABLE) if pipeline.is_entity_table else output_table(pipeline)


def copy_output(pipeline: PipelineConfig) -> sql.Composed:
    """COPY of a batch's rows in binary format (publish.CopyStream), in the order of published_columns(), into the
    output table (an entity table: into its incoming rows)."""
    return sql.SQL("COPY {target} ({columns}) FROM STDIN WITH (FORMAT binary)").format(
        target=_publish_target(pipeline),
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in published_columns(pipeline)))


def publish_output(pipeline: PipelineConfig) -> sql.Composed:
    """Copy one attempt's decoded rows from staging into the output table (an entity table: its incoming rows)."""
    columns = sql.SQL(", ").join(sql.Identifier(name) for name in published_columns(pipeline))
    return sql.SQL(
        """
        INSERT INTO {target} ({columns})
        SELECT {columns} FROM {staging}
        WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s AND error IS NULL
        """
    ).format(target=_publish_target(pipeline), staging=staging_table(pipeline), columns=columns)


# --- entity tables (write: upsert) ------------------------------------------------------------------------------

def tombstone_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.Identifier(TOMBSTONES_SCHEMA, pipeline.name)


def _key_columns(pipeline: PipelineConfig) -> list[sql.Composed]:
    return [sql.SQL("{} {} NOT NULL").format(sql.Identifier(c.name), sql.SQL(POSTGRES_TYPES[c.type]))
            for c in pipeline.key_columns]


def create_tombstone_table(pipeline: PipelineConfig) -> sql.Composed:
    """An entity table's deleted keys: each key's tombstone, where Kafka holds it and its batch."""
    return sql.SQL(
        """
        CREATE SCHEMA IF NOT EXISTS {schema};
        CREATE TABLE IF NOT EXISTS {table} (
            {columns},
            PRIMARY KEY ({key})
        )
        """
    ).format(schema=sql.Identifier(TOMBSTONES_SCHEMA), table=tombstone_table(pipeline), key=_key(pipeline),
             columns=sql.SQL(",\n            ").join(_key_columns(pipeline) + _ledger_columns(OUTPUT_TRAILER)))


def create_incoming_table(pipeline: PipelineConfig) -> sql.Composed:
    """A batch's rows on their way into an entity table: the published columns, gone when the transaction ends."""
    return sql.SQL("CREATE TEMP TABLE {table} ({columns}) ON COMMIT DROP").format(
        table=sql.Identifier(INCOMING_TABLE),
        columns=sql.SQL(", ").join(_declared_columns(pipeline) + _ledger_columns((*OUTPUT_TRAILER, TOMBSTONE))))


# Whether row n supersedes row o of the same key: the rule of migration 0012, in one place.
def _supersedes(new: str, old: str) -> sql.Composed:
    return sql.SQL("kafka_ledger.supersedes({})").format(sql.SQL(", ").join(
        sql.Identifier(alias, name) for alias in (new, old) for name in (*names(COORDINATES), "kafka_timestamp")))


def _same_key(a: str, b: str, pipeline: PipelineConfig) -> sql.Composed:
    return sql.SQL("({}) = ({})").format(_key(pipeline, a), _key(pipeline, b))


def merge_entities(pipeline: PipelineConfig) -> list[tuple[str, sql.Composed]]:
    """The statements that merge a batch's incoming rows into an entity table, in order, each named by what its row
    count says: the newest incoming row per key (in a partition the highest offset; across partitions the rule of
    kafka_ledger.supersedes), then rows upserted and tombstones recorded where they supersede what the table and the
    tombstones hold. An older record never replaces a newer one, whatever order batches commit in."""
    key = _key(pipeline)
    values = [sql.Identifier(name) for name in output_columns(pipeline)]
    trailer = [sql.Identifier(name) for name in (*pipeline.key, *names(OUTPUT_TRAILER))]
    params = {"output": output_table(pipeline), "tombstones": tombstone_table(pipeline),
              "incoming": sql.Identifier(INCOMING_TABLE), "newest": sql.Identifier(NEWEST_TABLE), "key": key,
              "n_o": _same_key("n", "o", pipeline), "n_t": _same_key("n", "t", pipeline),
              "n_supersedes_o": _supersedes("n", "o"), "n_supersedes_t": _supersedes("n", "t"),
              "excluded_supersedes_o": _supersedes("excluded", "o"),
              "excluded_supersedes_t": _supersedes("excluded", "t")}

    def statement(text: str, **more: sql.Composable) -> sql.Composed:
        return sql.SQL(text).format(**params, **more)

    return [
        ("newest", statement(
            """
            CREATE TEMP TABLE {newest} ON COMMIT DROP AS
            SELECT DISTINCT ON ({key}) * FROM (
                SELECT DISTINCT ON ({key}, kafka_topic, kafka_partition) * FROM {incoming}
                ORDER BY {key}, kafka_topic, kafka_partition, kafka_offset DESC) AS newest_per_partition
            ORDER BY {key}, coalesce(kafka_timestamp, '-infinity') DESC, kafka_topic DESC, kafka_partition DESC
            """)),
        ("revived", statement(
            "DELETE FROM {tombstones} t USING {newest} n WHERE NOT n.kafka_tombstone AND {n_t} AND {n_supersedes_t}")),
        ("upserted", statement(
            """
            INSERT INTO {output} AS o ({values})
            SELECT {values} FROM {newest} n
            WHERE NOT n.kafka_tombstone AND NOT EXISTS (SELECT FROM {tombstones} t WHERE {n_t})
            ON CONFLICT ({key}) DO UPDATE SET {updates} WHERE {excluded_supersedes_o}
            """,
            values=sql.SQL(", ").join(values),
            updates=sql.SQL(", ").join(sql.SQL("{0} = excluded.{0}").format(v) for v in values))),
        ("deleted", statement(
            "DELETE FROM {output} o USING {newest} n WHERE n.kafka_tombstone AND {n_o} AND {n_supersedes_o}")),
        ("buried", statement(
            """
            INSERT INTO {tombstones} AS t ({trailer})
            SELECT {trailer} FROM {newest} n
            WHERE n.kafka_tombstone AND NOT EXISTS (SELECT FROM {output} o WHERE {n_o})
            ON CONFLICT ({key}) DO UPDATE SET {updates} WHERE {excluded_supersedes_t}
            """,
            trailer=sql.SQL(", ").join(trailer),
            updates=sql.SQL(", ").join(sql.SQL("{0} = excluded.{0}").format(sql.Identifier(name))
                                       for name in names(OUTPUT_TRAILER)))),
    ]


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
