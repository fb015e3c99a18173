"""The rows kafka-ledger writes, their columns declared once: output rows, dead letters, staged and incoming rows.

The DDL (sql.py), the dead letters' COPY lines Spark renders and the output rows' Arrow types (publish.py), the
rows spark-submit stages (decode.py), the staging table's expected layout (ledger.py) and the names a pipeline may
not declare (config.py) all derive from these lists.
"""

from __future__ import annotations

from dataclasses import dataclass

# The Postgres type each kind of value is stored as: the declared column types, and the ledger's own bytes.
POSTGRES_TYPES: dict[str, str] = {
    "string": "text",
    "long": "bigint",
    "int": "integer",
    "double": "double precision",
    "boolean": "boolean",
    "timestamp": "timestamptz",
}
_LEDGER_TYPES = {**POSTGRES_TYPES, "bytes": "bytea"}


@dataclass(frozen=True)
class Column:
    """A column the ledger adds to the rows it writes, of a kind (string, int, long, timestamp, bytes)."""

    name: str
    kind: str
    required: bool = False

    @property
    def postgres_type(self) -> str:
        return _LEDGER_TYPES[self.kind]

    @property
    def ddl(self) -> str:
        """The column as a CREATE TABLE line (its name is a constant of ours: no quoting needed)."""
        return f"{self.name} {self.postgres_type}" + (" NOT NULL" if self.required else "")


KAFKA_TOPIC = Column("kafka_topic", "string", required=True)
KAFKA_PARTITION = Column("kafka_partition", "int", required=True)
KAFKA_OFFSET = Column("kafka_offset", "long", required=True)
KAFKA_TIMESTAMP = Column("kafka_timestamp", "timestamp")
KAFKA_KEY = Column("kafka_key", "bytes")
KAFKA_VALUE = Column("kafka_value", "bytes")
BATCH_ID = Column("batch_id", "long", required=True)
ATTEMPT = Column("attempt", "int", required=True)
ERROR = Column("error", "string")
PIPELINE = Column("pipeline", "string", required=True)
# An entity table's incoming rows (write: upsert): whether the record is a tombstone, deleting its key.
TOMBSTONE = Column("kafka_tombstone", "boolean", required=True)

# A record's place in Kafka: the key of every output row (unless at_least_once) and of every dead letter.
COORDINATES: tuple[Column, ...] = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)
# An output row: the declared columns, then these.
OUTPUT_TRAILER: tuple[Column, ...] = (*COORDINATES, KAFKA_TIMESTAMP, BATCH_ID)
# A dead letter as written (the table adds dead_lettered_at itself): the raw record and why it was refused.
DEAD_LETTER: tuple[Column, ...] = (PIPELINE, *COORDINATES, KAFKA_TIMESTAMP, KAFKA_KEY, KAFKA_VALUE,
                                   Column("error", "string", required=True), BATCH_ID)
# A staged row (runtime submit): the attempt that staged it and the raw record with its error, then the
# declared columns.
STAGING_HEAD: tuple[Column, ...] = (BATCH_ID, ATTEMPT, *COORDINATES, KAFKA_TIMESTAMP, KAFKA_KEY, KAFKA_VALUE, ERROR)

# Names the ledger gives columns of its own rows: a pipeline's declared columns may not use them.
RESERVED_COLUMNS = frozenset(c.name for c in (*OUTPUT_TRAILER, *DEAD_LETTER, *STAGING_HEAD, TOMBSTONE)
                             if c.name != "pipeline")


def names(columns: tuple[Column, ...] | list[Column]) -> list[str]:
    return [c.name for c in columns]
