"""SQL builders: output and staging table DDL, publish statement; rendered without a database connection."""

import re

import pytest
from psycopg2 import sql as pgsql

from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.ledger import sql
from kafka_ledger.model.columns import TOMBSTONE
from kafka_ledger.sinks import sink_for
from kafka_ledger.sinks.postgres import sql as sink_sql

PIPELINE_YAML = """
pipelines:
  clicks:
    topics: [clicks]
    output_table: click_events
    output_schema: analytics
    columns:
      - {name: click_id, type: string, required: true}
      - {name: campaign_id, type: long}
      - {name: slot, type: int}
      - {name: price, type: double}
      - {name: converted, type: boolean}
      - {name: event_time, type: timestamp}
"""


@pytest.fixture
def pipeline():
    return parse_pipelines(PIPELINE_YAML)["clicks"]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def render(node) -> str:
    """psycopg2's as_string() needs a connection; walk the composable instead (enough for these builders)."""
    if isinstance(node, pgsql.Composed):
        return "".join(render(part) for part in node.seq)
    if isinstance(node, pgsql.SQL):
        return node.string
    if isinstance(node, pgsql.Identifier):
        return ".".join(quote_ident(s) for s in node.strings)
    if isinstance(node, pgsql.Placeholder):
        return f"%({node.name})s" if node.name else "%s"
    raise TypeError(f"cannot render {node!r} without a connection")


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_render_helper_matches_quoting_rules():
    composed = pgsql.SQL("SELECT {} FROM {}").format(pgsql.Identifier('we"ird'), pgsql.Identifier("s", "t"))
    assert render(composed) == 'SELECT "we""ird" FROM "s"."t"'


def test_output_and_staging_table_identifiers(pipeline):
    assert render(sink_sql.output_table(pipeline)) == '"analytics"."click_events"'
    assert render(sql.staging_table(pipeline)) == f'"{sql.STAGING_SCHEMA}"."clicks"'


def test_create_output_table_has_declared_columns_with_postgres_types(pipeline):
    ddl = normalise(render(sink_sql.create_output_table(pipeline, entity=False)))
    # The schema is the sink's to create first (sinks/postgres/sink.ensure_schema: safe against a racing creation).
    assert ddl.startswith('CREATE TABLE IF NOT EXISTS "analytics"."click_events" (')
    expected_columns = ", ".join(f'"{c.name}" {c.type.postgres_type}' for c in pipeline.columns)
    assert (
        '"click_id" text, "campaign_id" bigint, "slot" integer, "price" double precision, '
        '"converted" boolean, "event_time" timestamptz'
    ) == expected_columns
    assert f'"analytics"."click_events" ( {expected_columns}, kafka_topic text NOT NULL,' in ddl


def test_create_output_table_has_kafka_coordinates_and_primary_key(pipeline):
    ddl = normalise(render(sink_sql.create_output_table(pipeline, entity=False)))
    for column in (
        "kafka_topic text NOT NULL",
        "kafka_partition integer NOT NULL",
        "kafka_offset bigint NOT NULL",
        "kafka_timestamp timestamptz",
        "batch_id bigint NOT NULL",
    ):
        assert column in ddl
    assert ddl.endswith("PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset) )")


def test_create_staging_table_has_batch_attempt_raw_record_and_declared_columns(pipeline):
    ddl = normalise(render(sql.create_staging_table(pipeline, ())))
    assert ddl.startswith(f'CREATE TABLE IF NOT EXISTS "{sql.STAGING_SCHEMA}"."clicks" (')
    for column in (
        "batch_id bigint NOT NULL",
        "attempt integer NOT NULL",
        "kafka_topic text NOT NULL",
        "kafka_partition integer NOT NULL",
        "kafka_offset bigint NOT NULL",
        "kafka_timestamp timestamptz",
        "kafka_key bytea",
        "kafka_value bytea",
        "error text",
    ):
        assert column in ddl
    for c in pipeline.columns:
        assert f'"{c.name}" {c.type.postgres_type}' in ddl
    assert "PRIMARY KEY" not in ddl  # attempts of a batch may stage the same offsets
    assert ddl.endswith(
        f'CREATE INDEX IF NOT EXISTS "clicks$batch_attempt" ON "{sql.STAGING_SCHEMA}"."clicks" (batch_id, attempt)'
    )


def test_drop_staging_table(pipeline):
    assert render(sql.drop_staging_table(pipeline)) == f'DROP TABLE IF EXISTS "{sql.STAGING_SCHEMA}"."clicks"'


def test_publish_output_copies_only_decoded_rows_of_one_batch_attempt(pipeline):
    statement = normalise(render(sink_sql.publish_staged(pipeline, sink_sql.output_table(pipeline),
                                                         list(sink_for(pipeline).published_columns()))))
    columns = (
        '"click_id", "campaign_id", "slot", "price", "converted", "event_time", '
        '"kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "batch_id"'
    )
    assert statement == (
        f'INSERT INTO "analytics"."click_events" ({columns}) '
        f'SELECT {columns} FROM "{sql.STAGING_SCHEMA}"."clicks" '
        "WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s AND error IS NULL"
    )


