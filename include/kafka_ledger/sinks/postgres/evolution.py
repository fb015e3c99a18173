"""What a change of a pipeline's declared columns does to its existing Postgres output table: columns to add and
columns to widen, both in the commit's transaction (so that a reader sees a new column exactly when the first rows
that fill it), or a refusal naming the deliberate way when the change would lose data."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafka_ledger.model.kinds import DecimalKind, IntKind, LongKind

if TYPE_CHECKING:
    from kafka_ledger.config.pipeline import ColumnSpec, PipelineConfig
    from kafka_ledger.model.kinds import ColumnKind

# The names Postgres's format_type() gives the kinds' types where they differ from the kinds' own; a time or timestamp
# without time zone is named so, its precision after its name (`timestamp(3) without time zone`).
_CATALOG_NAMES = {"timestamptz": "timestamp with time zone"}
_WITHOUT_ZONE = re.compile(r"^(timestamp|time)(\(\d+\))?$")
_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
# Digits before the point a column of each integer type needs.
_INTEGER_DIGITS = {"smallint": 5, "integer": 10, "bigint": 19}


def catalog_type(kind: ColumnKind) -> str:
    """The kind's Postgres type as the catalog names it."""
    if _WITHOUT_ZONE.match(kind.postgres_type):
        return f"{kind.postgres_type} without time zone"
    return _CATALOG_NAMES.get(kind.postgres_type, kind.postgres_type)


def widens(table_type: str, kind: ColumnKind) -> bool:
    """Whether a column of `table_type` can become the kind's type with every value it holds kept exactly."""
    target = catalog_type(kind)
    if isinstance(kind, IntKind | LongKind):
        order = ["smallint", "integer", "bigint"]
        return table_type in order and order.index(table_type) < order.index(target)
    if isinstance(kind, DecimalKind):
        integer_digits = kind.precision - kind.scale
        if table_type in _INTEGER_DIGITS:
            return integer_digits >= _INTEGER_DIGITS[table_type]
        match = _NUMERIC.match(table_type)
        if match:
            precision, scale = int(match[1]), int(match[2])
            return integer_digits >= precision - scale and kind.scale >= scale and table_type != target
        return False
    return target == "double precision" and table_type == "real"


@dataclass(frozen=True)
class SchemaChanges:
    """The ALTERs that bring an output table to the declared columns: columns to add, columns to widen."""

    add: list[ColumnSpec] = field(default_factory=list)
    widen: list[tuple[ColumnSpec, str]] = field(default_factory=list)  # (the column, its type in the table now)

    def __bool__(self) -> bool:
        return bool(self.add or self.widen)

    def describe(self) -> str:
        return "; ".join([*(f"add {c.name} {catalog_type(c.type)}" for c in self.add),
                          *(f"widen {c.name} from {was} to {catalog_type(c.type)}" for c, was in self.widen)])


def schema_changes(pipeline: PipelineConfig, table: str, existing: dict[str, str], published: set[str]
                   ) -> SchemaChanges:
    """The changes the declared columns ask of `table`, whose columns are `existing` (name -> type) and of which the
    pipeline has published `published`; ValueError naming every change that would lose data, and how to make it
    deliberately."""
    problems: list[str] = []
    changes = SchemaChanges()
    for column in pipeline.columns:
        have = existing.get(column.name)
        if have is None:
            changes.add.append(column)
        elif have != catalog_type(column.type):
            if widens(have, column.type):
                changes.widen.append((column, have))
            else:
                problems.append(
                    f"column {column.name} is {have} in {table} but declared {column.type} "
                    f"({catalog_type(column.type)}): changing it could lose or alter values. Declare it as the table "
                    f"has it, or change the table deliberately first (ALTER TABLE {table} ALTER COLUMN {column.name} "
                    f"TYPE {catalog_type(column.type)} USING ..., when every value converts), or publish into a new "
                    "table")
    declared = {c.name for c in pipeline.columns}
    for name in sorted(published - declared):
        if name in existing:
            problems.append(
                f"column {name} of {table} is no longer declared: the pipeline published it, and new rows would "
                f"hold NULL there. Declare it again, or drop it deliberately first (ALTER TABLE {table} DROP COLUMN "
                f"{name}: its values go with it)")
    if problems:
        raise ValueError(f"pipeline {pipeline.name!r}: " + "; ".join(problems))
    return changes
