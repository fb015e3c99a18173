"""Where a column's bytes are, whatever the format: the record's value, its Kafka key, or one of its headers; and a
column of a whole key or header, read from its bytes (as its kind says: most kinds from their text)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka_ledger.formats.base import FieldRead

if TYPE_CHECKING:
    from pyspark.sql import Column

    from kafka_ledger.formats.base import DeclaredColumn


def source_bytes(source: str) -> Column:
    """A source's bytes: the value, the key, or the first header of that name (`header:<name>`)."""
    from pyspark.sql import functions as F

    if source in ("value", "key"):
        return F.col(source)
    name = source.partition(":")[2]
    matching = F.filter(F.col("headers"), lambda header: header["key"] == F.lit(name))
    return F.try_element_at(matching, F.lit(1))["value"]


def whole_source(column: DeclaredColumn) -> FieldRead:
    """A column of the whole Kafka key or header, read from its bytes as the column's kind reads them."""
    read = column.type.from_bytes(source_bytes(column.source), column, column.label)
    return FieldRead(column, read.value, [read.problem])