def test_staging_statements_are_scoped_to_batch_and_attempt(pipeline):
    staging = sql.staging_table(pipeline)
    dead = normalise(render(sql.INSERT_DEAD_LETTERS.format(staging=staging)))
    assert dead.endswith(
        f'FROM "{sql.STAGING_SCHEMA}"."clicks" '
        "WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s AND error IS NOT NULL"
    )
    read_stats = normalise(render(sql.STAGED_READ_STATS.format(staging=staging)))
    assert "WHERE batch_id = %(batch_id)s AND attempt = %(attempt)s GROUP BY kafka_topic, kafka_partition" in read_stats
    older = render(sql.DELETE_OLDER_STAGED.format(staging=staging))
    assert older == (
        f'DELETE FROM "{sql.STAGING_SCHEMA}"."clicks" WHERE batch_id = %(batch_id)s AND attempt < %(attempt)s'
    )


def test_position_advance_is_compare_and_set():
    # A latest_only batch starts where its skipped stretch starts.
    assert "p.position = coalesce(r.skipped_from, r.from_offset)" in normalise(sql.ADVANCE_POSITIONS)
    assert "attempts = %(attempt)s AND status = 'planned'" in normalise(sql.MARK_WRITTEN)


def test_at_least_once_output_table_has_an_index_but_no_unique_key():
    pipeline = parse_pipelines(
        "pipelines:\n  clicks:\n    topics: [clicks]\n    output_table: clicks\n    delivery_mode: at_least_once\n"
        "    columns: [{name: click_id, type: string}]\n"
    )["clicks"]
    text = normalise(render(sink_sql.create_output_table(pipeline, entity=False)))
    assert "PRIMARY KEY" not in text
    assert 'CREATE INDEX IF NOT EXISTS "clicks$kafka_record" ON "public"."clicks" (kafka_topic, kafka_partition, ' \
           "kafka_offset)" in text


def test_replace_deletes_exactly_the_batch_ranges_in_one_statement(pipeline):
    from kafka_ledger.model.ranges import OffsetRange

    # Each range looked up in the key's btree (a lateral sub-select the planner cannot flatten into a hash join that
    # reads the whole table), its rows deleted by row id.
    text = normalise(render(sink_sql.delete_output_ranges(pipeline)))
    assert text.startswith('DELETE FROM "analytics"."click_events" WHERE ctid = ANY (ARRAY( SELECT found.ctid FROM '
                           "unnest(%(topics)s::text[], ")
    assert text.endswith('CROSS JOIN LATERAL ( SELECT t.ctid FROM "analytics"."click_events" t '
                         "WHERE t.kafka_topic = r.topic AND t.kafka_partition = r.partition "
                         "AND t.kafka_offset >= r.from_offset AND t.kafka_offset < r.until_offset OFFSET 0) found))")
    dead = normalise(render(sql.DELETE_DEAD_LETTER_RANGES))
    assert dead.startswith("DELETE FROM kafka_ledger.dead_letters WHERE ctid = ANY")
    assert "WHERE t.pipeline = %(pipeline)s AND t.kafka_topic = r.topic" in dead and dead.endswith("OFFSET 0) found))")
    assert sql.ranges_params([OffsetRange("a", 0, 5, 9), OffsetRange("b", 3, 0, 1)]) == {
        "topics": ["a", "b"], "partitions": [0, 3], "from_offsets": [5, 0], "until_offsets": [9, 1]}


ENTITY_YAML = """
pipelines:
  users:
    topics: [users]
    output_table: users
    write: upsert
    key: [tenant, user_id]
    columns:
      - {name: tenant, type: string}
      - {name: user_id, type: long}
      - {name: name, type: string}
"""


@pytest.fixture
def entity_pipeline():
    return parse_pipelines(ENTITY_YAML)["users"]


def test_an_entity_table_is_keyed_by_its_key_and_its_rows_arrive_with_the_tombstone_flag(entity_pipeline):
    ddl = normalise(render(sink_sql.create_output_table(entity_pipeline, entity=True)))
    assert 'PRIMARY KEY ("tenant", "user_id")' in ddl and "PRIMARY KEY (kafka_topic" not in ddl
    sink = sink_for(entity_pipeline)
    assert list(sink.published_columns()) == [*sink.output_columns(), "kafka_tombstone"]
    assert sql.staging_columns(entity_pipeline, sink.staged_extra())[-1] == "kafka_tombstone"
    assert sink.staged_extra() == (TOMBSTONE,)
    tombstones = normalise(render(sink_sql.create_tombstone_table(entity_pipeline)))
    assert f'"{sink_sql.TOMBSTONES_SCHEMA}"."users"' in tombstones and 'PRIMARY KEY ("tenant", "user_id")' in tombstones


def test_every_merge_statement_keeps_only_what_supersedes_by_the_one_rule(entity_pipeline):
    statements = dict(sink_sql.merge_entities(entity_pipeline))
    assert list(statements) == ["newest", "revived", "upserted", "deleted", "buried"]
    for name in ("revived", "upserted", "deleted", "buried"):
        assert "kafka_ledger.supersedes(" in render(statements[name])
    newest = normalise(render(statements["newest"]))
    # The newest of a batch: the highest offset per partition, then the rule's order across partitions.
    assert 'ORDER BY "tenant", "user_id", kafka_topic, kafka_partition, kafka_offset DESC' in newest
    assert "coalesce(kafka_timestamp, '-infinity') DESC, kafka_topic DESC, kafka_partition DESC" in newest


def test_an_append_pipeline_publishes_straight_into_its_table(pipeline):
    sink = sink_for(pipeline)
    assert sink.published_columns() == sink.output_columns() and sink.staged_extra() == ()
    copy = render(sink_sql.copy_rows(sink_sql.output_table(pipeline), list(sink.published_columns())))
    assert copy.startswith('COPY "analytics"."click_events" (')
