"""A carrier's pure decisions: its waves, its decode shapes, and the split of one frame's rows among its members."""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from kafka_ledger.batch import publish
from kafka_ledger.config.pipeline import PipelineConfig, parse_pipelines
from kafka_ledger.model.ranges import TopicPartition
from kafka_ledger.runtimes.connect.carrier import MEMBER, CarrierError, by_shape, in_waves, split_rows
from kafka_ledger.sinks import sink_for

COLUMNS = [{"name": "id", "type": "string", "required": True}, {"name": "amount", "type": "decimal(12,2)"}]


def declared(**entries: dict) -> dict[str, PipelineConfig]:
    pipelines = {name: {"topics": [f"{name}-topic"], "output_table": name, "columns": COLUMNS, **entry}
                 for name, entry in entries.items()}
    return parse_pipelines(yaml.safe_dump({"pipelines": pipelines}))


def shape(pipeline: PipelineConfig) -> str | None:
    return publish.decode_shape(pipeline, sink_for(pipeline))


def test_members_reading_one_partition_go_into_separate_waves_in_their_order():
    def tps(*names: str) -> set[TopicPartition]:
        return {TopicPartition(name[0], int(name[1:])) for name in names}

    reads = {"a": tps("t0", "t1"), "b": tps("t1", "u0"), "c": tps("u1"), "d": tps("t0"), "e": tps("v0")}
    assert in_waves(list(reads), reads.__getitem__) == [["a", "c", "e"], ["b", "d"]]
    assert in_waves([], reads.__getitem__) == []


def test_every_declared_field_either_shapes_the_decode_or_does_not():
    fields = set(PipelineConfig.model_fields)
    assert not publish.DECODING_FIELDS & publish.NOT_DECODING_FIELDS
    assert publish.DECODING_FIELDS | publish.NOT_DECODING_FIELDS == fields, (
        "place each new field of PipelineConfig in publish.DECODING_FIELDS or NOT_DECODING_FIELDS")


def test_pipelines_decode_together_only_when_all_that_decodes_them_is_alike():
    pipelines = declared(
        a={}, b={"max_records_per_partition": 5, "output_schema": "other", "retries": 0},
        c={"extra_fields": "dead_letter"},
        d={"columns": [*COLUMNS[:1], {"name": "amount", "type": "decimal(14,2)"}]},
        e={"write": "upsert", "key": ["id"]},
        f={"value": {"format": "json", "framing": "confluent"}},
    )
    shapes = {name: shape(p) for name, p in pipelines.items()}
    assert shapes["a"] == shapes["b"]
    assert len({shapes[name] for name in "acdef"}) == 5
    # A batch bound to a format of its own (an Avro batch's schemas) is decoded alone.
    assert publish.decode_shape(pipelines["a"], sink_for(pipelines["a"]), fmt=object()) is None  # type: ignore[arg-type]
    groups = by_shape(["a", "b", "c", "x", "y"], lambda n: None if n in "xy" else shapes["a" if n == "b" else n])
    assert groups == [["a", "b"], ["c"], ["x"], ["y"]]


def _frame(members: list[int | None]) -> pa.Table:
    return pa.table({"kafka_offset": pa.array(range(len(members)), pa.int64()), MEMBER: pa.array(members, pa.int32())})


def test_a_frames_rows_split_among_its_members_each_row_once():
    split = split_rows([_frame([0, 1, 0]), _frame([]), _frame([2, 0])], 4)
    assert [[row for t in tables for row in t.column("kafka_offset").to_pylist()] for tables in split] == [
        [0, 2, 1], [1], [0], []]
    assert split_rows([], 2) == [[], []]


def test_a_row_of_no_member_fails_the_split():
    with pytest.raises(CarrierError, match="1 of 3 rows read belong to no member's batch"):
        split_rows([_frame([0, None, 1])], 2)
