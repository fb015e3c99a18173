"""Column kinds: one class per kind of value a column holds, owning its type in every target and its decode rules.

A kind answers its Postgres, Spark, Arrow and Iceberg types, its COPY encodings (binary through pgpq, CSV for the
dead letters' lines), whether it can name an entity (an entity table's key), and how a value carried as text (a JSON
token, a Kafka key's or header's bytes) becomes a value of the kind, or a reason why it cannot. Parameterised kinds
(`decimal(p,s)`) are instances with their parameters; `parse_kind("decimal(12,2)")` reads a declaration.
Spark, Arrow, Iceberg and pgpq are imported only where a method needs them: the declaration (a DAG file) does not.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

# How a timestamp's text may be written: ISO-8601 text, or a number of seconds, milliseconds or microseconds since
# 1970-01-01 UTC. A number's unit cannot be told from the number, so a column declares one.
TimestampFormat = Literal["iso8601", "epoch_seconds", "epoch_millis", "epoch_micros"]
DEFAULT_TIMESTAMP_FORMATS: tuple[TimestampFormat, ...] = ("iso8601", "epoch_seconds")
EPOCH_MICROS_PER_UNIT: dict[str, int] = {"epoch_seconds": 1_000_000, "epoch_millis": 1_000, "epoch_micros": 1}
# Decoded timestamps and dates must fall in these years (first and last, inclusive) unless a column narrows them: an
# epoch number in the wrong unit lands outside them (milliseconds read as seconds give the year 58000) and is
# dead-lettered instead of published.
DEFAULT_YEARS = (1900, 2199)
# Spark's decimals (and Postgres's numeric as Iceberg and Arrow hold it) have at most this many digits.
MAX_DECIMAL_PRECISION = 38

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DeclaredColumn(Protocol):
    """What a kind's decode rules read of a declared column (config.pipeline.ColumnSpec)."""

    @property
    def timestamp_formats(self) -> tuple[TimestampFormat, ...]: ...

    @property
    def value_years(self) -> tuple[int, int]: ...

    @property
    def epoch_unit(self) -> str | None: ...


@dataclass(frozen=True)
class TextValue:
    """A value read from text: the value (NULL when it cannot be read) and why it cannot be published (NULL when it
    can). `label` names where the text came from in reasons, e.g. `field 'amount'`."""

    value: Column
    problem: Column


def _years_micros(years: tuple[int, int]) -> tuple[int, int]:
    """[first year's start, the year after last's start) in epoch microseconds."""
    first, last = years
    return tuple(int((datetime(year, 1, 1, tzinfo=UTC) - _EPOCH).total_seconds()) * 1_000_000
                 for year in (first, last + 1))  # type: ignore[return-value]


class ColumnKind(ABC):
    """One kind of column value. Instances compare (and hash) by their declaration, e.g. `decimal(12,2)`."""

    # The kind's word in a declaration (`type: long`); a parameterised kind adds its parameters.
    word: ClassVar[str]
    # Whether the kind can name an entity (write: upsert): values compared exactly, and read from a Kafka key's text.
    key_capable: ClassVar[bool] = False
    # What the kind holds, in words, for the configuration reference.
    description: ClassVar[str] = ""
    # Whether a source column of the kind may be stored out of line (TOASTed), so that a change event may carry
    # Debezium's unavailable-value placeholder in its place: Postgres's variable-length types (text, json and jsonb,
    # bytea, numeric; arrays, read as text or jsonb). A fixed-width value (an integer, float, boolean, date, time,
    # timestamp, uuid, interval) is always logged whole.
    toastable: ClassVar[bool] = False
    # Whether `from_text_parts` gives a NULL value wherever it gives a problem (a value it reads is always valid): then
    # the lean decode proves a text's column by its value alone (formats/base.FieldRead.present). Not a timestamp's
    # or a time's: they read a value, then refuse its digits or years.
    text_problem_nulls_value: ClassVar[bool] = False

    @property
    def declared(self) -> str:
        """The kind as a declaration writes it."""
        return self.word

    def __str__(self) -> str:
        return self.declared

    def __repr__(self) -> str:
        return f"<kind {self.declared}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ColumnKind) and other.declared == self.declared

    def __hash__(self) -> int:
        return hash(self.declared)

    # --- where the values are stored ------------------------------------------------------------------------

    @property
    @abstractmethod
    def postgres_type(self) -> str:
        """The Postgres column type."""

    @abstractmethod
    def spark_type(self) -> DataType:
        """The Spark SQL type of a decoded value."""

    @abstractmethod
    def arrow_type(self) -> pa.DataType:
        """The Arrow type a value travels in to the binary COPY (its Postgres wire form) and to pyiceberg."""

    @abstractmethod
    def iceberg_type(self) -> Any:
        """The Iceberg type of the column."""

    def copy_encoder(self, field: pa.Field) -> Any | None:
        """pgpq's encoder of the column for binary COPY, when the Arrow type alone does not say which (else None)."""
        return None

    def copy_array(self, values: Any) -> Any:
        """Spark's values of the kind (an Arrow array of `spark_type()`) as `arrow_type()`, the column's Postgres
        wire form in binary COPY: a cast, unless the kind says otherwise."""
        return values.cast(self.arrow_type())

    @property
    def staging_type(self) -> str:
        """The Postgres type Spark's JDBC writer stages a value of the kind in (the submit runtime)."""
        return self.postgres_type

    def from_staged(self, column: str) -> str:
        """The SQL expression that makes a staged value (`column`, quoted) a value of the kind's Postgres type."""
        return column

    def csv_field(self, value: Column) -> Column:
        """The value as one field of a COPY CSV line (NULL stays NULL: an unquoted empty field). Spark's text form of
        numbers and booleans is Postgres input syntax (doubles round-trip exactly)."""
        return value.cast("string")

    # --- how values are decoded -----------------------------------------------------------------------------

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        """A value of the kind read from text (a JSON token's, a Kafka key's or header's), and why it cannot be
        published; NULL text is a NULL value with no problem (a missing field: `required` deals with it)."""
        from pyspark.sql import functions as F

        value = F.trim(text).try_cast(self.spark_type())
        return TextValue(value, F.when(text.isNotNull() & value.isNull(), F.lit(f"{label} is not a valid {self}")))

    def text_parts(self, text: Column) -> dict[str, Column]:
        """What reading text of the kind parses (a regular expression's match, its groups), for a format to compute
        once per record in a projection of its own and hand to `from_text_parts`: the value and its checks refer to
        each several times, and Spark would match again for every reference. None for most kinds."""
        return {}

    def from_text_parts(self, text: Column, parts: Mapping[str, Column], column: DeclaredColumn,
                        label: str) -> TextValue:
        """`from_text`, with `text_parts` of the text computed already (their projection's columns)."""
        return self.from_text(text, column, label)

    def from_bytes(self, raw: Column, column: DeclaredColumn, label: str) -> TextValue:
        """A value of the kind read from a whole Kafka key's or header's bytes: their UTF-8 text, read by
        `from_text`; bytes that are not UTF-8 are a problem."""
        from pyspark.sql import functions as F

        utf8 = F.is_valid_utf8(raw)
        read = self.from_text(F.when(utf8, raw.cast("string")), column, label)
        return TextValue(read.value, F.when(raw.isNotNull() & ~utf8, F.lit(f"{label} is not valid UTF-8"))
                         .otherwise(read.problem))

    def value_problems(self, value: Column, label: str) -> list[Column]:
        """Why a decoded value cannot be stored, whatever format it came in (NULL each when it can)."""
        return []

    def from_debezium(self, number: Column, unit: str, column: DeclaredColumn, label: str) -> TextValue:
        """A value of the kind from the number a Debezium change event writes it as (`unit`: `epoch days`, `epoch
        millis`, `epoch micros`: since 1970-01-01, or since midnight for a time of day)."""
        raise NotImplementedError(f"Debezium writes no {self} as a number")

    def holds_one_of(self, value: Column, texts: tuple[str, ...]) -> Column | None:
        """Whether a decoded value is one of `texts`, as the kind holds text (a producer's placeholder for a value it
        did not send); None for a kind that holds no text."""
        return None


