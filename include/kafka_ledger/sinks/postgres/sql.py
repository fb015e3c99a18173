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
    ledger_columns,
    offsets_within_ranges,
    staging_table,
)
from kafka_ledger.model.columns import COORDINATES, OUTPUT_TRAILER, TOMBSTONE, names

if TYPE_CHECKING:
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
    """The sink's tables in the ledger's database: the output table and an entity table's tombstones."""
    return sql.SQL("DROP TABLE IF EXISTS {}, {}").format(output_table(pipeline), tombstone_table(pipeline))


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
    """Copy one attempt's decoded rows (`columns`) from staging into `target`."""
    listed = sql.SQL(", ").join(sql.Identifier(name) for name in columns)
    return sql.SQL(
        """
        INSERT INTO {target} ({columns})
        SELECT {columns} FROM {staging}
        WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s AND error IS NULL
        """
    ).format(target=target, staging=staging_table(pipeline), columns=listed)


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


def create_incoming_table(pipeline: PipelineConfig) -> sql.Composed:
    """A batch's rows on their way into an entity table: the published columns, gone when the transaction ends."""
    return sql.SQL("CREATE TEMP TABLE {table} ({columns}) ON COMMIT DROP").format(
        table=INCOMING,
        columns=sql.SQL(", ").join(declared_columns(pipeline) + ledger_columns((*OUTPUT_TRAILER, TOMBSTONE))))


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
