"""The benchmark's peers: what a data engineer would hand-write instead of kafka-ledger, on the same topic.

- the Python peer (`python tools/benchmark_peers.py python ...`): confluent-kafka (read_committed,
  partitions assigned from the first offset) + json + psycopg2 COPY in one transaction, streaming: a chunk of
  50,000 rows is copied while the next is read. With `--format avro`, the values decoded by confluent-kafka's
  AvroDeserializer through the schema registry instead of json; with `--format protobuf`, by its
  ProtobufDeserializer.
- the Spark peer (`spark-submit tools/benchmark_peers.py spark ...`): Spark Structured Streaming with
  Trigger.AvailableNow and foreachBatch appending to the table over JDBC (`--iceberg-table`: to an Iceberg table of
  the same lake catalog kafka-ledger's Iceberg sink writes); with `--processing-time S` the streaming peer of the
  freshness benchmark (tools/freshness.py): a trigger every S seconds until stopped, each micro-batch's rows tagged
  with its id and its commit time recorded in `<table>_batches` once its JDBC write returned.

tools/benchmark.py runs each in a process of its own, by this file's path, as a hand-written job would run;
it imports nothing of the project but kafka_ledger. The database comes from the environment
(KAFKA_LEDGER_DB_URL for the Python peer, BENCHMARK_DB_USER/PASSWORD for the Spark peer's JDBC writes).

Both write into a fresh table with the primary key (topic, partition, offset), as kafka-ledger's output does.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import queue
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg2
from psycopg2 import sql

from kafka_ledger.config.settings import kafka_client, kafka_for

# The benchmark's records (tools/benchmark.py's produce): one JSON object per record with these fields.
COLUMNS = [
    {"name": "event_id", "type": "string", "required": True},
    {"name": "user_id", "type": "string"},
    {"name": "amount", "type": "long"},
    {"name": "price", "type": "double"},
    {"name": "event_time", "type": "timestamp"},
]
FIELDS = [c["name"] for c in COLUMNS]
TABLE_COLUMNS = ["kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", *FIELDS]


# The same records as Avro values (tools/benchmark.py --format avro), written by confluent-kafka's AvroSerializer.
AVRO_SCHEMA = {"type": "record", "name": "Event", "namespace": "kafka_ledger.benchmark", "fields": [
    {"name": "event_id", "type": "string"}, {"name": "user_id", "type": "string"}, {"name": "amount", "type": "long"},
    {"name": "price", "type": "double"}, {"name": "event_time", "type": {"type": "long",
                                                                          "logicalType": "timestamp-millis"}}]}
EVENT_TIME = datetime(2026, 11, 21, 10, tzinfo=UTC)
# And as Protobuf values (--format protobuf), written by confluent-kafka's ProtobufSerializer.
PROTOBUF_SCHEMA = """syntax = "proto3";
package kafka_ledger.benchmark;
import "google/protobuf/timestamp.proto";
message Event {
  string event_id = 1;
  string user_id = 2;
  int64 amount = 3;
  double price = 4;
  google.protobuf.Timestamp event_time = 5;
}
"""


def protobuf_event_class() -> type:
    """The Event message's class, built from PROTOBUF_SCHEMA as a batch builds a schema (no generated code)."""
    from kafka_ledger.formats.protobuf import message_class

    return message_class(PROTOBUF_SCHEMA, "kafka_ledger.benchmark.Event")


def protobuf_record(event_class: type, i: int, users: int = 5000) -> Any:
    """record(i) as an Event message."""
    fields = record(i, users)
    message = event_class(event_id=fields["event_id"], user_id=fields["user_id"], amount=fields["amount"],
                          price=fields["price"])
    message.event_time.FromDatetime(fields["event_time"])
    return message


def record(i: int, users: int = 5000) -> dict:
    """The benchmark's record `i` (FIELDS), one of `users` distinct user ids."""
    return {"event_id": f"e{i}", "user_id": f"u{i % users}", "amount": i, "price": i / 7, "event_time": EVENT_TIME}


# record(i) as json.dumps writes it, filled in by %-formatting: byte for byte the same value (a float's %r is its repr,
# as json.dumps writes it) at a fifth of the CPU. At 60,000 records/s json.dumps took a fifth of a core of the
# machine the benchmark measures.
_VALUE_TEMPLATE = (b'{"event_id": "e%d", "user_id": "u%d", "amount": %d, "price": %r, '
                   b'"event_time": "2026-11-21T10:00:00Z"}')


def record_value(i: int, users: int = 5000) -> bytes:
    """The benchmark's record `i` as its JSON value (`json.dumps` of `record(i)`, its event time as text)."""
    return _VALUE_TEMPLATE % (i, i % users, i, i / 7)


