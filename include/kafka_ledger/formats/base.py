"""The value-format seam: a wire format owns its whole life in a pipeline, from its part of the declaration to a batch's
decoded columns.

A format (one module each: json.py, avro.py, ...; known.py names them) answers:
- its part of a declaration: the options it takes (`options`, `value_problems`) and what it asks of the columns
  (`declaration_problems`), checked when the pipelines file loads (config.pipeline asks it);
- what a batch pins when it is planned (`pin`: a registry format's schema per topic, recorded in the ledger before
  anything is read), and the format bound to those pins for the read (`bound`), or to the newest schemas for a warm-up
  (`newest`);
- whether it needs the schema registry (`uses_registry`: its secrets are then masked and handed to a Spark job), and
  the columns it can derive when a declaration leaves them out (`derived_columns`);
- the decoding itself, in two steps: `parse` adds what it parses once per record to the frame (one projection), then
  `read` gives each declared column's value with the format's own problems, and the problems of the documents as a
  whole. Checks that do not depend on the format (required fields, NUL in text, unexpected fields, a kind's own rules)
  are validate.py's; decode.py puts them together into (decoded columns, reason).

Formats sit below the declaration (config/): they see a pipeline through the protocols below, never its classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from kafka_ledger.model.kinds import ColumnKind


class DeclaredColumn(Protocol):
    """A declared column, as a format reads it (config.pipeline.ColumnSpec)."""

    name: str
    type: ColumnKind
    source: str
    path: str | None
    required: bool

    @property
    def source_kind(self) -> str: ...

    @property
    def field_path(self) -> tuple[str, ...]: ...

    @property
    def label(self) -> str: ...

    @property
    def required_reason(self) -> str: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Any: ...


class DeclaredValue(Protocol):
    """A declaration's `value:` (config.pipeline.ValueSpec): the format's name and options, and the envelope."""

    format: str
    framing: str
    subject: str | None
    message: str | None
    key_format: str | None
    key_subject: str | None
    key_message: str | None
    envelope: str
    debezium: Any  # the connector's settings (config.pipeline.DebeziumSettings)

    def subject_of(self, topic: str) -> str: ...

    def key_subject_of(self, topic: str) -> str: ...

    def given(self) -> set[str]: ...


class DeclaredPipeline(Protocol):
    """A pipeline's declaration, as a format reads it (config.pipeline.PipelineConfig); `columns` is None when the
    declaration leaves them to the format (`derives_columns`) and they were not taken yet."""

    name: str
    value: DeclaredValue
    columns: Any
    key: list[str]
    extra_fields: str

    @property
    def key_columns(self) -> list[Any]: ...

    @property
    def reads_headers(self) -> bool: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Any: ...


class ColumnSources(Protocol):
    """Where a format finds the schema a pipeline's derived columns come from (batch/columns.py gives it): the schema
    registry, or a topic's newest records (a format whose values carry their schema)."""

    def registry(self) -> Any: ...

    def newest_values(self, topic: str) -> list[bytes]: ...


@dataclass(frozen=True)
class SchemaPin:
    """The schema a topic's values (`part` value) or keys (`key`) of a batch are read with (a registry format's): a
    subject's version in the schema registry, the newest when the batch was planned (`newest`) or its replayed batch's
    (`pinned`). Recorded in the ledger by the plan, before anything is read; the read binds the format to it."""

    topic: str
    subject: str
    schema_id: int
    version: int | None
    chosen: str
    part: str = "value"

    @property
    def pinned(self) -> tuple[str, str]:
        """What it is the pin of, as a batch's pins are keyed: (part, topic)."""
        return self.part, self.topic


# A batch's pins, by what each is the pin of: (part, topic).
Pins = Mapping[tuple[str, str], SchemaPin]


@dataclass(frozen=True)
class DerivedColumns:
    """The columns a format derived from a subject's newest version (a registry format's; a format whose values
    carry their schema: `subject` the topic, `schema_id` the schema's own hash, `version` 0): the declarations (as a
    pipelines file writes them) and the version they come from."""

    subject: str
    schema_id: int
    version: int
    columns: list[dict[str, Any]]