class _Textual(ColumnKind):
    """A kind whose decoded value is text (Spark's string)."""

    def holds_one_of(self, value: Column, texts: tuple[str, ...]) -> Column | None:
        return value.isin(*texts)


class StringKind(_Textual):
    word = "string"
    toastable = True
    key_capable = True
    description = "text (no NUL character: Postgres text cannot hold it)"
    postgres_type = "text"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.StringType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.string()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.StringType()

    def csv_field(self, value: Column) -> Column:
        from pyspark.sql import functions as F

        # Always quoted, so an empty string is "" and never NULL; quotes doubled, the CSV way.
        return F.concat(F.lit('"'), F.replace(value, F.lit('"'), F.lit('""')), F.lit('"'))

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        return TextValue(text, F.lit(None).cast("string"))

    def value_problems(self, value: Column, label: str) -> list[Column]:
        from pyspark.sql import functions as F

        # Postgres text cannot hold the NUL character (JSON "\u0000").
        return [F.when(value.contains("\x00"), F.lit(f"{label} contains a NUL character, which Postgres text cannot "
                                                     "store"))]


class _Integral(ColumnKind):
    key_capable = True


class LongKind(_Integral):
    word = "long"
    description = "a 64-bit integer"
    postgres_type = "bigint"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.LongType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int64()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.LongType()


class IntKind(_Integral):
    word = "int"
    description = "a 32-bit integer"
    postgres_type = "integer"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.IntegerType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.int32()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.IntegerType()


class DoubleKind(ColumnKind):
    word = "double"
    description = "a binary floating-point number"
    postgres_type = "double precision"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.DoubleType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.float64()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.DoubleType()


class BooleanKind(ColumnKind):
    word = "boolean"
    description = "true or false"
    postgres_type = "boolean"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.BooleanType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.bool_()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.BooleanType()

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        word = F.lower(F.trim(text))
        value = F.when(word == "true", F.lit(True)).when(word == "false", F.lit(False))
        return TextValue(value, F.when(text.isNotNull() & value.isNull(), F.lit(f"{label} is not a valid {self}")))