def create_table(dsn: str, schema: str, table: str, freshness: bool = False) -> None:
    """A fresh table with the primary key (topic, partition, offset); `freshness`: with each row's micro-batch id and
    the table of the micro-batches' commit times (the streaming peer's)."""
    ddl = sql.SQL(
        """
        CREATE SCHEMA IF NOT EXISTS {schema};
        DROP TABLE IF EXISTS {table};
        CREATE TABLE {table} (
            kafka_topic text NOT NULL, kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL,
            kafka_timestamp timestamptz, event_id text, user_id text, amount bigint, price double precision,
            event_time timestamptz, {extra} PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset)
        );
        {batches}
        """
    ).format(schema=sql.Identifier(schema), table=sql.Identifier(schema, table),
             extra=sql.SQL("spark_batch_id bigint," if freshness else ""),
             batches=sql.SQL("DROP TABLE IF EXISTS {0}; CREATE TABLE {0} (spark_batch_id bigint PRIMARY KEY, "
                             "committed_at timestamptz NOT NULL)").format(sql.Identifier(schema, f"{table}_batches"))
             if freshness else sql.SQL(""))
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(ddl)
    conn.close()


def count_rows(dsn: str, schema: str, table: str) -> int:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table)))
        rows = cur.fetchone()[0]
    conn.close()
    return rows


# Rows per COPY of the Python peer: each chunk goes to Postgres while the next one is read.
CHUNK_ROWS = 50_000


def python_peer(servers: str, dsn: str, topic: str, schema: str, table: str, value_format: str = "json") -> None:
    """Read the whole topic with confluent-kafka and COPY its rows into `table` in one transaction, a chunk of
    CHUNK_ROWS at a time while the next chunk is read (a reader thread; librdkafka and the COPY release the GIL).
    The values JSON, Avro (`value_format`) decoded by AvroDeserializer through the schema registry, or Protobuf
    decoded by ProtobufDeserializer (with the message's class, as a hand-written consumer has it)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    decode = json.loads
    if value_format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        protobuf = ProtobufDeserializer(protobuf_event_class(), {"use.deprecated.format": False})
        context = SerializationContext(topic, MessageField.VALUE)

        def decode(value: bytes) -> dict:
            event = protobuf(value, context)
            return {"event_id": event.event_id, "user_id": event.user_id, "amount": event.amount,
                    "price": event.price, "event_time": event.event_time.ToDatetime(tzinfo=UTC).isoformat()}

    elif value_format == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        from kafka_ledger.config.settings import schema_registry

        deserializer, context = AvroDeserializer(schema_registry().client()), SerializationContext(
            topic, MessageField.VALUE)

        def decode(value: bytes) -> dict:
            fields = deserializer(value, context)
            return {**fields, "event_time": fields["event_time"].isoformat()}

    consumer = Consumer(kafka_for(servers).confluent(**{"group.id": f"benchmark-python-peer-{table}",
                                                 "enable.auto.commit": False, "isolation.level": "read_committed",
                                                 "enable.partition.eof": True}))
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    remaining = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in remaining])
    chunks: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=2)

    def read() -> None:
        try:
            buffer, rows = io.StringIO(), 0
            writer = csv.writer(buffer)
            while remaining:
                for message in consumer.consume(num_messages=10_000, timeout=1.0):
                    if message.error() is not None:
                        if message.error().code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(message.error())
                        remaining.discard(message.partition())
                        continue
                    value = decode(message.value())
                    millis = message.timestamp()[1]
                    kafka_time = datetime.fromtimestamp(millis / 1000, UTC).isoformat() if millis >= 0 else None
                    writer.writerow([topic, message.partition(), message.offset(), kafka_time,
                                     *(value.get(f) for f in FIELDS)])
                    rows += 1
                    if message.offset() + 1 >= ends[message.partition()]:
                        remaining.discard(message.partition())
                if rows >= CHUNK_ROWS or (rows and not remaining):
                    chunks.put(buffer.getvalue().encode())
                    buffer, rows = io.StringIO(), 0
                    writer = csv.writer(buffer)
            chunks.put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the COPY side, which raises it
            chunks.put(exc)

    reader = threading.Thread(target=read, name="python-peer-reader", daemon=True)
    reader.start()
    copy = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
        sql.Identifier(schema, table), sql.SQL(", ").join(sql.Identifier(c) for c in TABLE_COLUMNS))
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        while (chunk := chunks.get()) is not None:
            if isinstance(chunk, BaseException):
                raise chunk
            cur.copy_expert(copy, io.BytesIO(chunk), size=1 << 20)
    conn.close()
    reader.join()
    consumer.close()


def copy_floor(dsn: str, schema: str, source: str, table: str) -> float:
    """Seconds of a bare COPY, in one transaction, of `source`'s rows into `table` (created fresh, with the
    primary key): the Postgres half of the physical floor. The rows are read out beforehand, untimed, in binary
    format, the cheapest for Postgres to read (and kafka-ledger's own)."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in TABLE_COLUMNS)
    rows = io.BytesIO()
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.copy_expert(sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT WITH (FORMAT binary)").format(
            columns, sql.Identifier(schema, source)), rows)
    conn.close()
    create_table(dsn, schema, table)
    rows.seek(0)
    conn = psycopg2.connect(dsn)
    started = time.monotonic()
    with conn, conn.cursor() as cur:
        cur.copy_expert(sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(
            sql.Identifier(schema, table), columns), rows, size=1 << 20)
    seconds = time.monotonic() - started
    conn.close()
    return seconds


