"""The checks that do not depend on the wire format: a kind's own rules, required fields, unexpected fields.

Each gives a reason (a Spark expression, NULL when the record passes) in the words every format shares, so that a
record refused for the same cause gets the same reason whatever its format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

    from kafka_ledger.formats.base import FieldRead


def value_problems(read: FieldRead) -> list[Column]:
    """What the column's kind refuses to store (a NUL character in Postgres text or jsonb, ...)."""
    return read.column.type.value_problems(read.value, read.column.label)


def required(read: FieldRead) -> Column | None:
    """A required column whose field is missing or null."""
    from pyspark.sql import functions as F

    if not read.column.required:
        return None
    return F.when(read.value.isNull(), F.lit(read.column.required_reason))


def unexpected_fields(unexpected: Column) -> Column:
    """Fields of the record no column reads (extra_fields: dead_letter), named in the reason."""
    from pyspark.sql import functions as F

    return F.when(F.size(unexpected) > 0,
                  F.concat(F.lit("unexpected field(s): "), F.array_join(F.array_sort(unexpected), ", ")))


def no_unexpected_fields(unexpected: Column) -> Column:
    """The cheap form of `unexpected_fields`: true when there are none."""
    from pyspark.sql import functions as F

    return F.size(unexpected) == 0


def every(checks: list[Column]) -> Column:
    """All the checks true, as a balanced tree of ANDs: a chain of hundreds (a wide table's cheap checks) nests deeper
    than Spark Connect's plans may (its protobuf decoder stops at a depth of 100)."""
    return _balanced(checks, lambda a, b: a & b)


def some(checks: list[Column]) -> Column:
    """Any of the checks true, as a balanced tree of ORs (see `every`)."""
    return _balanced(checks, lambda a, b: a | b)


def _balanced(checks: list[Column], join: Callable[[Column, Column], Column]) -> Column:
    while len(checks) > 1:
        checks = [join(checks[i], checks[i + 1]) if i + 1 < len(checks) else checks[i]
                  for i in range(0, len(checks), 2)]
    return checks[0]