@dataclass(frozen=True)
class FieldRead:
    """One declared column as its format read it: the value (NULL when absent or unreadable), the format's reasons
    why it cannot be published (each NULL when it can; the first non-NULL wins), and `cheap_ok`, a cheap expression
    true only when every one of those reasons is NULL (the lean path's proof; None: check the reasons themselves),
    and `raw_text`."""

    column: DeclaredColumn
    value: Column
    problems: list[Column] = field(default_factory=list)
    cheap_ok: Column | None = None
    # The field as the record carried it, where it was text the value's kind does not read as it is (a JSON string
    # in a jsonb column): what an envelope compares with a producer's placeholder. None: `value` tells.
    raw_text: Column | None = None
    # Where the record carries the field (present, not JSON null), for a reading whose value is NULL exactly where a
    # present field has a problem: the lean path's proof is then the value itself (`~present | value IS NOT NULL`, on
    # the decode's projection of the value), and the problems are worked out for the records failing it only. None:
    # `cheap_ok`, or the problems themselves, for every record.
    present: Column | None = None


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
    # The format in the configuration reference.
    description: ClassVar[str]
    # The `value:` options the format takes beside `format` and the envelope's (the others are refused).
    options: ClassVar[frozenset[str]] = frozenset()
    # Whether values carry a schema id the schema registry resolves: the format then pins a schema per topic when a
    # batch is planned, and needs the registry (its secrets masked, handed to a Spark job).
    uses_registry: ClassVar[bool] = False
    # Whether a declaration may leave `columns:` out: the format derives them from the subject's newest schema.
    derives_columns: ClassVar[bool] = False
    # When a format that derives columns for some declarations only does (a refusal says so); empty: always or never.
    derives_when: ClassVar[str] = ""
    # How the format reads a column of each kind, by the kind's word (model.kinds): the one place a format decides by
    # kind. Every declarable kind has its entry in every format (a test keeps it so).
    kind_readings: ClassVar[Mapping[str, object]]

    def kind_reading(self, kind: ColumnKind) -> Any:
        """How the format reads a column of `kind` (its entry in kind_readings)."""
        return self.kind_readings[kind.word]

    # --- the declaration ----------------------------------------------------------------------------------------

    def value_problems(self, value: DeclaredValue) -> list[str]:
        """Why the declaration's `value:` options (those in `options`: known.py refuses the others) do not fit the
        format (none: they do)."""
        return []

    def declaration_problems(self, pipeline: DeclaredPipeline) -> list[str]:
        """Why the pipeline's declaration cannot be read in this format (columns it cannot fill, options of the
        pipeline it does not support); none: it can."""
        if pipeline.columns is None and not self.can_derive_columns(pipeline):
            return [f"columns is required: the fields of the record, one column each (format {self.name} has no "
                    "schema to take them from" + (f": {self.derives_when}" if self.derives_when else "") + ")"]
        return []

    def can_derive_columns(self, pipeline: DeclaredPipeline) -> bool:
        """Whether the pipeline may leave its columns to the format (`derived_columns`)."""
        return self.derives_columns

    # --- a batch's schemas --------------------------------------------------------------------------------------

    def pin(self, registry: Any, pipeline: DeclaredPipeline, columns: list[DeclaredColumn], topics: set[str],
            replayed: Pins) -> list[SchemaPin]:
        """What a new batch of `topics` pins (its replayed batch's pins, `replayed`, where it has them), refused
        when its schema cannot fill `columns` (the columns as the format reads them); nothing for a format whose
        values carry no schema id."""
        return []

    def bound(self, registry: Any, pipeline: DeclaredPipeline, pins: Pins, topics: set[str], batch_id: int
              ) -> ValueFormat:
        """The format bound to a batch's pins for its read (its schemas fetched from `registry`, before the attempt
        begins: a registry away fails it with nothing begun)."""
        return self

    def newest(self, registry: Any, pipeline: DeclaredPipeline, topics: set[str]) -> ValueFormat:
        """The format bound to the newest schemas of `topics`, as the pipeline's next batch will likely pin them (a
        warm-up's read)."""
        return self

    @property
    def binds(self) -> bool:
        """Whether a batch's read needs the format bound to its pins (`bound`): decoded alone, never beside other
        pipelines' records."""
        return self.uses_registry

    def columns_subject(self, pipeline: DeclaredPipeline, topics: list[str]) -> str:
        """Where a pipeline that leaves its columns out takes them from (`topics`: those it subscribes to): a subject
        of the registry, or a topic; recorded with them."""
        raise NotImplementedError(f"format {self.name} takes its columns from the declaration")

    def derived_columns(self, sources: ColumnSources, subject: str, envelope: str) -> DerivedColumns:
        """The columns of every field of the subject's newest schema (of a change event's row image, envelope
        debezium), each of the column type that holds it."""
        raise NotImplementedError(f"format {self.name} takes its columns from the declaration")

    def columns_origin(self, subject: str, schema_id: int, version: int) -> str:
        """Where derived columns came from, in words (a log line, a refusal)."""
        raise NotImplementedError(f"format {self.name} takes its columns from the declaration")

    # --- the decoding ---------------------------------------------------------------------------------------------

    @abstractmethod
    def parse(self, records: DataFrame, pipeline: DeclaredPipeline, keep: list[str]) -> DataFrame:
        """The records (Spark's Kafka source rows) with `keep` of their columns and what the format parses once per
        record, each in a column of its own (one projection: the reading refers to each several times)."""

    @abstractmethod
    def read(self, pipeline: DeclaredPipeline) -> Reading:
        """The columns' values and the format's reasons, as expressions over `parse`'s frame."""
