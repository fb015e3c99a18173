"""Spark-side decoding of Kafka records into the declared columns, or a dead-letter reason per record.

The pipeline's format (formats/) reads the values and names its own problems, validate.py adds the checks every
format shares, and the sink's envelope says what a record without a value means. Lean by design: every record pays
for the format's one parse and cheap checks; only the records that fail them get their exact reason worked out. The
reason is the first problem found, in a fixed order, whichever path a record took: the documents' own problems, then
each column's (the format's, then its kind's), then the required fields, the unexpected fields, and the format's
catch-all.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kafka_ledger.formats import validate
from kafka_ledger.formats.base import FieldRead, ValueFormat
from kafka_ledger.formats.known import value_format

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from kafka_ledger.formats.base import DeclaredPipeline
    from kafka_ledger.formats.envelope import Envelope

# The Kafka source's columns a decoded row keeps (the raw key and value for dead letters).
_KEPT = ["topic", "partition", "offset", "timestamp", "key", "value"]


def _without_value(read: FieldRead, lacks: Column) -> FieldRead:
    """The column where the record lacks its value (`lacks`): NULL, with none of the format's problems (the envelope
    says what becomes of it)."""
    from pyspark.sql import functions as F

    return FieldRead(read.column, F.when(~lacks, read.value), [F.when(~lacks, problem) for problem in read.problems],
                     None if read.cheap_ok is None else lacks | read.cheap_ok, read.raw_text)


def _projected_name(what: str, column: str) -> str:
    """A column of the decode's own projections (not an identifier: no declared column can take it)."""
    return f"{what} {column}"


def _projected(frame: DataFrame, reads: list[FieldRead]) -> tuple[DataFrame, list[FieldRead]]:
    """The frame with each column's value in a column of its own, and the problems of a column without a cheap check
    (the lean path computes them for every record anyway); the reads of those columns (a read giving `present` is
    proven by its projected value).

    The reason, the envelope and the checks refer to a value several times, and Spark evaluates an expression again
    wherever it sits under a condition: a wide table's values were each computed several times a record (measured:
    docs/benchmark.md, the wide typed table)."""
    from pyspark.sql import functions as F

    def proof(read: FieldRead) -> Column | None:
        if read.cheap_ok is not None or read.present is None:
            return read.cheap_ok
        return ~read.present | F.col(_projected_name("decoded", read.column.name)).isNotNull()

    proofs = {read.column.name: proof(read) for read in reads}
    eager = {read.column.name for read in reads if proofs[read.column.name] is None and read.problems}
    frame = frame.select("*", *[read.value.alias(_projected_name("decoded", read.column.name)) for read in reads],
                         *[F.coalesce(*read.problems).alias(_projected_name("problem", read.column.name))
                           for read in reads if read.column.name in eager])
    return frame, [replace(read, value=F.col(_projected_name("decoded", read.column.name)),
                           cheap_ok=proofs[read.column.name],
                           problems=[F.col(_projected_name("problem", read.column.name))] if read.column.name in eager
                           else read.problems)
                   for read in reads]


def decode_records(records: DataFrame, pipeline: DeclaredPipeline, envelope: Envelope, *,
                   lean: bool = True, fmt: ValueFormat | None = None) -> DataFrame:
    """Kafka source rows -> Kafka coordinates, raw key and value, `error` (NULL: publishable), the declared columns
    and the envelope's (an entity table's tombstone flag).

    With `lean` (always, outside tests) the exact reason is worked out only for records that fail the cheap
    checks; without it, for every record (the reference the lean path is tested against). `fmt`: the pipeline's
    format bound to the batch (an Avro batch's schemas), else the pipeline's own.
    """
    from pyspark.sql import functions as F

    fmt = fmt or value_format(pipeline)
    keep = _KEPT + (["headers"] if pipeline.reads_headers else [])
    read_as = envelope.reading(pipeline)
    frame = fmt.parse(records, read_as, keep)
    reading = fmt.read(read_as)
    frame, projected = _projected(frame, reading.fields)
    unavailable: dict[str, Column] = {}
    for read in projected:
        lacks = envelope.unavailable(pipeline, read)
        if lacks is not None:
            unavailable[read.column.name] = lacks
    if unavailable:  # referred to several times too: a projection of their own
        frame = frame.select("*", *[lacks.alias(_projected_name("lacks", name)) for name, lacks in unavailable.items()])
        unavailable = {name: F.col(_projected_name("lacks", name)) for name in unavailable}
    fields = [_without_value(read, unavailable[read.column.name]) if read.column.name in unavailable else read
              for read in projected]
    values = {read.column.name: read.value for read in fields}
    found = envelope.unexpected(reading.unexpected) if reading.unexpected is not None else None
    unexpected = [validate.unexpected_fields(found)] if found is not None else []
    # Each column's part of the reason: its format's problems and its kind's; then, after every column's, its being
    # required.
    columns = [[*read.problems, *validate.value_problems(read)] for read in fields]
    required = [validate.required(read) for read in fields]
    if not lean:
        reason = F.coalesce(*reading.first, *[p for part in columns for p in part],
                            *[check for check in required if check is not None], *unexpected, *reading.last)
    else:
        # Cheap checks of the record as a whole (its documents', the envelope's, the unexpected fields') and of each
        # column (its reading's, its kind's, its being required); a column's hold only beside the whole's.
        whole = [*envelope.cheap_ok(pipeline, values, unavailable), *reading.cheap_ok]
        if found is not None:
            whole.append(validate.no_unexpected_fields(found))
        column_ok = []
        for read in fields:
            own = read.cheap_ok if read.cheap_ok is not None else validate.every([p.isNull() for p in read.problems])
            checks = [own, *[p.isNull() for p in validate.value_problems(read)]]
            if read.column.required:
                checks.append(read.value.isNotNull())
            column_ok.append(validate.every(checks))
        # Each computed once, in a projection of its own: the reason below refers to them again.
        oks = [validate.every(whole), *column_ok]
        frame = frame.select("*", *[ok.alias(_projected_name("ok", str(i))) for i, ok in enumerate(oks)])
        whole_ok, *column_ok = [F.col(_projected_name("ok", str(i))) for i in range(len(oks))]
        column_ok = [whole_ok & ok for ok in column_ok]
        # A record passing every cheap check has no reason; for the others, each part whose checks failed is worked
        # out (a part whose checks passed is NULL: the first problem is the same, and one column's failure computes
        # none of a wide table's other columns' problems).
        reason = F.when(~validate.every([whole_ok, *column_ok]), F.coalesce(
            *[F.when(~whole_ok, p) for p in reading.first],
            *[F.when(~ok, p) for ok, part in zip(column_ok, columns, strict=True) for p in part],
            *[F.when(~ok, check) for ok, check in zip(column_ok, required, strict=True) if check is not None],
            *[F.when(~whole_ok, p) for p in [*unexpected, *reading.last]]))
    enveloped = envelope.apply(pipeline, reason, values, unavailable)
    return frame.select(
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").alias("kafka_key"),
        F.col("value").alias("kafka_value"),
        enveloped.error.alias("error"),
        *[value.alias(name) for name, value in enveloped.values.items()],
        *enveloped.extra,
    )
