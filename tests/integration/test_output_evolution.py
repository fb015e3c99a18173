"""A pipeline's declared columns change while it runs: a column added or widened appears in the output table in the
commit that publishes its first rows (not at the plan, not after a failed commit); a change that would lose data is
refused at the plan, naming the deliberate way."""

from __future__ import annotations

import pytest
from integration_support import declared, good_value, pipeline_name, query

from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.pipeline import ConfigError, PipelineConfig, get_pipeline
from kafka_ledger.config.settings import services_for
from kafka_ledger.runtimes import run_batch

pytestmark = pytest.mark.integration


def table_columns(dsn: str, pipeline: PipelineConfig) -> dict[str, str]:
    return dict(query(dsn, "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                           "AND table_name = %s AND column_name NOT LIKE 'kafka%%' AND column_name <> 'batch_id'",
                      pipeline.output_schema, pipeline.output_table))


def test_added_and_widened_columns_appear_with_their_first_rows_and_lossy_changes_are_refused(
        dsn, servers, pipeline_factory, producer, monkeypatch):
    pipeline_factory("schema_change", partitions=1)
    services = services_for(dsn, servers)
    first = declared(get_pipeline(pipeline_name("schema_change")), [
        {"name": "event_id", "type": "string", "required": True}, {"name": "amount", "type": "int"}])
    topic = first.topics[0]
    table = first.qualified_output_table
    producer.send(topic, [good_value(i) for i in range(5)])
    run_batch(first, plan_next_batch(services, first).batch_id, services)
    assert table_columns(dsn, first) == {"event_id": "text", "amount": "integer"}

    # A column added and one widened: planned, the table is as it was; a commit that fails after its ALTERs leaves
    # it so too; the commit that publishes the batch changes it with its rows.
    second = declared(first, [{"name": "event_id", "type": "string", "required": True},
                              {"name": "amount", "type": "long"}, {"name": "price", "type": "double"}])
    producer.send(topic, [good_value(i) for i in range(5, 9)])
    planned = plan_next_batch(services, second)
    assert table_columns(dsn, second) == {"event_id": "text", "amount": "integer"}
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "commit_after_evolve=raise")
    with pytest.raises(Exception, match="commit_after_evolve"):
        run_batch(second, planned.batch_id, services)
    assert table_columns(dsn, second) == {"event_id": "text", "amount": "integer"}
    monkeypatch.delenv("KAFKA_LEDGER_FAILPOINTS")
    run_batch(second, plan_next_batch(services, second).batch_id, services)
    assert table_columns(dsn, second) == {"event_id": "text", "amount": "bigint", "price": "double precision"}
    rows = query(dsn, f"SELECT event_id, amount, price FROM {table} ORDER BY kafka_offset")
    assert rows == [*((f"e{i}", i, None) for i in range(5)), *((f"e{i}", i, i / 4) for i in range(5, 9))]
    assert query(dsn, "SELECT name, type, batch_id IS NULL FROM kafka_ledger.output_columns WHERE pipeline = %s "
                      "ORDER BY name", second.name) == [
        ("amount", "bigint", False), ("event_id", "text", True), ("price", "double precision", False)]

    # Changes that would lose data: refused at the plan, nothing planned.
    producer.send(topic, [good_value(9)])
    narrower = declared(second, [{"name": "event_id", "type": "string", "required": True},
                                 {"name": "amount", "type": "int"}, {"name": "price", "type": "double"}])
    with pytest.raises(ConfigError, match=f"column amount is bigint in {table} but declared int"):
        plan_next_batch(services, narrower)
    without_price = declared(second, [{"name": "event_id", "type": "string", "required": True},
                                      {"name": "amount", "type": "long"}])
    with pytest.raises(ConfigError, match=rf"column price of {table} is no longer declared.*DROP COLUMN price"):
        plan_next_batch(services, without_price)
    # Dropped deliberately, it is forgotten: the pipeline goes on without it.
    query(dsn, f"ALTER TABLE {table} DROP COLUMN price")
    run_batch(without_price, plan_next_batch(services, without_price).batch_id, services)
    assert query(dsn, f"SELECT event_id, amount FROM {table} ORDER BY kafka_offset")[-1] == ("e9", 9)
