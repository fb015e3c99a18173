"""The Postgres sink's statements: its output table, an entity table's merge and tombstones (the ledger's own are in
ledger/sql.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg2 import sql

from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.ledger.sql import (
    declared_columns,
    delete_within_ranges,
    distinct_partitions,
    insert_dead_letters,
    ledger_columns,
    offsets_within_ranges,
    staging_table,
)
from kafka_ledger.model.columns import COORDINATES, OUTPUT_TRAILER, Column, names

if TYPE_CHECKING:
    from kafka_ledger.config.pipeline import ColumnSpec
    from kafka_ledger.sinks.postgres.evolution import SchemaChanges

# An entity table's deleted keys (write: upsert), one table per pipeline: what a tombstone deleted, kept so that
# an older record of the key (a replay, a backfill) cannot bring the entity back.
TOMBSTONES_SCHEMA = "kafka_ledger_tombstones"
# An entity table's publish: the batch's rows, then the newest of them per key; dropped with the transaction.
INCOMING_TABLE = "kafka_ledger_incoming"
NEWEST_TABLE = "kafka_ledger_newest"


# A schema the output or tombstone tables need. CREATE SCHEMA IF NOT EXISTS is no guard against a creation racing it
# (the second fails on pg_namespace's unique index: two pipelines' first plans at once, into one schema), so a missing
# schema is created under a lock on its name, held to the end of the transaction.
SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s)"
LOCK_SCHEMA_CREATION = "SELECT pg_advisory_xact_lock(hashtextextended('kafka_ledger.schema:' || %(schema)s, 0))"


def create_schema(schema: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))


def output_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.Identifier(pipeline.output_schema, pipeline.output_table)


def _key(pipeline: PipelineConfig, alias: str | None = None) -> sql.Composed:
    """An entity table's key columns (write: upsert), as a list, of a table's alias if given."""
    return sql.SQL(", ").join(sql.Identifier(*([alias] if alias else []), name) for name in pipeline.key)


def create_output_table(pipeline: PipelineConfig, entity: bool) -> sql.Composed:
    """The published table: declared columns plus the Kafka coordinates, unique per record.

    An at_least_once pipeline's table has a plain index instead of the key: a re-delivered record is
    appended again rather than failing the write (that is what at-least-once means). An entity table
    (write: upsert) is unique per key instead: one row per entity.
    """
    coordinates = sql.SQL(", ".join(names(COORDINATES)))
    if entity:
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
        CREATE TABLE IF NOT EXISTS {table} (
            {columns}
        ){index}
        """
    ).format(
        table=output_table(pipeline),
        columns=sql.SQL(",\n            ").join(declared_columns(pipeline) + ledger_columns(OUTPUT_TRAILER) + key),
        index=index,
    )


def drop_output_tables(pipeline: PipelineConfig) -> sql.Composed:
    """The sink's tables in the ledger's database: the output table, an entity table's tombstones, moved and parked
    rows."""
    return sql.SQL("DROP TABLE IF EXISTS {}, {}, {}, {}").format(
        output_table(pipeline), tombstone_table(pipeline), moved_table(pipeline), parked_table(pipeline))


def select_output_record_ids(pipeline: PipelineConfig) -> sql.Composed:
    return sql.SQL("SELECT kafka_topic, kafka_partition, kafka_offset FROM {}").format(output_table(pipeline))


def select_output_partitions(pipeline: PipelineConfig) -> sql.Composed:
    """Every (topic, partition) with a row in the Postgres output table."""
    return distinct_partitions(output_table(pipeline), sql.SQL("true"))


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


def select_output_offsets_within_ranges(pipeline: PipelineConfig) -> sql.Composed:
    """(range_no, offset) of the output rows inside the numbered ranges (ledger.sql.ranges_params), in the ranges'
    order and then by offset."""
    return offsets_within_ranges(output_table(pipeline))


def delete_output_ranges(pipeline: PipelineConfig) -> sql.Composed:
    """Remove the published rows of the offsets [from, until) of some partitions (ledger.sql.ranges_params), before
    they are written again."""
    return delete_within_ranges(output_table(pipeline))


