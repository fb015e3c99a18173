"""Confluent's wire format, as its serializers write a value: a magic byte 0, the schema's id in 4 big-endian bytes,
then the payload (a JSON document from its JSON Schema serializer, Avro from its Avro serializer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

HEADER_BYTES = 5
NOT_FRAMED = "value is not in Confluent's wire format (a magic byte 0 and a 4-byte schema id before the payload)"
# The same of a record's Kafka key (keys in a registry format: protobuf.py's key_format).
KEY_NOT_FRAMED = NOT_FRAMED.replace("value", "the Kafka key", 1)


def is_framed(value: Column) -> Column:
    """Whether the bytes begin with the frame: at least its 5 bytes, the first of them 0."""
    from pyspark.sql import functions as F

    return (F.length(value) >= HEADER_BYTES) & (F.hex(value.substr(1, 1)) == F.lit("00"))


def payload(value: Column) -> Column:
    """The bytes after the frame; NULL when they are not framed."""
    from pyspark.sql import functions as F

    return F.when(is_framed(value), value.substr(F.lit(HEADER_BYTES + 1), F.length(value) - HEADER_BYTES))
