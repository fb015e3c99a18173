"""The value-format seam: a wire format turns Kafka records into the declared columns' values and its own reasons.

A format (one module each: json.py, ...) reads the record's value, and its Kafka key and headers where columns say so
(`source`, `path`), in two steps: `parse` adds what it parses once per record to the frame (one projection), then
`read` gives each declared column's value with the format's own problems, and the problems of the documents as a
whole. Checks that do not depend on the format (required fields, NUL in text, unexpected fields, a kind's own rules)
are validate.py's; decode.py puts them together into (decoded columns, reason).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from kafka_ledger.config.pipeline import ColumnSpec, PipelineConfig


@dataclass(frozen=True)
class FieldRead:
    """One declared column as its format read it: the value (NULL when absent or unreadable), the format's reasons
    why it cannot be published (each NULL when it can; the first non-NULL wins), and `cheap_ok`, a cheap expression
    true only when every one of those reasons is NULL (the lean path's proof; None: check the reasons themselves),
    and `raw_text`."""

    column: ColumnSpec
    value: Column
    problems: list[Column] = field(default_factory=list)
    cheap_ok: Column | None = None
    # The field as the record carried it, where it was text the value's kind does not read as it is (a JSON string
    # in a jsonb column): what an envelope compares with a producer's placeholder. None: `value` tells.
    raw_text: Column | None = None


@dataclass(frozen=True)
class Reading:
    """What a format read of a batch's records, as Spark expressions over the frame its `parse` made.

    `first`: the documents' own problems, checked before any field (the value not UTF-8, not a document, ...);
    `fields`: every declared column, in declaration order; `unexpected`: an array of the value's fields no column
    reads (sorted paths), or None when the format cannot tell; `last`: a catch-all, checked after everything else
    (a document that did not match its schema in a way no other check named); `cheap_ok`: cheap expressions that, all
    true, prove `first` and `last` NULL.
    """

    first: list[Column]
    fields: list[FieldRead]
    last: list[Column]
    cheap_ok: list[Column]
    unexpected: Column | None = None


class ValueFormat(ABC):
    """A wire format of Kafka records (`value: {format: ...}` in a pipeline's declaration)."""

    name: ClassVar[str]

    @abstractmethod
    def parse(self, records: DataFrame, pipeline: PipelineConfig, keep: list[str]) -> DataFrame:
        """The records (Spark's Kafka source rows) with `keep` of their columns and what the format parses once per
        record, each in a column of its own (one projection: the reading refers to each several times)."""

    @abstractmethod
    def read(self, pipeline: PipelineConfig) -> Reading:
        """The columns' values and the format's reasons, as expressions over `parse`'s frame."""
