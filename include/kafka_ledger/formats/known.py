"""The value formats a declaration may name, by name: one module under formats/ each."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka_ledger.formats.avro import AvroFormat
from kafka_ledger.formats.base import ValueFormat
from kafka_ledger.formats.json import JsonFormat
from kafka_ledger.formats.protobuf import ProtobufFormat

if TYPE_CHECKING:
    from kafka_ledger.formats.base import DeclaredPipeline, DeclaredValue

FORMATS: dict[str, ValueFormat] = {fmt.name: fmt for fmt in (JsonFormat(), AvroFormat(), ProtobufFormat())}


def format_named(name: str) -> ValueFormat:
    """The format of that name, or ValueError listing the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown value format {name!r}: one of {', '.join(FORMATS)}") from None


def value_problems(value: DeclaredValue) -> list[str]:
    """Why a declaration's `value:` does not fit its format: an option of another format, or the format's own
    refusals."""
    fmt = format_named(value.format)
    problems = []
    for option in sorted(value.given() - fmt.options):
        takers = " or ".join(f.name for f in FORMATS.values() if option in f.options)
        problems.append(f"{option} applies to format {takers}, not {fmt.name}")
    return problems + fmt.value_problems(value)


def value_format(pipeline: DeclaredPipeline) -> ValueFormat:
    """The pipeline's wire format, as its `value` declares (unbound: a batch's read binds a registry format)."""
    return FORMATS[pipeline.value.format]


def for_schema_type(schema_type: str) -> ValueFormat:
    """The registry format of a registered schema's type (`AVRO`, ...), or ValueError."""
    found = [fmt for fmt in FORMATS.values() if fmt.uses_registry and fmt.name.upper() == (schema_type or "AVRO")]
    if not found:
        raise ValueError(f"no value format reads {schema_type} schemas")
    return found[0]
