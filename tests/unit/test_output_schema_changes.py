"""A declaration's changes to an existing Postgres output table: what is added or widened by the commit, and what
is refused because it would lose data."""

from __future__ import annotations

import json

import pytest

from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.model.kinds import parse_kind
from kafka_ledger.sinks.postgres.evolution import catalog_type, schema_changes, widens

TABLE = "public.orders"


def pipeline(*columns: tuple[str, str]):
    return parse_pipelines(json.dumps({"pipelines": {"p": {"topics": ["t"], "output_table": "orders", "columns": [
        {"name": name, "type": kind} for name, kind in columns]}}}))["p"]


@pytest.mark.parametrize(("table_type", "declared", "widened"), [
    ("integer", "long", True), ("smallint", "int", True), ("bigint", "int", False), ("bigint", "long", False),
    ("integer", "decimal(12,2)", True), ("bigint", "decimal(18,0)", False), ("bigint", "decimal(21,2)", True),
    ("numeric(10,2)", "decimal(12,2)", True), ("numeric(10,2)", "decimal(12,4)", True),
    ("numeric(10,2)", "decimal(12,1)", False), ("numeric(10,2)", "decimal(10,3)", False),
    ("real", "double", True), ("text", "jsonb", False), ("date", "timestamp", False), ("bigint", "string", False),
])
def test_a_column_is_widened_only_when_every_value_it_holds_is_kept(table_type, declared, widened):
    assert widens(table_type, parse_kind(declared)) is widened


def test_the_catalog_names_a_timestamp_column_as_postgres_does():
    assert catalog_type(parse_kind("timestamp")) == "timestamp with time zone"
    assert catalog_type(parse_kind("decimal(12,2)")) == "numeric(12,2)"


def test_new_columns_are_added_and_narrower_ones_widened():
    p = pipeline(("id", "string"), ("amount", "long"), ("note", "string"))
    changes = schema_changes(p, TABLE, {"id": "text", "amount": "integer", "kafka_offset": "bigint"}, {"id"})
    assert [c.name for c in changes.add] == ["note"]
    assert [(c.name, was) for c, was in changes.widen] == [("amount", "integer")]
    assert changes.describe() == "add note text; widen amount from integer to bigint"
    assert not schema_changes(p, TABLE, {"id": "text", "amount": "bigint", "note": "text"}, {"id", "amount"})


def test_a_change_that_would_lose_data_is_refused_naming_the_deliberate_way():
    p = pipeline(("id", "string"), ("amount", "int"))
    with pytest.raises(ValueError) as refused:
        schema_changes(p, TABLE, {"id": "text", "amount": "bigint", "city": "text"}, {"id", "amount", "city"})
    message = str(refused.value)
    assert "column amount is bigint in public.orders but declared int (integer)" in message
    assert "ALTER TABLE public.orders ALTER COLUMN amount TYPE integer USING" in message
    assert "column city of public.orders is no longer declared" in message
    assert "ALTER TABLE public.orders DROP COLUMN city" in message
    # A column the table has but the pipeline never published (made by hand, with a default) is left alone.
    assert not schema_changes(p, TABLE, {"id": "text", "amount": "integer", "loaded_at": "timestamp"}, {"id"})