def _spark_peer(args: argparse.Namespace) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from kafka_ledger.config.services import spark_options


    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    spark = SparkSession.builder.appName(f"benchmark spark peer {args.table}").getOrCreate()
    types = {"string": T.StringType(), "long": T.LongType(), "double": T.DoubleType(), "timestamp": T.TimestampType()}
    schema = T.StructType([T.StructField(c["name"], types[c["type"]]) for c in COLUMNS])
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.servers)
        .options(**spark_options(dict(kafka_client().settings)))
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .load()
    )
    rows = stream.select(
        F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"),
        F.from_json(F.col("value").cast("string"), schema).alias("v"),
    ).select("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "v.*")

    def append(batch, batch_id: int) -> None:  # noqa: ANN001 - a Spark DataFrame
        if args.processing_time:
            batch = batch.withColumn("spark_batch_id", F.lit(batch_id).cast("long"))
        if args.iceberg_table:  # the lake's catalog (spark-defaults.conf), the table made by the first batch
            writer = batch.writeTo(args.iceberg_table)
            writer.append() if spark.catalog.tableExists(args.iceberg_table) else writer.create()
            return
        (batch.write.format("jdbc").option("url", args.jdbc_url).option("dbtable", f"{args.schema}.{args.table}")
         .option("user", os.environ["BENCHMARK_DB_USER"]).option("password", os.environ["BENCHMARK_DB_PASSWORD"])
         .option("driver", "org.postgresql.Driver").option("batchsize", "10000").mode("append").save())
        if args.processing_time:  # the write returned: its rows are committed
            with psycopg2.connect(os.environ["KAFKA_LEDGER_DB_URL"]) as conn, conn.cursor() as cur:
                cur.execute(sql.SQL("INSERT INTO {} VALUES (%s, clock_timestamp()) ON CONFLICT DO NOTHING").format(
                    sql.Identifier(args.schema, f"{args.table}_batches")), (batch_id,))
            conn.close()

    trigger = {"processingTime": f"{args.processing_time} seconds"} if args.processing_time else {"availableNow": True}
    query = (rows.writeStream.foreachBatch(append).trigger(**trigger)
             .option("checkpointLocation", args.checkpoint).start())
    query.awaitTermination()
    spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The benchmark's peers, each run as its own program.")
    peers = parser.add_subparsers(dest="peer", required=True)
    python = peers.add_parser("python", help="confluent-kafka + json + COPY in chunks while reading, one transaction")
    python.add_argument("--format", choices=["json", "avro", "protobuf"], default="json",
                        help="the values' format: avro, decoded by AvroDeserializer through the schema registry; "
                             "protobuf, by ProtobufDeserializer")
    spark = peers.add_parser("spark", help="Structured Streaming AvailableNow + foreachBatch JDBC (spark-submit)")
    for sub in (python, spark):
        for name in ("--servers", "--topic", "--schema", "--table"):
            sub.add_argument(name, required=True)
    spark.add_argument("--jdbc-url", required=True)
    spark.add_argument("--checkpoint", required=True)
    spark.add_argument("--processing-time", type=int, metavar="S",
                       help="a trigger every S seconds until stopped, instead of once over what the topic holds")
    spark.add_argument("--iceberg-table", help="append to this Iceberg table (catalog.namespace.table) instead of "
                                               "the Postgres one")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.peer == "python":
        python_peer(args.servers, os.environ["KAFKA_LEDGER_DB_URL"], args.topic, args.schema, args.table,
                    args.format)
    else:
        _spark_peer(args)
    print(json.dumps({"seconds": round(time.monotonic() - started, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