class TimestampKind(ColumnKind):
    word = "timestamp"
    description = "an instant, from ISO-8601 text or an epoch number ([Timestamps](#timestamps)), in `years`"
    postgres_type = "timestamptz"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.TimestampType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        # Binary COPY takes a timestamptz as microseconds since 2000 in UTC.
        return pa.timestamp("us", tz="UTC")

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.TimestamptzType()

    def csv_field(self, value: Column) -> Column:
        from pyspark.sql import functions as F

        # Explicit UTC offset: every session's time zone is UTC (spark.connect.SESSION_CONF, the Spark job's conf).
        return F.date_format(value, "yyyy-MM-dd HH:mm:ss.SSSSSSXXX")

    @staticmethod
    def iso_like(text: Column) -> Column:
        """Text whose fifth character is "-" (a year, then a dash) is read as ISO-8601; anything else as a number."""
        from pyspark.sql import functions as F

        return F.substring(text, 5, 1) == F.lit("-")

    @classmethod
    def parses(cls, text: Column) -> tuple[Column, Column]:
        """The text parsed as an ISO-8601 timestamp (when it looks like one) and as a number (else).

        A format computes them once per record in a projection of their own and hands them to `from_parsed`: the
        checks and the value refer to each several times, and Spark would otherwise parse the text again for every
        reference (measured: about a tenth of W1's Spark CPU time)."""
        from pyspark.sql import functions as F

        return (F.when(cls.iso_like(text), text.try_cast("timestamp")),
                F.when(~cls.iso_like(text), text.try_cast("decimal(38,9)")))

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        return self.from_parsed(text, *self.parses(text), column, label)

    def from_parsed(self, text: Column, parsed_text: Column, parsed_number: Column, column: DeclaredColumn,
                    label: str) -> TextValue:
        """The value and its problem from the text and its two parses (`parses`). The result must lie in the column's
        years whichever way the text was read."""
        from pyspark.sql import functions as F

        formats = column.timestamp_formats
        declared = ", ".join(formats)
        first, last = column.value_years
        years = f"{first}-{last}"
        micros_range = _years_micros(column.value_years)
        invalid = F.lit(f"{label} is not a valid timestamp")
        iso_like = self.iso_like(text)

        value_text = parsed_text
        if "iso8601" in formats:
            # Compared as epoch microseconds: a datetime literal would ask the session for its settings.
            text_problem = F.when(value_text.isNull(), invalid).when(
                (F.unix_micros(value_text) < F.lit(micros_range[0]))
                | (F.unix_micros(value_text) >= F.lit(micros_range[1])),
                F.lit(f"{label} is not a valid timestamp (a date outside {years})"),
            ).when(
                # Spark's cast drops a fraction's digits beyond microseconds (a Protobuf Timestamp's nanoseconds):
                # refused, never cut. Only text longer than a microsecond's ISO-8601 can hold them.
                (F.length(text) > 26) & text.rlike(r"\.[0-9]{6}[0-9]*[1-9]"),
                F.lit(f"{label} is not a valid timestamp (more than {MAX_SECOND_DIGITS} digits after the second: "
                      "they would be lost)"),
            )
        else:
            text_problem = F.when(value_text.isNull(), invalid).otherwise(
                F.lit(f"{label} is not a valid timestamp (ISO-8601 text; declared formats: {declared})"))
            value_text = F.lit(None).cast("timestamp")

        number = parsed_number
        unit = column.epoch_unit
        if unit is not None:
            per_unit = EPOCH_MICROS_PER_UNIT[unit]
            # Compared in the declared unit first, so that scaling to microseconds cannot overflow.
            in_range = (number >= F.lit(micros_range[0] // per_unit)) & (number < F.lit(micros_range[1] // per_unit))
            from_number = F.when(in_range, F.timestamp_micros(F.round(F.try_multiply(number, F.lit(per_unit)), 0)
                                                              .cast("long")))
            number_problem = F.when(number.isNull(), invalid).when(
                ~in_range, F.lit(f"{label} is not a valid timestamp (a number outside {years} read as {unit})"))
        else:
            from_number = F.lit(None).cast("timestamp")
            number_problem = F.when(number.isNull(), invalid).otherwise(
                F.lit(f"{label} is not a valid timestamp (a number; declared formats: {declared})"))

        # A missing field (or JSON null) is NULL with no problem: the required check deals with it.
        return TextValue(F.when(iso_like, value_text).otherwise(from_number),
                         F.when(text.isNotNull(), F.when(iso_like, text_problem).otherwise(number_problem)))


# Digits of a second's fraction Postgres keeps for a timestamp or time by default (and at most).
MAX_SECOND_DIGITS = 6


def _digits_problem(micros: Column, precision: int, label: str, kind: ColumnKind) -> Column:
    """A value with more digits of its seconds' fraction than the kind keeps (Postgres would round them away)."""
    from pyspark.sql import functions as F

    if precision >= MAX_SECOND_DIGITS:
        return F.lit(None).cast("string")
    return F.when(micros % F.lit(10 ** (MAX_SECOND_DIGITS - precision)) != 0, F.lit(
        f"{label} is not a valid {kind} (more than {precision} digit(s) after the second: it would be rounded)"))


def _check_precision(word: str, precision: int) -> None:
    if not 0 <= precision <= MAX_SECOND_DIGITS:
        raise ValueError(f"{word}({precision}): the precision (digits after the second) must be 0 to "
                         f"{MAX_SECOND_DIGITS}")


@dataclass(frozen=True, eq=False, repr=False)
class LocalTimestampKind(TimestampKind):
    """A date and time of day without a time zone (Postgres `timestamp(p)`, Spark's timestamp_ntz), `precision` the
    digits of its seconds' fraction. Read from ISO-8601 text without an offset (text with one names an instant:
    a `timestamp` column's), or from an epoch number in a declared unit, taken as UTC's wall clock; a value with more
    digits than the precision is a dead letter, never rounded."""

    precision: int = MAX_SECOND_DIGITS

    word: ClassVar[str] = "local_timestamp"
    description: ClassVar[str] = ("a date and time of day without a time zone (Postgres `timestamp(p)`, p the digits "
                                  "of its seconds' fraction, 6 when left out), from ISO-8601 text without an offset, "
                                  "in `years`")

    def __post_init__(self) -> None:
        _check_precision(self.word, self.precision)

    @property
    def declared(self) -> str:
        return self.word if self.precision == MAX_SECOND_DIGITS else f"{self.word}({self.precision})"

    @property
    def postgres_type(self) -> str:  # type: ignore[override]
        return "timestamp" if self.precision == MAX_SECOND_DIGITS else f"timestamp({self.precision})"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.TimestampNTZType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.timestamp("us")

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.TimestampType()

    def csv_field(self, value: Column) -> Column:
        from pyspark.sql import functions as F

        return F.date_format(value, "yyyy-MM-dd HH:mm:ss.SSSSSS")

    def from_parsed(self, text: Column, parsed_text: Column, parsed_number: Column, column: DeclaredColumn,
                    label: str) -> TextValue:
        """As a timestamp's, then its wall clock in UTC; text with a time zone is refused (it names an instant)."""

        read = super().from_parsed(text, parsed_text, parsed_number, column, label)
        return self._local(read.value, read.problem, text.isNotNull() & self.iso_like(text) & text.rlike(
            r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)$"), label, f"{label} is not a valid {self} (it has a time zone: a "
                                                   "timestamp column holds an instant)")

    def from_epoch(self, number: Column, unit: str, column: DeclaredColumn, label: str) -> TextValue:
        """An epoch number in `unit` (`epoch_millis`, `epoch_micros`), taken as UTC's wall clock, in the column's
        years."""
        from pyspark.sql import functions as F

        micros_range = _years_micros(column.value_years)
        per_unit = EPOCH_MICROS_PER_UNIT[unit]
        in_range = (number >= F.lit(micros_range[0] // per_unit)) & (number < F.lit(micros_range[1] // per_unit))
        value = F.when(in_range, F.timestamp_micros(number * F.lit(per_unit)))
        first, last = column.value_years
        problem = F.when(number.isNotNull() & ~in_range, F.lit(
            f"{label} is not a valid {self} (a number outside {first}-{last} read as {unit})"))
        return self._local(value, problem, F.lit(False), label, "")

    def from_debezium(self, number: Column, unit: str, column: DeclaredColumn, label: str) -> TextValue:
        return self.from_epoch(number, unit.replace(" ", "_"), column, label)

    def _local(self, instant: Column, problem: Column, zoned: Column, label: str, zoned_reason: str) -> TextValue:
        from pyspark.sql import functions as F

        micros = F.unix_micros(instant)
        digits = _digits_problem(micros, self.precision, label, self)
        problem = F.when(zoned, F.lit(zoned_reason)).otherwise(F.coalesce(problem, F.when(instant.isNotNull(),
                                                                                           digits)))
        return TextValue(F.when(~zoned & digits.isNull(), instant.cast("timestamp_ntz")), problem)


@dataclass(frozen=True, eq=False, repr=False)
class TimeKind(ColumnKind):
    """A time of day without a time zone (Postgres `time(p)`), `precision` the digits of its seconds' fraction: in
    Spark, microseconds past midnight. Read from `HH:MM:SS[.ffffff]` text, or from a change event, milli- or
    microseconds past midnight; a value with more digits than the precision is a dead letter, never rounded."""

    precision: int = MAX_SECOND_DIGITS

    word: ClassVar[str] = "time"
    description: ClassVar[str] = ("a time of day without a time zone (Postgres `time(p)`, p the digits of its "
                                  "seconds' fraction, 6 when left out), from `HH:MM:SS[.ffffff]` text (in the lake: "
                                  "microseconds past midnight)")
    # A day's microseconds: Postgres takes 24:00:00 as a time too.
    DAY_MICROS: ClassVar[int] = 86_400_000_000

    def __post_init__(self) -> None:
        _check_precision(self.word, self.precision)

    @property
    def declared(self) -> str:
        return self.word if self.precision == MAX_SECOND_DIGITS else f"{self.word}({self.precision})"

    @property
    def postgres_type(self) -> str:
        return "time" if self.precision == MAX_SECOND_DIGITS else f"time({self.precision})"

    @property
    def staging_type(self) -> str:
        return "bigint"

    def from_staged(self, column: str) -> str:
        return f"time '00:00' + {column} * interval '1 microsecond'"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.LongType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.time64("us")

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.LongType()

    def copy_array(self, values: Any) -> Any:
        import pyarrow as pa

        # Spark's microseconds, reinterpreted as Arrow's time of day in microseconds.
        return values.cast(pa.int64()).cast(pa.time64("us"))

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        parts = r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(\.([0-9]{1,6}))?$"
        shaped = text.rlike(parts)
        hours, minutes, seconds = (F.regexp_extract(text, parts, i).cast("long") for i in (1, 2, 3))
        fraction = F.rpad(F.regexp_extract(text, parts, 5), 6, "0").cast("long")
        micros = ((hours * 3600 + minutes * 60 + seconds) * 1_000_000 + fraction)
        valid = shaped & (minutes < 60) & (seconds < 60)
        return self.from_micros(F.when(valid, micros), label, F.when(text.isNotNull() & ~valid, F.lit(
            f"{label} is not a valid {self} (HH:MM:SS[.ffffff])")))

    def from_debezium(self, number: Column, unit: str, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        return self.from_micros(number * F.lit(1000) if unit == "epoch millis" else number, label)

    def from_micros(self, micros: Column, label: str, problem: Column | None = None) -> TextValue:
        """Microseconds past midnight, up to a whole day (24:00:00), at most the precision's digits."""
        from pyspark.sql import functions as F

        in_day = (micros >= 0) & (micros <= F.lit(self.DAY_MICROS))
        digits = _digits_problem(micros, self.precision, label, self)
        bad = F.when(micros.isNotNull() & ~in_day, F.lit(f"{label} is not a valid {self} (outside a day)"))
        return TextValue(F.when(in_day & digits.isNull(), micros),
                         F.coalesce(problem if problem is not None else F.lit(None).cast("string"), bad,
                                    F.when(micros.isNotNull(), digits)))


class DateKind(ColumnKind):
    word = "date"
    text_problem_nulls_value = True
    description = "a calendar date written `YYYY-MM-DD`, in `years`"
    postgres_type = "date"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.DateType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.date32()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.DateType()

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        # Exactly YYYY-MM-DD: Spark's cast would also take "2026-11" or a date followed by a time (dropping it).
        shaped = text.rlike(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
        value = F.when(shaped, text.try_cast("date"))
        first, last = column.value_years
        in_years = (F.year(value) >= F.lit(first)) & (F.year(value) <= F.lit(last))
        problem = F.when(text.isNotNull(), F.when(value.isNull(), F.lit(f"{label} is not a valid date (YYYY-MM-DD)"))
                         .when(~in_years, F.lit(f"{label} is not a valid date (outside {first}-{last})")))
        return TextValue(F.when(in_years, value), problem)

    def from_debezium(self, number: Column, unit: str, column: DeclaredColumn, label: str) -> TextValue:
        """Days since 1970-01-01, in the column's years."""
        from pyspark.sql import functions as F

        first, last = column.value_years
        days = [(datetime(year, 1, 1, tzinfo=UTC) - _EPOCH).days for year in (first, last + 1)]
        in_years = (number >= F.lit(days[0])) & (number < F.lit(days[1]))
        return TextValue(F.when(in_years, F.date_from_unix_date(number.cast("int"))), F.when(
            number.isNotNull() & ~in_years, F.lit(f"{label} is not a valid date (outside {first}-{last})")))


@dataclass(frozen=True, eq=False, repr=False)
class DecimalKind(ColumnKind):
    """An exact decimal number of `precision` digits, `scale` of them after the point: Postgres `numeric(p,s)`,
    Iceberg's and Spark's `decimal(p,s)`. Never through a binary float: a value with more digits after the point than
    the scale, or too many before it, is a dead letter, never rounded."""

    precision: int
    scale: int

    word: ClassVar[str] = "decimal"
    # Any Avro decimal (its precision and scale those of the field), int or long.
    description: ClassVar[str] = ("an exact number of p digits (1 to 38), s of them after the point: a value that "
                                  "does not fit exactly is a dead letter, never rounded")
    key_capable: ClassVar[bool] = False
    text_problem_nulls_value: ClassVar[bool] = True
    toastable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 1 <= self.precision <= MAX_DECIMAL_PRECISION or not 0 <= self.scale <= self.precision:
            raise ValueError(f"decimal({self.precision},{self.scale}): the precision must be 1 to "
                             f"{MAX_DECIMAL_PRECISION} and the scale 0 to the precision")

    @property
    def declared(self) -> str:
        return f"decimal({self.precision},{self.scale})"

    @property
    def postgres_type(self) -> str:
        return f"numeric({self.precision},{self.scale})"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.DecimalType(self.precision, self.scale)

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.decimal128(self.precision, self.scale)

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.DecimalType(self.precision, self.scale)

    def text_parts(self, text: Column) -> dict[str, Column]:
        """Whether the text is plain decimal text, and how many digits follow its point, trailing zeros aside."""
        from pyspark.sql import functions as F

        return {"plain": text.rlike(r"^-?[0-9]+(\.[0-9]+)?$"),
                "fraction": F.length(F.regexp_extract(text, r"\.([0-9]*?)0*$", 1))}

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        return self.from_text_parts(text, self.text_parts(text), column, label)

    def from_text_parts(self, text: Column, parts: Mapping[str, Column], column: DeclaredColumn,
                        label: str) -> TextValue:
        """Plain decimal text (`-12.50`, no exponent): exact if its digits after the point, trailing zeros aside, are
        at most the scale and its value fits the precision (Spark's cast would round the rest away)."""
        from pyspark.sql import functions as F

        plain = parts["plain"]
        value = F.when(plain & (parts["fraction"] <= F.lit(self.scale)), text.try_cast(self.spark_type()))
        problem = F.when(text.isNotNull(), F.when(~plain, F.lit(f"{label} is not a valid {self}"))
                         .when(value.isNull(), F.lit(f"{label} is not a valid {self} (it does not fit exactly: more "
                                                     f"than {self.scale} digit(s) after the point or "
                                                     f"{self.precision - self.scale} before it)")))
        return TextValue(value, problem)

    @staticmethod
    def unscaled_text(unscaled: Column, scale: Column) -> tuple[Column, Column]:
        """A decimal written as its unscaled value, a big-endian two's-complement integer in base64 (Kafka Connect's
        Decimal, Debezium's precise numerics), and its scale, as plain decimal text: its digits with the point put
        `scale` places from the right (no arithmetic that could round). Up to 16 bytes and 38 digits. Returns (the
        text, NULL when there is none; why there is none: `shape` or `size`, NULL when there is). Heavy: a format
        computes both once per record, in a projection of their own, and reads them with `from_unscaled`."""
        from pyspark.sql import functions as F

        raw = F.try_to_binary(unscaled, F.lit("base64"))
        hexed = F.hex(raw)
        negative = F.substring(hexed, 1, 1) >= F.lit("8")
        # A negative value's magnitude is its bits inverted, plus one.
        magnitude_hex = F.lpad(F.when(negative, F.translate(hexed, "0123456789ABCDEF", "FEDCBA9876543210"))
                               .otherwise(hexed), 32, "0")
        high, low = (F.conv(F.substring(magnitude_hex, start, 16), 16, 10).cast("decimal(38,0)") for start in (1, 17))
        # try_: a magnitude of more than 38 digits is NULL (refused), never an overflow that fails the batch.
        magnitude = F.try_add(F.try_add(F.try_multiply(high, F.lit("18446744073709551616").cast("decimal(20,0)")), low),
                              F.when(negative, F.lit(1)).otherwise(F.lit(0)).cast("decimal(1,0)"))
        plain = magnitude.cast("string")
        # lpad cuts a longer string to its length: zeros only where the digits are fewer than the scale asks.
        digits = F.when(F.length(plain) <= scale, F.lpad(plain, scale + 1, "0")).otherwise(plain)
        whole = F.length(digits) - scale
        text = F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")), F.substring(digits, 1, whole),
                        F.when(scale > 0, F.concat(F.lit("."), F.substring(digits, whole + 1, scale))).otherwise(""))
        shaped = raw.isNotNull() & (F.length(raw) <= 16) & (F.length(raw) > 0) & scale.isNotNull() & (scale >= 0)
        why = F.when(unscaled.isNotNull() & ~shaped, F.lit("shape")).when(unscaled.isNotNull() & magnitude.isNull(),
                                                                          F.lit("size"))
        return F.when(shaped & magnitude.isNotNull(), text), why

    def from_unscaled(self, text: Column, why: Column, column: DeclaredColumn, label: str,
                      parts: Mapping[str, Column] | None = None) -> TextValue:
        """A decimal from `unscaled_text`'s text and why (their projection's columns), and the text's `text_parts`
        where projected too."""
        from pyspark.sql import functions as F

        read = self.from_text_parts(text, parts if parts is not None else self.text_parts(text), column, label)
        return TextValue(read.value, F.when(why == F.lit("shape"), F.lit(
            f"{label} is not a valid {self} (an unscaled value in base64 of 1 to 16 bytes, and its scale)"))
            .when(why == F.lit("size"), F.lit(f"{label} is not a valid {self} (more than 38 digits)"))
            .otherwise(read.problem))


class JsonbKind(_Textual):
    word = "jsonb"
    toastable = True
    description = ("a JSON object or array kept whole (its JSON text in Iceberg); one holding a number Spark cannot "
                   "keep exactly (in exponent notation, over 38 digits) is a dead letter")
    postgres_type = "jsonb"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.StringType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.string()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.StringType()

    def copy_encoder(self, field: pa.Field) -> Any:
        from pgpq.encoders import StringEncoderBuilder
        from pgpq.schema import Jsonb

        return StringEncoderBuilder.new_with_output(field, Jsonb())

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        """Text holding a JSON object or array (a Kafka key's, a header's), kept as its JSON text."""
        from pyspark.sql import functions as F

        return self.from_variant(F.try_parse_json(text), text.isNotNull(), label)

    def from_variant(self, variant: Column, present: Column, label: str, scalars: bool = False) -> TextValue:
        """A value parsed as a Spark variant: exact as long as every number in it is (Spark keeps a JSON number of up
        to 38 digits in plain notation exactly, and turns any other into a binary float). An object or array, or
        any JSON value with `scalars` (a change event's json column holds any)."""
        from pyspark.sql import functions as F

        shape = F.schema_of_variant(variant)
        whole = F.lit(True) if scalars else shape.startswith("OBJECT") | shape.startswith("ARRAY")
        # The pattern only where the shape names one at all (a key of the name aside, it does not).
        named = shape.contains("DOUBLE") | shape.contains("FLOAT")
        inexact = named & shape.rlike(r"(^|<|, |: )(DOUBLE|FLOAT)(>|,|$)")
        text = F.to_json(variant)
        problem = F.when(present, F.when(~whole | variant.isNull(), F.lit(f"{label} is not a valid jsonb (a JSON "
                                                                          "object or array)"))
                         .when(inexact, F.lit(f"{label} holds a number that cannot be kept exactly (in exponent "
                                              "notation, or of more than 38 digits)")))
        return TextValue(F.when(present & whole & ~inexact, text), problem)

    def value_problems(self, value: Column, label: str) -> list[Column]:
        from pyspark.sql import functions as F

        # Postgres jsonb refuses the escaped NUL character in its strings (`\u0000`, not an escaped backslash
        # followed by `u0000`).
        return [F.when(value.contains("\\u0000") & value.rlike(r"(^|[^\\])(\\\\)*\\u0000"),
                       F.lit(f"{label} contains a NUL character, which Postgres jsonb cannot store"))]


class _SixteenBytes(ColumnKind):
    """A kind held as text in Spark and the lake, and as its Postgres type's 16 bytes in binary COPY (`copy_array`
    makes them)."""

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.StringType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.binary(16)

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.StringType()


class UuidKind(_Textual, _SixteenBytes):
    """A UUID (Postgres `uuid`): in Spark, its canonical text (lower-case, hyphens); in binary COPY its 16 bytes."""

    word = "uuid"
    text_problem_nulls_value = True
    key_capable = True
    description = "a UUID, from its text (`a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11`; in the lake as that text)"
    postgres_type = "uuid"
    _SHAPE = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"

    def copy_array(self, values: Any) -> Any:
        """The canonical texts (lower-case, hyphens) as 16 bytes each, their hex digits decoded at once."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        texts = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        valid = texts.is_valid()
        hex_digits = pc.replace_substring(pc.if_else(valid, texts, "00000000-0000-0000-0000-000000000000"), "-", "")
        offsets = np.frombuffer(hex_digits.buffers()[1], dtype=np.int32)[hex_digits.offset:]
        digits = np.frombuffer(hex_digits.buffers()[2], dtype=np.uint8)[
            offsets[0]:offsets[len(hex_digits)]].reshape(-1, 32)
        nibbles = np.where(digits >= ord("a"), digits - (ord("a") - 10), digits - ord("0")).astype(np.uint8)
        raw = ((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).astype(np.uint8)
        uuids = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(texts), [None, pa.py_buffer(raw.tobytes())])
        return pc.if_else(valid, uuids, pa.nulls(len(texts), pa.binary(16)))

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        valid = F.trim(text).rlike(self._SHAPE)
        return TextValue(F.when(valid, F.lower(F.trim(text))),
                         F.when(text.isNotNull() & ~valid, F.lit(f"{label} is not a valid {self}")))


class BytesKind(ColumnKind):
    """Raw bytes, kept as they are: an Avro `bytes` or `fixed` field, a whole Kafka key or header; and the ledger's own
    columns (a record's Kafka key and value in its dead letter). JSON has no bytes: a JSON value's field is refused
    (config.pipeline)."""

    word = "bytes"
    toastable = True
    description = "raw bytes as they are: an Avro `bytes` or `fixed` field, or a whole Kafka key or header"
    postgres_type = "bytea"

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        return T.BinaryType()

    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        return pa.binary()

    def iceberg_type(self) -> Any:
        from pyiceberg import types

        return types.BinaryType()

    def csv_field(self, value: Column) -> Column:
        from pyspark.sql import functions as F

        return F.concat(F.lit("\\x"), F.hex(value))

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        return TextValue(text.cast("binary"), F.lit(None).cast("string"))

    def from_bytes(self, raw: Column, column: DeclaredColumn, label: str) -> TextValue:
        from pyspark.sql import functions as F

        return TextValue(raw, F.lit(None).cast("string"))

    def holds_one_of(self, value: Column, texts: tuple[str, ...]) -> Column | None:
        from pyspark.sql import functions as F

        return value.isin(*[F.lit(bytearray(text.encode())) for text in texts])


class IntervalKind(_SixteenBytes):
    """A span of time as Postgres keeps it (`interval`): months, days and microseconds, each its own (a month is not
    a number of days, nor a day 24 hours across a clock change). Read from ISO-8601 text with designators
    (`P1Y2M3DT4H5M6.5S`, a sign on any part, as Debezium's interval.handling.mode string writes it) or a number of
    seconds; in Spark and the lake its canonical text `P<months>M<days>DT<seconds>S`, which Postgres reads back; in
    binary COPY Postgres's own three fields. More than six digits after the second is a dead letter, never rounded."""

    word = "interval"
    text_problem_nulls_value = True
    description = ("a span of time (Postgres `interval`: months, days and microseconds), from ISO-8601 text with "
                   "designators (`P1Y2M3DT4H5M6.5S`) or a number of seconds (in the lake: "
                   "`P<months>M<days>DT<seconds>S`)")
    postgres_type = "interval"
    # ISO-8601's designators, a sign on each part as Postgres and Debezium write them; at most nine digits a part (the
    # sums then fit a long), at most microseconds.
    _ISO = (r"^P(?:([-+]?[0-9]{1,9})Y)?(?:([-+]?[0-9]{1,9})M)?(?:([-+]?[0-9]{1,9})W)?(?:([-+]?[0-9]{1,9})D)?"
            r"(?:T(?:([-+]?[0-9]{1,9})H)?(?:([-+]?[0-9]{1,9})M)?(?:([-+]?)([0-9]{1,12})(?:\.([0-9]+))?S)?)?$")
    _SECONDS = r"^([-+]?)([0-9]{1,12})(?:\.([0-9]+))?$"
    # Either form, their groups in one match (ISO-8601's nine, then the seconds form's three).
    _EITHER = f"^(?:{_ISO[1:-1]}|{_SECONDS[1:-1]})$"
    _CANONICAL = r"^P(?P<months>-?[0-9]+)M(?P<days>-?[0-9]+)DT(?P<sign>-?)(?P<whole>[0-9]+)\.(?P<fraction>[0-9]{6})S$"
    _INT32 = 2**31

    @property
    def staging_type(self) -> str:
        return "text"

    def from_staged(self, column: str) -> str:
        return f"{column}::interval"

    def copy_array(self, values: Any) -> Any:
        """The canonical texts as Postgres's binary interval: microseconds (8 bytes), days and months (4 each),
        big-endian."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        texts = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        valid = texts.is_valid()
        parts = pc.extract_regex(pc.if_else(valid, texts, "P0M0DT0.000000S"), self._CANONICAL)

        def number(name: str) -> Any:
            return pc.cast(parts.field(name), pa.int64()).to_numpy(zero_copy_only=False)

        sign = np.where(pc.equal(parts.field("sign"), "-").to_numpy(zero_copy_only=False), -1, 1)
        wire = np.empty(len(texts), dtype=[("micros", ">i8"), ("days", ">i4"), ("months", ">i4")])
        wire["micros"] = sign * (number("whole") * 1_000_000 + number("fraction"))
        wire["days"], wire["months"] = number("days"), number("months")
        spans = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(texts), [None, pa.py_buffer(wire.tobytes())])
        return pc.if_else(valid, spans, pa.nulls(len(texts), pa.binary(16)))

    def text_parts(self, text: Column) -> dict[str, Column]:
        """The text's parts, by one match of either form: ISO-8601's nine groups (years, months, weeks, days, hours,
        minutes, the seconds' sign, whole part and fraction), then the seconds form's three (sign, whole, fraction),
        each "" where absent; NULL when the text is of neither form."""
        from pyspark.sql import functions as F

        token = F.trim(text)
        template = ",".join(f"${group}" for group in range(1, 13))  # Java's groups; none holds a comma
        return {"groups": F.when(token.rlike(self._EITHER), F.split(F.regexp_replace(token, self._EITHER, template),
                                                                      ","))}

    def from_text(self, text: Column, column: DeclaredColumn, label: str) -> TextValue:
        return self.from_text_parts(text, self.text_parts(text), column, label)

    def from_text_parts(self, text: Column, parts: Mapping[str, Column], column: DeclaredColumn,
                        label: str) -> TextValue:
        from pyspark.sql import functions as F

        token = F.trim(text)
        groups = parts["groups"]

        def group(index: int) -> Column:
            return groups.getItem(index)

        def number(index: int) -> Column:
            # An absent part is "": never cast (a cast that fails costs a thrown exception per record).
            return F.coalesce(F.nullif(group(index), F.lit("")).try_cast("long"), F.lit(0))

        iso = groups.isNotNull() & token.startswith("P")
        seconds = groups.isNotNull() & ~token.startswith("P")
        months = F.when(iso, number(0) * 12 + number(1)).otherwise(F.lit(0))
        days = F.when(iso, number(2) * 7 + number(3)).otherwise(F.lit(0))
        clock = number(4) * 3_600_000_000 + number(5) * 60_000_000
        micros = F.when(iso, clock + F.coalesce(self._micros(group(6), group(7), group(8)), F.lit(0))).when(
            seconds, self._micros(group(9), group(10), group(11)))
        fraction = F.when(iso, group(8)).otherwise(group(11))
        shaped = (iso & (token != F.lit("P")) & ~token.endswith("T")) | seconds
        in_range = (F.abs(months) < F.lit(self._INT32)) & (F.abs(days) < F.lit(self._INT32))
        valid = shaped & (F.length(fraction) <= MAX_SECOND_DIGITS) & in_range
        problem = F.when(text.isNotNull() & ~shaped, F.lit(
            f"{label} is not a valid {self} (ISO-8601 text with designators, e.g. P1Y2M3DT4H5M6.5S, or seconds)")) \
            .when(text.isNotNull() & (F.length(fraction) > MAX_SECOND_DIGITS), F.lit(
                f"{label} is not a valid {self} (more than {MAX_SECOND_DIGITS} digits after the second: they would "
                "be lost)")) \
            .when(text.isNotNull() & ~in_range, F.lit(f"{label} is not a valid {self} (out of range)"))
        return TextValue(F.when(valid, self._canonical(months, days, micros)), problem)

    @staticmethod
    def _micros(sign: Column, whole: Column, fraction: Column) -> Column:
        """Signed seconds (their sign, whole part and fraction as text) as microseconds."""
        from pyspark.sql import functions as F

        magnitude = whole.try_cast("long") * 1_000_000 + F.coalesce(
            F.rpad(F.substring(fraction, 1, MAX_SECOND_DIGITS), MAX_SECOND_DIGITS, "0").try_cast("long"), F.lit(0))
        return F.when(whole != F.lit(""), F.when(sign == F.lit("-"), -magnitude).otherwise(magnitude))

    @staticmethod
    def _canonical(months: Column, days: Column, micros: Column) -> Column:
        """`P<months>M<days>DT<seconds>S`, the seconds signed with six digits after the point."""
        from pyspark.sql import functions as F

        magnitude = F.abs(micros)
        return F.format_string("P%dM%dDT%s%d.%06dS", months, days, F.when(micros < 0, F.lit("-")).otherwise(
            F.lit("")), F.floor(magnitude / 1_000_000).cast("long"), magnitude % 1_000_000)


# One instance per kind without parameters (and of those with, at their defaults); others are made by parse_kind.
STRING, LONG, INT, DOUBLE, BOOLEAN, TIMESTAMP, LOCAL_TIMESTAMP, DATE, TIME, JSONB, UUID, BYTES, INTERVAL = (
    StringKind(), LongKind(), IntKind(), DoubleKind(), BooleanKind(), TimestampKind(), LocalTimestampKind(),
    DateKind(), TimeKind(), JsonbKind(), UuidKind(), BytesKind(), IntervalKind())
SIMPLE_KINDS: dict[str, ColumnKind] = {k.word: k for k in (STRING, LONG, INT, DOUBLE, BOOLEAN, TIMESTAMP,
                                                            LOCAL_TIMESTAMP, DATE, TIME, JSONB, UUID, BYTES,
                                                            INTERVAL)}
# Every kind a pipeline may declare, one example of each parameterised one (the docs and the mapping test use it).
DECLARABLE: tuple[ColumnKind, ...] = (*SIMPLE_KINDS.values(), DecimalKind(18, 2))

_DECIMAL = re.compile(r"^decimal\(\s*([0-9]+)\s*,\s*([0-9]+)\s*\)$")
_PRECISE = re.compile(r"^(local_timestamp|time)\(\s*([0-9]+)\s*\)$")


def parse_kind(text: str) -> ColumnKind:
    """A declared kind (`long`, `decimal(12,2)`, `time(3)`, ...), or ValueError saying which are known."""
    kind = SIMPLE_KINDS.get(text.strip())
    if kind is not None:
        return kind
    match = _DECIMAL.match(text.strip())
    if match:
        return DecimalKind(int(match[1]), int(match[2]))
    match = _PRECISE.match(text.strip())
    if match:
        return {"local_timestamp": LocalTimestampKind, "time": TimeKind}[match[1]](int(match[2]))
    known = ", ".join(SIMPLE_KINDS)
    raise ValueError(f"unknown type {text!r}: one of {known}, decimal(p,s), local_timestamp(p), time(p)")