def alter_output_table(pipeline: PipelineConfig, changes: SchemaChanges) -> list[sql.Composed]:
    """The ALTER TABLE statements of a declaration's changes to the output table (sinks/postgres/evolution.py)."""
    table = output_table(pipeline)
    return [
        *(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
            table, sql.Identifier(c.name), sql.SQL(c.type.postgres_type)) for c in changes.add),
        *(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(
            table, sql.Identifier(c.name), sql.SQL(c.type.postgres_type)) for c, _ in changes.widen),
    ]


def copy_rows(target: sql.Composable, columns: list[str]) -> sql.Composed:
    """COPY of a batch's rows in binary format (copy.CopyStream), in the order of `columns`, into `target`."""
    return sql.SQL("COPY {target} ({columns}) FROM STDIN WITH (FORMAT binary)").format(
        target=target, columns=sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def publish_staged(pipeline: PipelineConfig, target: sql.Composable, columns: list[str]) -> sql.Composed:
    """Copy one attempt's decoded rows (`columns`) from staging into `target`, each declared column made its kind's
    type from the type it was staged in."""
    kinds = {c.name: c.type for c in pipeline.columns}

    def staged(name: str) -> sql.Composable:
        column = sql.Identifier(name)
        kind = kinds.get(name)
        return column if kind is None else sql.SQL(kind.from_staged("{}")).format(column)

    return sql.SQL(
        """
        INSERT INTO {target} ({columns})
        SELECT {values} FROM {staging}
        WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s AND error IS NULL
        """
    ).format(target=target, staging=staging_table(pipeline),
             columns=sql.SQL(", ").join(sql.Identifier(name) for name in columns),
             values=sql.SQL(", ").join(staged(name) for name in columns))


# --- entity tables (write: upsert) ------------------------------------------------------------------------------

def tombstone_table(pipeline: PipelineConfig) -> sql.Composed:
    return sql.Identifier(TOMBSTONES_SCHEMA, pipeline.name)


def _key_columns(pipeline: PipelineConfig) -> list[sql.Composed]:
    return [sql.SQL("{} {} NOT NULL").format(sql.Identifier(c.name), sql.SQL(c.type.postgres_type))
            for c in pipeline.key_columns]


def create_tombstone_table(pipeline: PipelineConfig) -> sql.Composed:
    """An entity table's deleted keys: each key's tombstone, where Kafka holds it and its batch."""
    return sql.SQL(
        """
        CREATE TABLE IF NOT EXISTS {table} (
            {columns},
            PRIMARY KEY ({key})
        )
        """
    ).format(table=tombstone_table(pipeline), key=_key(pipeline),
             columns=sql.SQL(",\n            ").join(_key_columns(pipeline) + ledger_columns(OUTPUT_TRAILER)))


INCOMING = sql.Identifier(INCOMING_TABLE)


def create_incoming_table(pipeline: PipelineConfig, extra: tuple[Column, ...]) -> sql.Composed:
    """A batch's rows on their way into an entity table: the published columns (the envelope's `extra` ones among
    them: the tombstone flag, ...), gone when the transaction ends."""
    return sql.SQL("CREATE TEMP TABLE {table} ({columns}) ON COMMIT DROP").format(
        table=INCOMING, columns=sql.SQL(", ").join(declared_columns(pipeline) + ledger_columns((*OUTPUT_TRAILER,
                                                                                                 *extra))))


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
    tombstones hold. An older record never replaces a newer one, whatever order batches commit in. A row without
    its key changes nothing (a Debezium delete's Kafka tombstone: formats/envelope.DebeziumChanges)."""
    key = _key(pipeline)
    values = [sql.Identifier(c.name) for c in pipeline.columns] + [sql.Identifier(name)
                                                                    for name in names(OUTPUT_TRAILER)]
    trailer = [sql.Identifier(name) for name in (*pipeline.key, *names(OUTPUT_TRAILER))]
    params = {"output": output_table(pipeline), "tombstones": tombstone_table(pipeline),
              "incoming": INCOMING, "newest": sql.Identifier(NEWEST_TABLE), "key": key,
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
                WHERE ({key}) IS NOT NULL
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


# --- change events whose row image lacks values (envelope: debezium; model/debezium.py) ---------------------------
#
# An update that leaves a TOASTed value unchanged carries a placeholder instead (the incoming row's kafka_unavailable
# names such columns, their values NULL). Before the merge, each such value is filled with the entity's value as it
# was just before the event: the latest earlier incoming row of the key (in the key's partition) that carries it;
# else, with no earlier row of the key in the batch, the entity table's row. An event that is itself the create of a
# primary-key change (kafka_old_key: the key it had) takes it from the row the change moved: its delete of the old key
# (kafka_new_key) records that row, as it stood, in the moved-rows table. The two events are in different partitions,
# which batches read at their own pace: a create read before its delete waits, parked with every later event of its
# key in its partition, until a batch reads the delete (each merge takes the parked rows back first). A value found
# nowhere (the entity has no row; the moved row lacked it too) makes the record a dead letter, unless the entity
# table already holds a newer record of the key. Never the placeholder, never a guess.

def moved_table(pipeline: PipelineConfig) -> sql.Composed:
    """The rows an entity table's primary-key changes moved, each by its old and new key (JSON objects of the key
    columns): the row as it stood before the change, as JSON."""
    return sql.Identifier(TOMBSTONES_SCHEMA, f"{pipeline.name}$moved")


def parked_table(pipeline: PipelineConfig) -> sql.Composed:
    """The incoming rows that wait for a primary-key change's delete (as JSON: the incoming table's row)."""
    return sql.Identifier(TOMBSTONES_SCHEMA, f"{pipeline.name}$parked")


def create_change_tables(pipeline: PipelineConfig) -> list[sql.Composed]:
    """The moved rows (row_values NULL: the change's delete was read, but not the values of the row it moved; settled:
    its create was read and applied before the delete, which needs to record nothing) and the parked rows."""
    trailer = sql.SQL(",\n            ").join(ledger_columns(OUTPUT_TRAILER))
    return [sql.SQL(
        """
        CREATE TABLE IF NOT EXISTS {table} (
            old_key jsonb NOT NULL,
            new_key jsonb NOT NULL,
            row_values jsonb,
            settled boolean NOT NULL DEFAULT false,
            {trailer},
            PRIMARY KEY (old_key, new_key)
        )
        """).format(table=moved_table(pipeline), trailer=trailer), sql.SQL(
        """
        CREATE TABLE IF NOT EXISTS {table} (
            {coordinates},
            batch_id bigint NOT NULL,
            parked_row jsonb NOT NULL,
            parked_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY ({names})
        )
        """).format(table=parked_table(pipeline), coordinates=sql.SQL(",\n            ").join(
            ledger_columns(COORDINATES)), names=sql.SQL(", ").join(sql.Identifier(n) for n in names(COORDINATES)))]


# What the merge's filling needs to know of a batch: whether any row lacks values, and whether any moves a key.
SELECT_LACKING = sql.SQL(
    "SELECT bool_or(kafka_unavailable IS NOT NULL), bool_or(kafka_new_key IS NOT NULL OR kafka_old_key IS NOT NULL) "
    "FROM {}").format(INCOMING)
SELECT_LACKING_COLUMNS = sql.SQL(
    "SELECT DISTINCT name FROM {}, jsonb_array_elements_text(kafka_unavailable) AS name "
    "WHERE kafka_unavailable IS NOT NULL").format(INCOMING)


def _key_object(pipeline: PipelineConfig, alias: str) -> sql.Composed:
    """A row's key as the JSON object the envelope writes a primary-key change's keys as (model/debezium.py)."""
    return sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
        sql.SQL("{}, {}").format(sql.Literal(name), sql.Identifier(alias, name)) for name in pipeline.key))


def _row_object(pipeline: PipelineConfig, alias: str) -> sql.Composed:
    """A row's declared columns as a JSON object."""
    return sql.SQL("(SELECT to_jsonb(v) FROM (SELECT {}) AS v)").format(sql.SQL(", ").join(
        sql.Identifier(alias, c.name) for c in pipeline.columns))


def _filled(column: ColumnSpec) -> sql.Composed:
    """The SET list of a filled column: its value, and no longer named as lacking."""
    return sql.SQL("{col} = found.value, kafka_unavailable = nullif(i.kafka_unavailable - {name}, '[]'::jsonb)").format(
        col=sql.Identifier(column.name), name=sql.Literal(column.name))


def fill_from_earlier(pipeline: PipelineConfig, column: ColumnSpec) -> sql.Composed:
    """Fill `column` where an incoming row lacks it: from the latest earlier row of the key in its partition that
    decides it (one that carries it; a delete, after which nothing is known; the create of a primary-key change,
    once filled from its moved row), or, with no earlier row of the key in the batch, from the entity table's row
    (unless the key's rows come from several partitions: their order is not the source's)."""
    key = _key(pipeline)
    return sql.SQL(
        """
        WITH keyed AS (
            SELECT {key}, kafka_topic, kafka_partition, kafka_offset, kafka_tombstone, {col},
                   {lacks} AS lacks, kafka_tombstone OR kafka_old_key IS NOT NULL OR NOT {lacks} AS decides
            FROM {incoming}
            WHERE ({key}) IN (SELECT {key} FROM {incoming} WHERE kafka_unavailable ? {name})
        ), grouped AS (
            SELECT *, count(*) FILTER (WHERE decides) OVER (
                PARTITION BY {key}, kafka_topic, kafka_partition ORDER BY kafka_offset) AS decided
            FROM keyed
        ), found AS (
            SELECT g.kafka_topic, g.kafka_partition, g.kafka_offset, d.{col} AS value
            FROM grouped g JOIN grouped d ON {g_d} AND d.kafka_topic = g.kafka_topic
                 AND d.kafka_partition = g.kafka_partition AND d.decided = g.decided AND d.decides
            WHERE g.lacks AND NOT g.decides AND NOT d.lacks AND NOT d.kafka_tombstone
            UNION ALL
            SELECT g.kafka_topic, g.kafka_partition, g.kafka_offset, o.{col}
            FROM grouped g JOIN {output} o ON {g_o}
            WHERE g.lacks AND NOT g.decides AND g.decided = 0
              AND NOT EXISTS (SELECT FROM keyed x WHERE {x_g} AND (x.kafka_topic, x.kafka_partition)
                                                                 <> (g.kafka_topic, g.kafka_partition))
        )
        UPDATE {incoming} i SET {filled}
        FROM found
        WHERE (i.kafka_topic, i.kafka_partition, i.kafka_offset)
              = (found.kafka_topic, found.kafka_partition, found.kafka_offset)
        """
    ).format(key=key, col=sql.Identifier(column.name), name=sql.Literal(column.name), incoming=INCOMING,
             lacks=sql.SQL("coalesce(kafka_unavailable ? {}, false)").format(sql.Literal(column.name)),
             output=output_table(pipeline), g_d=_same_key("g", "d", pipeline), g_o=_same_key("g", "o", pipeline),
             x_g=_same_key("x", "g", pipeline), filled=_filled(column))


def record_moved(pipeline: PipelineConfig) -> sql.Composed:
    """Record, for each of the batch's deletes that a primary-key change made (kafka_new_key), the old key's row as it
    stood just before: its latest earlier incoming row in the partition, once every value of it is known, else the
    entity table's row (when older than the delete). A change recorded before (a replay) keeps its first record."""
    key = _key(pipeline)
    trailer = sql.SQL(", ").join(sql.Identifier(name) for name in names(OUTPUT_TRAILER))
    return sql.SQL(
        """
        WITH moves AS (
            SELECT * FROM {incoming} WHERE kafka_tombstone AND kafka_new_key IS NOT NULL AND ({key}) IS NOT NULL
        ), before_move AS (
            SELECT DISTINCT ON (m.kafka_topic, m.kafka_partition, m.kafka_offset)
                   m.*, {old_key} AS old_key, p.kafka_offset AS earlier_offset, p.kafka_tombstone AS earlier_deleted,
                   p.kafka_unavailable AS earlier_lacks, CASE WHEN p.kafka_offset IS NOT NULL THEN {earlier} END
                   AS earlier_values
            FROM moves m LEFT JOIN {incoming} p ON {p_m} AND p.kafka_topic = m.kafka_topic
                 AND p.kafka_partition = m.kafka_partition AND p.kafka_offset < m.kafka_offset
            ORDER BY m.kafka_topic, m.kafka_partition, m.kafka_offset, p.kafka_offset DESC NULLS LAST
        )
        INSERT INTO {moved} AS t (old_key, new_key, row_values, {trailer})
        SELECT b.old_key, b.kafka_new_key, coalesce(b.earlier_values, {current}),
               b.kafka_topic, b.kafka_partition, b.kafka_offset, b.kafka_timestamp, b.batch_id
        FROM before_move b LEFT JOIN {output} o ON {o_b}
        WHERE CASE WHEN b.earlier_offset IS NOT NULL THEN NOT b.earlier_deleted AND b.earlier_lacks IS NULL
                   ELSE o.kafka_offset IS NOT NULL AND NOT {o_supersedes_b} END
        ON CONFLICT (old_key, new_key) DO UPDATE SET row_values = excluded.row_values, {updates}
        WHERE NOT t.settled AND {excluded_supersedes_t}
          AND (excluded.kafka_topic, excluded.kafka_partition, excluded.kafka_offset)
              <> (t.kafka_topic, t.kafka_partition, t.kafka_offset)
        """
    ).format(incoming=INCOMING, key=key, moved=moved_table(pipeline), trailer=trailer, output=output_table(pipeline),
             old_key=_key_object(pipeline, "m"), earlier=_row_object(pipeline, "p"), current=_row_object(pipeline, "o"),
             p_m=_same_key("p", "m", pipeline), o_b=_same_key("o", "b", pipeline),
             o_supersedes_b=_supersedes("o", "b"), excluded_supersedes_t=_supersedes("excluded", "t"),
             updates=sql.SQL(", ").join(sql.SQL("{0} = excluded.{0}").format(sql.Identifier(name))
                                        for name in names(OUTPUT_TRAILER)))


def fill_from_moved(pipeline: PipelineConfig, column: ColumnSpec) -> sql.Composed:
    """Fill `column` where the create of a primary-key change lacks it: from the row the change moved."""
    return sql.SQL(
        """
        UPDATE {incoming} i SET {filled}
        FROM (SELECT m.old_key, m.new_key, (jsonb_populate_record(NULL::{output}, m.row_values)).{col} AS value
              FROM {moved} m WHERE m.row_values IS NOT NULL AND NOT m.settled) AS found
        WHERE i.kafka_unavailable ? {name} AND i.kafka_old_key IS NOT NULL
          AND found.old_key = i.kafka_old_key AND found.new_key = {new_key}
        """
    ).format(incoming=INCOMING, output=output_table(pipeline), moved=moved_table(pipeline),
             col=sql.Identifier(column.name), name=sql.Literal(column.name), new_key=_key_object(pipeline, "i"),
             filled=_filled(column))


def dead_letter_lacking(pipeline: PipelineConfig, labels: dict[str, str]) -> sql.Composed:
    """Take the rows still lacking values out of the batch's incoming rows: each a dead letter saying which field and
    why (`labels`: each column's field, as reasons name it), unless the entity table or its tombstones already hold a
    newer record of the key (the record changes nothing then: a rewrite of older offsets). The incoming rows carry no
    raw record: the dead letters are written without their key and value, and return their coordinates for the
    commit to read them again from Kafka (batch/commit.py)."""
    named = sql.SQL(", ").join(sql.SQL("({}, {})").format(sql.Literal(name), sql.Literal(label))
                               for name, label in labels.items())
    reason = sql.SQL(
        """(SELECT string_agg(l.label, ', ' ORDER BY l.label)
              FROM jsonb_array_elements_text(f.kafka_unavailable) AS u(name) JOIN (VALUES {named}) AS l(name, label)
                   USING (name))
           || ' holds Debezium''s unavailable-value placeholder (a value the source did not log: unchanged and '
           || 'TOASTed), and no earlier value of the entity is known to keep: '
           || CASE WHEN f.kafka_old_key IS NOT NULL
                   THEN 'the event creates it by a primary-key change from ' || f.kafka_old_key::text
                        || ', and the row it moved had no known value of it either'
                   ELSE 'the entity table has no row of it' END
           || ' (with REPLICA IDENTITY FULL on the source table, Debezium sends such values)'"""
    ).format(named=named)
    failed = sql.SQL("WITH failed AS (DELETE FROM {} WHERE kafka_unavailable IS NOT NULL RETURNING *)").format(
        INCOMING)
    rows = sql.SQL(
        """
        SELECT %(pipeline)s, f.kafka_topic, f.kafka_partition, f.kafka_offset, f.kafka_timestamp, NULL::bytea,
               NULL::bytea, {reason}, f.batch_id
        FROM failed f
        WHERE NOT EXISTS (SELECT FROM {output} o WHERE {f_o} AND {o_supersedes_f})
          AND NOT EXISTS (SELECT FROM {tombstones} t WHERE {f_t} AND {t_supersedes_f})
        """
    ).format(reason=reason, output=output_table(pipeline), tombstones=tombstone_table(pipeline),
             f_o=_same_key("f", "o", pipeline), f_t=_same_key("f", "t", pipeline),
             o_supersedes_f=_supersedes("o", "f"), t_supersedes_f=_supersedes("t", "f"))
    return insert_dead_letters(sql.SQL("{} RETURNING {}").format(rows, sql.SQL(", ").join(
        sql.Identifier(n) for n in names(COORDINATES))), failed)


def unpark(pipeline: PipelineConfig) -> sql.Composed:
    """Take the parked rows back into the incoming rows (but those the batch read again: a rewrite), returning the
    coordinates of those taken back."""
    coordinates = sql.SQL(", ").join(sql.Identifier(n) for n in names(COORDINATES))
    return sql.SQL(
        """
        WITH unparked AS (DELETE FROM {parked} RETURNING *)
        INSERT INTO {incoming}
        SELECT (jsonb_populate_record(NULL::{incoming}, u.parked_row)).* FROM unparked u
        WHERE NOT EXISTS (SELECT FROM {incoming} i WHERE ({i_coordinates}) = ({u_coordinates}))
        RETURNING {coordinates}
        """
    ).format(parked=parked_table(pipeline), incoming=INCOMING, coordinates=coordinates,
             i_coordinates=sql.SQL(", ").join(sql.Identifier("i", n) for n in names(COORDINATES)),
             u_coordinates=sql.SQL(", ").join(sql.Identifier("u", n) for n in names(COORDINATES)))


def _waiting(pipeline: PipelineConfig) -> sql.Composed:
    """A WITH clause `waiting`: the coordinates of the incoming rows that wait for a primary-key change's delete: from
    the first create of a change that still lacks a value and whose delete has not been read (no moved row), every
    row of its key in its partition."""
    key = _key(pipeline)
    return sql.SQL(
        """
        WITH blocked AS (
            SELECT {x_key}, x.kafka_topic, x.kafka_partition, min(x.kafka_offset) AS from_offset
            FROM {incoming} x
            WHERE x.kafka_old_key IS NOT NULL AND x.kafka_unavailable IS NOT NULL
              AND NOT EXISTS (SELECT FROM {moved} m WHERE m.old_key = x.kafka_old_key AND m.new_key = {x_object})
            GROUP BY {x_key}, x.kafka_topic, x.kafka_partition
        ), waiting AS (
            SELECT r.kafka_topic, r.kafka_partition, r.kafka_offset
            FROM {incoming} r JOIN blocked w ON {r_w} AND r.kafka_topic = w.kafka_topic
                 AND r.kafka_partition = w.kafka_partition AND r.kafka_offset >= w.from_offset
        )
        """
    ).format(key=key, x_key=_key(pipeline, "x"), incoming=INCOMING, moved=moved_table(pipeline),
             x_object=_key_object(pipeline, "x"), r_w=_same_key("r", "w", pipeline))


def settle_moves(pipeline: PipelineConfig) -> list[sql.Composed]:
    """The moves the batch completes, in order: a create holding every value that was read before its delete leaves a
    settled mark (the delete then records nothing); one read after it forgets the moved row (the move is done); a
    delete that finds its create's mark removes it."""
    create = sql.SQL("i.kafka_old_key IS NOT NULL AND i.kafka_unavailable IS NULL")
    params = {"moved": moved_table(pipeline), "incoming": INCOMING, "i_object": _key_object(pipeline, "i"),
              "d_object": _key_object(pipeline, "d"), "create": create,
              "trailer": sql.SQL(", ").join(sql.Identifier(name) for name in names(OUTPUT_TRAILER)),
              "i_trailer": sql.SQL(", ").join(sql.Identifier("i", name) for name in names(OUTPUT_TRAILER))}
    return [sql.SQL(
        """
        INSERT INTO {moved} (old_key, new_key, row_values, settled, {trailer})
        SELECT i.kafka_old_key, {i_object}, NULL, true, {i_trailer} FROM {incoming} i WHERE {create}
        ON CONFLICT (old_key, new_key) DO NOTHING
        """).format(**params), sql.SQL(
        """
        DELETE FROM {moved} m USING {incoming} i
        WHERE {create} AND NOT m.settled AND m.old_key = i.kafka_old_key AND m.new_key = {i_object}
        """).format(**params), sql.SQL(
        """
        DELETE FROM {moved} m USING {incoming} d
        WHERE d.kafka_tombstone AND d.kafka_new_key IS NOT NULL AND m.settled AND m.old_key = {d_object}
          AND m.new_key = d.kafka_new_key
        """).format(**params)]


def record_unknown_moves(pipeline: PipelineConfig) -> sql.Composed:
    """Record the batch's primary-key change deletes that found no row to record (its latest earlier row lacked a
    value no one had, or there was none): their creates then know there is nothing to wait for. Not those waiting."""
    trailer = sql.SQL(", ").join(sql.Identifier(name) for name in names(OUTPUT_TRAILER))
    return sql.SQL(
        """
        {waiting}
        INSERT INTO {moved} (old_key, new_key, row_values, {trailer})
        SELECT {d_object}, d.kafka_new_key, NULL, {d_trailer}
        FROM {incoming} d
        WHERE d.kafka_tombstone AND d.kafka_new_key IS NOT NULL AND ({d_key}) IS NOT NULL
          AND (d.kafka_topic, d.kafka_partition, d.kafka_offset) NOT IN (SELECT * FROM waiting)
        ON CONFLICT (old_key, new_key) DO NOTHING
        """
    ).format(waiting=_waiting(pipeline), moved=moved_table(pipeline), trailer=trailer, incoming=INCOMING,
             d_object=_key_object(pipeline, "d"), d_key=_key(pipeline, "d"),
             d_trailer=sql.SQL(", ").join(sql.Identifier("d", name) for name in names(OUTPUT_TRAILER)))


def park_waiting(pipeline: PipelineConfig) -> sql.Composed:
    """Move the rows that wait for a primary-key change's delete from the incoming rows to the parked ones."""
    coordinates = sql.SQL(", ").join(sql.Identifier(n) for n in names(COORDINATES))
    return sql.SQL(
        """
        {waiting}, gone AS (
            DELETE FROM {incoming} i USING waiting w
            WHERE (i.kafka_topic, i.kafka_partition, i.kafka_offset)
                  = (w.kafka_topic, w.kafka_partition, w.kafka_offset)
            RETURNING i.*
        )
        INSERT INTO {parked} ({coordinates}, batch_id, parked_row)
        SELECT {g_coordinates}, g.batch_id, to_jsonb(g) FROM gone g
        """
    ).format(waiting=_waiting(pipeline), incoming=INCOMING, parked=parked_table(pipeline), coordinates=coordinates,
             g_coordinates=sql.SQL(", ").join(sql.Identifier("g", n) for n in names(COORDINATES)))
