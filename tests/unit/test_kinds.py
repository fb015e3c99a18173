"""Column kinds: every kind answers every target, decimals are parameterised, and declarations read back."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from kafka_ledger.model import kinds
from kafka_ledger.model.kinds import DECLARABLE, SIMPLE_KINDS, ColumnKind, DecimalKind, parse_kind

EVERY_KIND = [*SIMPLE_KINDS.values(), DecimalKind(18, 2), DecimalKind(38, 0), DecimalKind(1, 1),
              kinds.LocalTimestampKind(3), kinds.TimeKind(0)]


def _every_kind_class() -> set[type[ColumnKind]]:
    found, todo = set(), [ColumnKind]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if not getattr(sub, "__abstractmethods__", None):
                found.add(sub)
    return found


def test_every_kind_class_is_declarable_and_tested_here():
    assert _every_kind_class() == {type(k) for k in EVERY_KIND}


@pytest.mark.parametrize("kind", EVERY_KIND, ids=str)
def test_every_kind_has_a_type_in_every_target(kind):
    from pyiceberg.types import IcebergType

    assert kind.postgres_type and isinstance(kind.postgres_type, str)
    assert isinstance(kind.spark_type(), T.DataType)
    assert isinstance(kind.arrow_type(), pa.DataType)
    assert isinstance(kind.iceberg_type(), IcebergType)
    field = pa.field("c", kind.arrow_type())
    encoder = kind.copy_encoder(field)
    import pgpq

    built = pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(
        pa.schema([field]), {"c": encoder or pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(field)})
    assert built.schema() is not None  # pgpq can write the kind's Arrow type as COPY binary


@pytest.mark.parametrize("kind", EVERY_KIND, ids=str)
def test_a_declared_kind_reads_back_as_itself(kind):
    assert parse_kind(kind.declared) == kind and hash(parse_kind(kind.declared)) == hash(kind)


def test_decimals_carry_their_precision_and_scale_everywhere():
    kind = parse_kind("decimal( 12 , 2 )")
    assert (kind.declared, kind.postgres_type) == ("decimal(12,2)", "numeric(12,2)")
    assert kind.spark_type() == T.DecimalType(12, 2) and kind.arrow_type() == pa.decimal128(12, 2)
    assert str(kind.iceberg_type()) == "decimal(12, 2)"
    assert kind != parse_kind("decimal(12,3)")
    for bad in ("decimal(0,0)", "decimal(39,2)", "decimal(4,5)"):
        with pytest.raises(ValueError):
            parse_kind(bad)


def test_only_exactly_comparable_kinds_can_name_an_entity():
    assert {str(k) for k in DECLARABLE if k.key_capable} == {"string", "long", "int", "uuid"}
    assert parse_kind("bytes") is kinds.BYTES and kinds.BYTES.postgres_type == "bytea"
    with pytest.raises(ValueError, match="unknown type 'blob': one of string, long, int, double, boolean, timestamp, "
                                         "local_timestamp, date, time, jsonb, uuid, bytes, interval, decimal"):
        parse_kind("blob")


def test_only_kinds_of_postgres_variable_length_values_may_hold_debeziums_placeholder():
    """Postgres TOASTs only variable-length values: an unchanged one's placeholder is looked for in these kinds."""
    assert {k.word for k in EVERY_KIND if k.toastable} == {"string", "jsonb", "bytes", "decimal"}


def test_jsonb_is_copied_as_jsonb_and_kept_as_text_elsewhere():
    assert kinds.JSONB.postgres_type == "jsonb" and kinds.JSONB.arrow_type() == pa.string()
    assert kinds.JSONB.copy_encoder(pa.field("j", pa.string())) is not None


def test_times_and_timestamps_without_a_zone_carry_their_precision():
    assert (parse_kind("local_timestamp").postgres_type, parse_kind("local_timestamp(3)").postgres_type) == (
        "timestamp", "timestamp(3)")
    assert (parse_kind("time").postgres_type, parse_kind("time(0)").declared) == ("time", "time(0)")
    assert parse_kind("time(3)") != parse_kind("time") and parse_kind("time(6)") == parse_kind("time")
    for bad in ("time(7)", "local_timestamp(9)"):
        with pytest.raises(ValueError, match="the precision .digits after the second. must be 0 to 6"):
            parse_kind(bad)
    # Spark has no time of day: microseconds past midnight, staged as bigint and made a time again.
    assert kinds.TIME.staging_type == "bigint" and kinds.TIME.from_staged('"t"') == (
        "time '00:00' + \"t\" * interval '1 microsecond'")


def test_a_uuid_travels_to_copy_as_its_16_bytes():
    values = pa.chunked_array([pa.array(["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", None])])
    assert kinds.UUID.copy_array(values).to_pylist() == [bytes.fromhex("a0eebc999c0b4ef8bb6d6bb9bd380a11"), None]
    assert kinds.TIME.copy_array(pa.chunked_array([pa.array([1_000_001], pa.int64())])).to_pylist()[0].isoformat() \
        == "00:00:01.000001"


def test_an_interval_travels_to_binary_copy_as_postgres_three_fields():
    import struct

    spans = pa.array(["P14M3DT14706.000007S", None, "P-1M2DT-10800.500000S", "P0M0DT0.000000S"])
    wire = kinds.INTERVAL.copy_array(spans)
    assert wire.type == pa.binary(16) and wire.null_count == 1
    fields = [None if v is None else struct.unpack(">qii", v) for v in wire.to_pylist()]
    assert fields == [(14706_000_007, 3, 14), None, (-10_800_500_000, 2, -1), (0, 0, 0)]
    assert kinds.INTERVAL.from_staged('"span"') == '"span"::interval'
