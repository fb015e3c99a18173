"""The rows kafka-ledger writes, their columns declared once: output rows, dead letters, staged and incoming rows.

The DDL (sql.py), the dead letters' COPY lines Spark renders and the output rows' Arrow types (publish.py), the
rows spark-submit stages (decode.py), the staging table's expected layout (ledger.py) and the names a pipeline may
not declare (config.py) all derive from these lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_ledger.model.kinds import BOOLEAN, BYTES, INT, JSONB, LONG, STRING, TIMESTAMP, ColumnKind


@dataclass(frozen=True)
class Column:
    """A column the ledger adds to the rows it writes, of a kind (model.kinds)."""

    name: str
    kind: ColumnKind
    required: bool = False

    @property
    def postgres_type(self) -> str:
        return self.kind.postgres_type

    @property
    def ddl(self) -> str:
        """The column as a CREATE TABLE line (its name is a constant of ours: no quoting needed)."""
        return f"{self.name} {self.postgres_type}" + (" NOT NULL" if self.required else "")


KAFKA_TOPIC = Column("kafka_topic", STRING, required=True)
KAFKA_PARTITION = Column("kafka_partition", INT, required=True)
KAFKA_OFFSET = Column("kafka_offset", LONG, required=True)
KAFKA_TIMESTAMP = Column("kafka_timestamp", TIMESTAMP)
KAFKA_KEY = Column("kafka_key", BYTES)
KAFKA_VALUE = Column("kafka_value", BYTES)
BATCH_ID = Column("batch_id", LONG, required=True)
ATTEMPT = Column("attempt", INT, required=True)
ERROR = Column("error", STRING)
PIPELINE = Column("pipeline", STRING, required=True)
# An entity table's incoming rows (write: upsert): whether the record is a tombstone, deleting its key.
TOMBSTONE = Column("kafka_tombstone", BOOLEAN, required=True)
# A change event's incoming rows (envelope: debezium; model/debezium.py): the columns whose value the event did not
# carry (an unchanged TOASTed value), as a JSON array of their names, NULL when it carried every one; and a primary-key
# change's create, the key it had before (its delete, the key it has after), as a JSON object of the key columns. No
# raw record rides along: a third of the updates may lack a value, but few find it nowhere; the dead letter of one that
# does gets its key and value read again from Kafka by offset (batch/commit.py).
UNAVAILABLE = Column("kafka_unavailable", JSONB)
OLD_KEY = Column("kafka_old_key", JSONB)
NEW_KEY = Column("kafka_new_key", JSONB)
CHANGE_EVENT_EXTRA: tuple[Column, ...] = (UNAVAILABLE, OLD_KEY, NEW_KEY)

# A record's place in Kafka: the key of every output row (unless at_least_once) and of every dead letter.
COORDINATES: tuple[Column, ...] = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)
# An output row: the declared columns, then these.
OUTPUT_TRAILER: tuple[Column, ...] = (*COORDINATES, KAFKA_TIMESTAMP, BATCH_ID)
# A dead letter as written (the table adds dead_lettered_at itself): the raw record and why it was refused.
DEAD_LETTER: tuple[Column, ...] = (PIPELINE, *COORDINATES, KAFKA_TIMESTAMP, KAFKA_KEY, KAFKA_VALUE,
                                   Column("error", STRING, required=True), BATCH_ID)
# A staged row (runtime submit): the attempt that staged it and the raw record with its error, then the
# declared columns.
STAGING_HEAD: tuple[Column, ...] = (BATCH_ID, ATTEMPT, *COORDINATES, KAFKA_TIMESTAMP, KAFKA_KEY, KAFKA_VALUE, ERROR)

# Names the ledger gives columns of its own rows: a pipeline's declared columns may not use them.
RESERVED_COLUMNS = frozenset(c.name for c in (*OUTPUT_TRAILER, *DEAD_LETTER, *STAGING_HEAD, TOMBSTONE,
                                              *CHANGE_EVENT_EXTRA) if c.name != "pipeline")


def names(columns: tuple[Column, ...] | list[Column]) -> list[str]:
    return [c.name for c in columns]

# Columns of a publish frame (batch/publish.publish_frame) beside the coordinates and the output's values. Not
# identifiers (they have spaces), so no declared column can take their names.
PUBLISHED = "is published"  # false for a dead letter
DEAD_LETTER_LINE = "dead letter line"  # a dead letter's COPY line (ledger.sql.COPY_DEAD_LETTERS), NULL for others
