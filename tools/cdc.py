"""Change data capture on the local stack: the source database Debezium captures (the stack's `cdc` database), and
Debezium's PostgreSQL connector on the stack's Kafka Connect worker, registered and removed through its REST API."""

from __future__ import annotations

import base64
import json
import random
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as time_of_day
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from tools import stack_env
from tools.stack import stack_command

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"


def source_dsn() -> str:
    """The source database as its own role sees it (over TLS, as the stack's Postgres requires of it)."""
    return (f"host=127.0.0.1 port={stack_env('KL_PG_PORT')} dbname=cdc user=cdc "
            f"password={stack_env('KL_PG_CDC_PASSWORD')} sslmode=verify-full "
            f"sslrootcert={stack_env('KL_TLS_DIR')}/ca.pem")


def worker_url() -> str:
    return f"http://127.0.0.1:{stack_env('KL_KAFKA_CONNECT_PORT')}"


def start_worker() -> None:
    """Start the stack's Kafka Connect worker unless it runs (scripts/stack.sh kafka-connect)."""
    stack_command("kafka-connect")


def _password_file() -> Path:
    """The file the worker's FileConfigProvider reads the source database's password from (scripts/stack.sh)."""
    return Path(stack_env("KL_STATE")) / "kafka-connect" / "source-db.properties"


def _request(method: str, path: str, body: dict | None = None) -> Any:
    """A request to the worker's REST API, with its user's credentials (basic authentication)."""
    user, password = stack_env("KL_KAFKA_CONNECT_USER"), stack_env("KL_KAFKA_CONNECT_PASSWORD")
    credentials = base64.b64encode(f"{user}:{password}".encode())
    request = urllib.request.Request(worker_url() + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Accept": "application/json",
                                              "Authorization": f"Basic {credentials.decode()}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"Kafka Connect {method} {path}: HTTP {exc.code}: {exc.read().decode()[:500]}") from None
    return json.loads(text) if text else None


@dataclass(frozen=True)
class Capture:
    """One Debezium connector capturing `tables` of the source database into `<topic_prefix>.<schema>.<table>`,
    values as JsonConverter writes them (`value_schemas`: with its {schema, payload} wrapper). Its replication slot
    and publication are its own, dropped when it is removed; `keep_slot`: kept while the worker is stopped too (the
    changes made meanwhile are captured when it starts again), else dropped when its task stops."""

    name: str
    topic_prefix: str
    tables: tuple[str, ...]
    value_schemas: bool = False
    partitions: int = 3
    keep_slot: bool = False
    # JSON has no decimal type: with `string`, a numeric's digits as text, exact without the schema; with Debezium's
    # default, `precise`, its unscaled bytes, the scale in the schema (value_schemas).
    decimal_handling_mode: str = "string"
    # Debezium's default, numeric, counts a month as 30.4375 days: string (ISO-8601 text) keeps an interval exact.
    interval_handling_mode: str = "numeric"
    time_precision_mode: str = "adaptive"
    binary_handling_mode: str = "bytes"
    # json: the JsonConverter; avro: Apicurio's AvroConverter, registering each table's schema in the stack's
    # registry and framing values as Confluent's serializers do (the id one the registry's Confluent API resolves).
    value_format: str = "json"

    @property
    def slot(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in self.name.lower())

    def topic(self, table: str) -> str:
        return f"{self.topic_prefix}.{table}"

    def config(self) -> dict[str, str]:
        """The connector's config: the password is a reference the worker resolves, never the password."""
        return {
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": "1",
            "plugin.name": "pgoutput",
            "database.hostname": "127.0.0.1",
            "database.port": stack_env("KL_PG_PORT"),
            "database.user": "cdc",
            "database.password": f"${{file:{_password_file()}:password}}",
            "database.dbname": "cdc",
            "database.sslmode": "verify-full",
            "database.sslrootcert": f"{stack_env('KL_TLS_DIR')}/ca.pem",
            "topic.prefix": self.topic_prefix,
            "table.include.list": ",".join(self.tables),
            "slot.name": self.slot,
            # A slot nobody reads keeps the source's WAL: dropped with the task unless the capture must go on.
            "slot.drop.on.stop": str(not self.keep_slot).lower(),
            "publication.name": f"{self.slot}_publication",
            "publication.autocreate.mode": "filtered",
            "snapshot.mode": "initial",
            "decimal.handling.mode": self.decimal_handling_mode,
            "interval.handling.mode": self.interval_handling_mode,
            "time.precision.mode": self.time_precision_mode,
            "binary.handling.mode": self.binary_handling_mode,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "false",
            **(self._avro_values() if self.value_format == "avro" else {
                "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                "value.converter.schemas.enable": str(self.value_schemas).lower()}),
            "topic.creation.default.partitions": str(self.partitions),
            "topic.creation.default.replication.factor": "1",
        }

    @staticmethod
    def _avro_values() -> dict[str, str]:
        return {
            "value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
            "value.converter.apicurio.registry.url":
                f"http://127.0.0.1:{stack_env('KL_SCHEMA_REGISTRY_PORT')}/apis/registry/v2",
            "value.converter.apicurio.registry.auto-register": "true",
            "value.converter.apicurio.registry.find-latest": "true",
            # Confluent's framing (a 4-byte id in the value, no headers), the id a content id, as the registry's
            # Confluent API counts them.
            "value.converter.apicurio.registry.as-confluent": "true",
            "value.converter.apicurio.registry.headers.enabled": "false",
            "value.converter.apicurio.registry.use-id": "contentId",
            # Avro names allow no hyphen, which topic prefixes do: Debezium's adjustment for Avro replaces it.
            "schema.name.adjustment.mode": "avro",
        }

    def register(self, timeout: float = 120) -> None:
        """Create (or update) the connector and wait until it and its task run."""
        _request("PUT", f"/connectors/{self.name}/config", self.config())
        self._wait_running(timeout)

    def start_afresh(self, timeout: float = 120) -> None:
        """Create the connector with no offsets (the worker keeps a deleted connector's offsets under its name: they
        would point into a slot that is gone), so that it starts with a snapshot; and wait until it runs."""
        if self.exists():
            self.remove()
        _request("POST", "/connectors", {"name": self.name, "config": self.config(), "initial_state": "STOPPED"})
        self._wait_state("STOPPED", timeout)
        _request("DELETE", f"/connectors/{self.name}/offsets")
        _request("PUT", f"/connectors/{self.name}/resume")
        self._wait_running(timeout)

    def _wait_state(self, state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (status := self.status()) is None or status["connector"]["state"] != state:
            if time.monotonic() > deadline:
                raise RuntimeError(f"connector {self.name} not {state} after {timeout:.0f} s: {status}")
            time.sleep(0.3)

    def _wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            tasks = status.get("tasks", []) if status else []
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed:
                raise RuntimeError(f"connector {self.name}: task failed: {failed[0].get('trace', '')[:2000]}")
            if status and status["connector"]["state"] == "RUNNING" and tasks and \
                    all(t["state"] == "RUNNING" for t in tasks):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"connector {self.name} not running after {timeout:.0f} s: {status}")
            time.sleep(0.5)

    def exists(self) -> bool:
        return self.status() is not None

    def slot_exists(self) -> bool:
        """Whether its replication slot exists (a kept slot outlives a worker's restart, which forgets its
        connectors: a standalone worker keeps their offsets only)."""
        import psycopg2

        with psycopg2.connect(source_dsn()) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
            found = cur.fetchone() is not None
        conn.close()
        return found

    def failed(self) -> bool:
        """Whether the connector or a task of it failed (e.g. its replication slot is gone)."""
        status = self.status() or {}
        states = [status.get("connector", {}).get("state"), *(t.get("state") for t in status.get("tasks", []))]
        return "FAILED" in states

    def status(self) -> dict | None:
        try:
            return _request("GET", f"/connectors/{self.name}/status")
        except RuntimeError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def shown_config(self) -> dict[str, str]:
        """The connector's config as the REST API shows it."""
        return _request("GET", f"/connectors/{self.name}/config")

    def remove(self, timeout: float = 60) -> None:
        """Delete the connector, then its replication slot and publication once its task let go of them."""
        import psycopg2

        if self.exists():
            # Stopped first, so that its offsets can be deleted with it: a connector of the same name later starts
            # afresh.
            _request("PUT", f"/connectors/{self.name}/stop")
            self._wait_state("STOPPED", timeout)
            _request("DELETE", f"/connectors/{self.name}/offsets")
            _request("DELETE", f"/connectors/{self.name}")
        deadline = time.monotonic() + timeout
        with psycopg2.connect(source_dsn()) as conn, conn.cursor() as cur:
            conn.autocommit = True
            while True:
                cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
                row = cur.fetchone()
                if row is None:
                    break
                if not row[0]:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replication slot {self.slot} still in use {timeout:.0f} s after its "
                                       "connector was deleted")
                time.sleep(0.5)
            cur.execute(f'DROP PUBLICATION IF EXISTS "{self.slot}_publication"')
        conn.close()


def records_in(servers: str, topic: str) -> int:
    """How many records `topic` holds (0 when it does not exist yet)."""
    return _count(servers, topic, expected=None)


def wait_for_records(servers: str, topic: str, expected: int, timeout: float = 120) -> None:
    """Wait until `topic` holds `expected` records (Debezium's events of a known workload), no more."""
    _count(servers, topic, expected, timeout)


def _count(servers: str, topic: str, expected: int | None, timeout: float = 120) -> int:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from kafka_ledger.config.settings import kafka_for

    consumer = Consumer(kafka_for(servers).confluent(**{"group.id": "kafka-ledger-cdc-wait",
                                                        "enable.auto.commit": False}))
    deadline = time.monotonic() + timeout
    held = 0
    try:
        while True:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is not None and metadata.error is None and metadata.partitions:
                try:
                    held = sum(_held(consumer, TopicPartition(topic, partition)) for partition in metadata.partitions)
                except KafkaException:
                    # A topic Debezium has just created may not have its leader yet: ask again, until the deadline.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
                    continue
            if expected is None or held == expected:
                return held
            if held > expected:
                raise RuntimeError(f"{topic} holds {held} records, more than the {expected} expected")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic} holds {held} of the {expected} records expected after {timeout:.0f} s")
            time.sleep(0.5)
    finally:
        consumer.close()


def _held(consumer: Any, partition: Any) -> int:
    low, high = consumer.get_watermark_offsets(partition, timeout=10)
    return high - low


# --- a source table and changes to it ----------------------------------------------------------------------------

SOURCE_COLUMNS = ("id", "email", "city", "balance", "updated_at")


def create_source_table(cur: Any, table: str, replica_identity: str = "DEFAULT") -> None:
    """(Re)create a source table of customers, with the REPLICA IDENTITY Debezium's deletes read their key from."""
    cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, email text NOT NULL, city text, balance numeric(12,2), "
                "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())")
    cur.execute(f"ALTER TABLE {table} REPLICA IDENTITY {replica_identity}")


def populate_source(cur: Any, table: str, rows: int) -> None:
    """Insert rows 1..`rows` in one statement (a snapshot's worth: Debezium reads them as op r when it starts)."""
    cur.execute(f"INSERT INTO {table} (id, email, city, balance) SELECT i, 'user' || i || '@example.org', "
                "(ARRAY['Lyon', 'Oslo', 'Porto', NULL])[1 + mod(i, 4)], mod(i, 100000) / 100.0 "
                "FROM generate_series(1, %s) AS i", (rows,))


def source_rows(cur: Any, table: str, columns: tuple[str, ...] = SOURCE_COLUMNS) -> dict[int, tuple]:
    """The source table's rows by id: (email, city, balance, updated_at), or the other `columns` after the id."""
    cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
    return {row[0]: tuple(row[1:]) for row in cur.fetchall()}


# The events Debezium writes for each change: an insert or update one; a delete its event and the tombstone after
# it; a primary-key change a delete (and tombstone) of the old key and a create of the new one.
EVENTS = {"insert": 1, "update": 1, "delete": 2, "key change": 3}


def change_source(cur: Any, table: str, rng: Any, changes: int, next_id: int) -> tuple[Counter, int]:
    """`changes` random inserts, updates, deletes (some of them re-inserted later, as new ids or old ones) and
    primary-key changes on the source table, one transaction each; (the changes made by kind, the next free id)."""
    cur.execute(f"SELECT id FROM {table}")
    live = [row[0] for row in cur.fetchall()]
    deleted: list[int] = []
    made: Counter = Counter()
    cities = ["Lyon", "Oslo", "Porto", None]
    for _ in range(changes):
        roll = rng.random()
        if not live or roll < 0.3:
            # A new id, or one deleted earlier coming back.
            new = deleted.pop() if deleted and rng.random() < 0.3 else next_id
            next_id = max(next_id, new + 1)
            balance = f"{rng.randrange(-10**6, 10**6) / 100:.2f}"
            cur.execute(f"INSERT INTO {table} (id, email, city, balance) VALUES (%s, %s, %s, %s)",
                        (new, f"user{new}@example.org", rng.choice(cities), balance))
            live.append(new)
            made["insert"] += 1
        elif roll < 0.8:
            target = rng.choice(live)
            cur.execute(f"UPDATE {table} SET email = %s, city = %s, balance = balance + 1.25, "
                        "updated_at = clock_timestamp() WHERE id = %s",
                        (f"user{target}.{rng.randrange(1000)}@example.org", rng.choice(cities), target))
            made["update"] += 1
        elif roll < 0.95:
            target = live.pop(rng.randrange(len(live)))
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (target,))
            deleted.append(target)
            made["delete"] += 1
        else:
            next_id = change_key(cur, table, live, rng, next_id)
            made["key change"] += 1
    return made, next_id


def _delete_or_change_key(cur: Any, table: str, live: list[int], rng: Any, next_id: int, made: Counter,
                          delete: bool) -> int:
    """Delete a random live row, or give one the next free id (counted in `made`); returns the next free id."""
    if delete:
        cur.execute(f"DELETE FROM {table} WHERE id = %s", (live.pop(rng.randrange(len(live))),))
        made["delete"] += 1
        return next_id
    made["key change"] += 1
    return change_key(cur, table, live, rng, next_id)


def change_key(cur: Any, table: str, live: list[int], rng: Any, next_id: int) -> int:
    """Give a random live row the next free id (a primary-key change: Debezium's delete of the old key and create
    of the new one); returns the next free id."""
    old = live.pop(rng.randrange(len(live)))
    cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (next_id, old))
    live.append(next_id)
    return next_id + 1


def events_of(changes: Counter) -> int:
    """How many records Debezium writes for `changes`."""
    return sum(EVENTS[kind] * count for kind, count in changes.items())


# --- a source table with TOASTed values ---------------------------------------------------------------------------
# Values over about 2 KB are TOASTed: an UPDATE that leaves one unchanged logs no copy of it (REPLICA IDENTITY
# DEFAULT), and Debezium's event holds its placeholder instead, in text, jsonb, array and bytea columns alike; so does
# the create event of a primary-key change.

TOASTED_COLUMNS = ("id", "n", "note", "doc", "tags", "raw")
# As a pipeline declares them today: jsonb as its JSON text, bytea as the JsonConverter's base64, an array as JSON.
TOASTED_DECLARED = [
    {"name": "id", "type": "long"},
    {"name": "n", "type": "int", "required": True},
    {"name": "note", "type": "string"},
    {"name": "doc", "type": "string"},
    {"name": "tags", "type": "jsonb"},
    {"name": "raw", "type": "string"},
]


def create_toasted_table(cur: Any, table: str, replica_identity: str = "DEFAULT") -> None:
    cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, n int NOT NULL, note text, doc jsonb, tags text[], "
                "raw bytea)")
    cur.execute(f"ALTER TABLE {table} REPLICA IDENTITY {replica_identity}")


def _toasted_values(rng: Any) -> tuple:
    """A row's note, doc, tags and raw: each long (TOASTed: random text does not compress below 2 KB) or short."""
    def text(big: bool) -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzéß0123456789") for _ in range(
            rng.randrange(2500, 7000) if big else rng.randrange(0, 40)))

    doc = {"text": text(rng.random() < 0.6), "n": rng.randrange(10**6)}
    tags = [text(rng.random() < 0.3) for _ in range(rng.randrange(0, 3))]
    raw = bytes(rng.randrange(256) for _ in range(rng.randrange(2500, 6000) if rng.random() < 0.5 else 16))
    return (text(rng.random() < 0.7) if rng.random() < 0.9 else None, json.dumps(doc), tags,
            raw if rng.random() < 0.9 else None)


def change_toasted_source(cur: Any, table: str, rng: Any, changes: int, next_id: int) -> tuple[Counter, int]:
    """`changes` random changes to a TOASTed table, one transaction each: inserts, updates of `n` alone (every
    TOASTed value unchanged: placeholders), updates of one TOASTed column (the others unchanged), deletes, primary-key
    changes (often of a row just updated, and sometimes twice in a row: the create's placeholders then come from the
    row the change moved). Returns (the changes made by kind, the next free id)."""
    import psycopg2

    cur.execute(f"SELECT id FROM {table}")
    live = [row[0] for row in cur.fetchall()]
    made: Counter = Counter()
    for _ in range(changes):
        roll = rng.random()
        if not live or roll < 0.2:
            note, doc, tags, raw = _toasted_values(rng)
            cur.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)",
                        (next_id, rng.randrange(1000), note, doc, tags, psycopg2.Binary(raw) if raw else None))
            live.append(next_id)
            next_id += 1
            made["insert"] += 1
        elif roll < 0.6:
            cur.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (rng.choice(live),))
            made["update"] += 1
        elif roll < 0.72:
            note, doc, tags, raw = _toasted_values(rng)
            column, value = rng.choice([("note", note), ("doc", doc), ("tags", tags),
                                        ("raw", psycopg2.Binary(raw) if raw else None)])
            cur.execute(f"UPDATE {table} SET {column} = %s, n = n + 1 WHERE id = %s", (value, rng.choice(live)))
            made["update"] += 1
        elif roll < 0.82:
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (live.pop(rng.randrange(len(live))),))
            made["delete"] += 1
        else:
            old = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.5:
                cur.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (old,))
                made["update"] += 1
            for _ in range(2 if rng.random() < 0.3 else 1):
                cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (next_id, old))
                made["key change"] += 1
                old, next_id = next_id, next_id + 1
            live.append(old)
    return made, next_id


def toasted_rows(cur: Any, table: str) -> dict[int, tuple]:
    """The TOASTed table's rows by id, as the declared columns (TOASTED_DECLARED) hold them: (n, note, doc's JSON text,
    tags, raw in base64)."""
    cur.execute(f"SELECT id, n, note, doc::text, to_jsonb(tags), encode(raw, 'base64') FROM {table}")
    return {row[0]: (row[1], row[2], row[3], row[4], None if row[5] is None else row[5].replace("\n", ""))
            for row in cur.fetchall()}


def records_with(servers: str, topic: str, needle: bytes) -> int:
    """How many of the topic's records hold `needle` in their value (read with a consumer of its own)."""
    from confluent_kafka import Consumer, TopicPartition

    from kafka_ledger.config.settings import kafka_for

    consumer = Consumer(kafka_for(servers).confluent(**{"group.id": "kafka-ledger-cdc-look",
                                                        "enable.auto.commit": False}))
    found = 0
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            read = low
            while read < high:
                message = consumer.poll(10)
                if message is None:
                    raise RuntimeError(f"{topic}-{partition}: no record at offset {read} within 10 s")
                if message.error() is None:
                    found += needle in (message.value() or b"")
                    read = message.offset() + 1
    finally:
        consumer.close()
    return found


# --- a source table of PostgreSQL's everyday types -----------------------------------------------------------------
# Each column declared as its source column is (docs/configuration.md: Debezium's settings), read from events written
# with Debezium's defaults but decimal.handling.mode=string (JSON has no other exact numeric).

TYPED_DDL = """
    id bigint PRIMARY KEY, j json, jb jsonb, d date, ts0 timestamp(0), ts3 timestamp(3), ts6 timestamp,
    tstz timestamptz, t3 time(3), t6 time, n numeric(12,2), nv numeric, m money, b bytea, u uuid,
    e kl_mood, ai int[], at text[], r real, dp double precision, sm smallint, bo boolean, vc varchar(20), ch char(3),
    ip inet, big numeric(38,10), iv interval, note text"""
# Declared as config/pipelines.yaml's everyday_types pipeline declares them (the demo's): one home for the list.
TYPED_DECLARED: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "config" / "pipelines.yaml").read_text())["pipelines"]["everyday_types"][
    "columns"]
TYPED_COLUMNS = tuple(c["name"] for c in TYPED_DECLARED)
# The source's values as the entity table holds them (the same SELECT on both: jsonb for json and arrays, numeric for
# money, double for real, the output form of inet and text of the enum).
TYPED_SELECT = ("id, j::jsonb, jb, d, ts0, ts3, ts6, tstz, t3, t6, n, nv, m::numeric, b, u, e::text, "
                "to_jsonb(ai), to_jsonb(at), r::float8, dp, sm, bo, vc, ch, nullif(format('%s', ip), ''), big, "
                "iv::text, note")
ENTITY_SELECT = ("id, j, jb, d, ts0, ts3, ts6, tstz, t3, t6, n, nv, m, b, u, e, ai, at, r, dp, sm, bo, vc, ch, "
                 "ip, big, iv::text, note")


def create_typed_table(cur: Any, table: str, replica_identity: str = "DEFAULT") -> None:
    cur.execute("DO $$ BEGIN CREATE TYPE kl_mood AS ENUM ('sad', 'ok', 'happy'); "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(f"CREATE TABLE {table} ({TYPED_DDL})")
    cur.execute(f"ALTER TABLE {table} REPLICA IDENTITY {replica_identity}")


def _typed_values(rng: Any) -> dict[str, Any]:
    """One row's values, edges among them: empty and nested JSON, the years' ends, a day's last microsecond, negative
    and tiny numerics, NULLs, unicode, a TOASTed text now and then."""
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    micros = rng.randrange(0, 86_400_000_000)
    day = rng.randrange(-25_000, 80_000)
    at = f"{1970 + day // 365:04d}-{1 + rng.randrange(12):02d}-{1 + rng.randrange(28):02d}"
    clock = f"{micros // 3_600_000_000:02d}:{micros // 60_000_000 % 60:02d}:{micros // 1_000_000 % 60:02d}"
    fraction = f"{micros % 1_000_000:06d}"
    return {
        "j": maybe(json.dumps(rng.choice([{}, {"a": [1, 2.5, None, "x"]}, [1, {"b": {"c": True}}], "text", 7]))),
        "jb": maybe(json.dumps({"k": rng.randrange(10**6), "nested": {"list": [rng.random() < 0.5, "é"]}})),
        "d": maybe(rng.choice(["1900-01-01", "2199-12-31", at])),
        "ts0": maybe(f"{at} {clock}"), "ts3": maybe(f"{at} {clock}.{fraction[:3]}"),
        "ts6": maybe(rng.choice([f"{at} {clock}.{fraction}", "1900-01-01 00:00:00.000001"])),
        "tstz": maybe(f"{at} {clock}.{fraction}+0{rng.randrange(10)}:00"),
        "t3": maybe(f"{clock}.{fraction[:3]}"), "t6": maybe(rng.choice([f"{clock}.{fraction}", "23:59:59.999999"])),
        "n": maybe(f"{rng.randrange(-10**11, 10**11) / 100:.2f}"),
        "nv": maybe(rng.choice(["3.14159265358979323846", "-0.00000000000000000001", "0", "123456789012345678"])),
        "m": maybe(f"{rng.randrange(-10**8, 10**8) / 100:.2f}"),
        "b": maybe(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))),
        "u": maybe(str(uuid.UUID(int=rng.getrandbits(128)))), "e": maybe(rng.choice(["sad", "ok", "happy"])),
        "ai": maybe(rng.choice([[], [1, 2, None], [-(2**31)]])), "at": maybe(rng.choice([[], ["a b", None, "ç"]])),
        "r": maybe(rng.choice([1.5, -2.25, 0.0])), "dp": maybe(rng.choice([0.1, -1e-300, 12345.678901234])),
        "sm": maybe(rng.randrange(-32768, 32768)), "bo": maybe(rng.random() < 0.5),
        "vc": maybe(rng.choice(["héllo", "", "a\"b'c"])), "ch": maybe(rng.choice(["ab", "xyz"])),
        "ip": maybe(rng.choice(["192.168.0.1/24", "::1/128"])),
        "big": maybe(f"{rng.randrange(-10**27, 10**27)}.{rng.randrange(10**10):010d}"),
        "iv": maybe(rng.choice(["1 mon", "-1 years -2 mons +3 days -04:05:06.78", "00:00:00.000001", "36:00:00",
                                "2 days", "-00:00:03.5", "178000000 years"])),
        "note": maybe(rng.choice(["short", "".join(rng.choice("abcdef0123") for _ in range(rng.randrange(3000,
                                                                                                         5000)))])),
    }


def change_typed_source(cur: Any, table: str, rng: Any, changes: int, next_id: int) -> tuple[Counter, int]:
    """`changes` random inserts, updates (of some columns: the TOASTed note often left unchanged), deletes and
    primary-key changes on the typed table, one transaction each; (the changes made by kind, the next free id)."""
    import psycopg2

    cur.execute(f"SELECT id FROM {table}")
    live = [row[0] for row in cur.fetchall()]
    made: Counter = Counter()
    names = TYPED_COLUMNS[1:]

    def adapt(name: str, value: Any) -> Any:
        return psycopg2.Binary(value) if name == "b" and value is not None else value

    for _ in range(changes):
        roll = rng.random()
        values = _typed_values(rng)
        if not live or roll < 0.3:
            cur.execute(f"INSERT INTO {table} (id, {', '.join(names)}) VALUES (%s{', %s' * len(names)})",
                        (next_id, *[adapt(n, values[n]) for n in names]))
            live.append(next_id)
            next_id += 1
            made["insert"] += 1
        elif roll < 0.75:
            chosen = rng.sample([n for n in names if n != "note"], rng.randrange(1, 6))
            cur.execute(f"UPDATE {table} SET {', '.join(f'{n} = %s' for n in chosen)} WHERE id = %s",
                        (*[adapt(n, values[n]) for n in chosen], rng.choice(live)))
            made["update"] += 1
        else:
            next_id = _delete_or_change_key(cur, table, live, rng, next_id, made, delete=roll < 0.9)
    return made, next_id


# A table whose columns a pipeline leaves to the JsonConverter's schema (Debezium's defaults): the types a schema
# names (no numeric without a declared scale: its schema has none), the derived columns its events give, and a
# SELECT that holds each value alike in the source and in the entity table (text for an interval and money).
DERIVED_DDL = """
    id bigint PRIMARY KEY, d date, ts3 timestamp(3), ts6 timestamp, tstz timestamptz, t3 time(3), t6 time,
    n numeric(12,2), m money, u uuid, jb jsonb, ai int[], iv interval, b bytea, e kl_mood, sm smallint, r real,
    bo boolean, note text NOT NULL"""
DERIVED_COLUMNS = [
    {"name": "id", "type": "long", "required": True}, {"name": "d", "type": "date"},
    {"name": "ts3", "type": "local_timestamp(3)"}, {"name": "ts6", "type": "local_timestamp"},
    {"name": "tstz", "type": "timestamp"}, {"name": "t3", "type": "time(3)"}, {"name": "t6", "type": "time"},
    {"name": "n", "type": "decimal(12,2)"}, {"name": "m", "type": "decimal(38,2)"}, {"name": "u", "type": "uuid"},
    {"name": "jb", "type": "jsonb"}, {"name": "ai", "type": "jsonb"}, {"name": "iv", "type": "interval"},
    {"name": "b", "type": "bytes"}, {"name": "e", "type": "string"}, {"name": "sm", "type": "int"},
    {"name": "r", "type": "double"}, {"name": "bo", "type": "boolean"},
    {"name": "note", "type": "string", "required": True},
]
DERIVED_SELECT = ("id, d, ts3, ts6, tstz, t3, t6, n, {m}, u, jb, {ai}, iv::text, b, {e}, sm, {r}, bo, note")


def create_derived_table(cur: Any, table: str) -> None:
    cur.execute("DO $$ BEGIN CREATE TYPE kl_mood AS ENUM ('sad', 'ok', 'happy'); "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(f"CREATE TABLE {table} ({DERIVED_DDL})")


def change_derived_source(cur: Any, table: str, rng: Any, changes: int, next_id: int) -> tuple[Counter, int]:
    """`changes` random inserts, updates, deletes and key changes on the derived table (values as the typed table's);
    (the changes made by kind, the next free id)."""
    import psycopg2

    names = [c["name"] for c in DERIVED_COLUMNS[1:]]
    cur.execute(f"SELECT id FROM {table}")
    live = [row[0] for row in cur.fetchall()]
    made: Counter = Counter()
    for _ in range(changes):
        values = {**_typed_values(rng), "note": f"note {rng.randrange(10**6)}"}
        row = [psycopg2.Binary(values[n]) if n == "b" and values[n] is not None else values[n] for n in names]
        roll = rng.random()
        if not live or roll < 0.4:
            cur.execute(f"INSERT INTO {table} (id, {', '.join(names)}) VALUES (%s{', %s' * len(names)})",
                        (next_id, *row))
            live.append(next_id)
            next_id += 1
            made["insert"] += 1
        elif roll < 0.8:
            cur.execute(f"UPDATE {table} SET {', '.join(f'{n} = %s' for n in names)} WHERE id = %s",
                        (*row, rng.choice(live)))
            made["update"] += 1
        else:
            next_id = _delete_or_change_key(cur, table, live, rng, next_id, made, delete=roll < 0.92)
    return made, next_id


def derived_rows(cur: Any, table: str, source: bool) -> dict[int, tuple]:
    """The derived table's rows by id, alike in the source (`source`) and in the entity table."""
    select = DERIVED_SELECT.format(m="m::numeric" if source else "m", ai="to_jsonb(ai)" if source else "ai",
                                   e="e::text" if source else "e", r="r::float8" if source else "r")
    return typed_rows(cur, table, select)


def typed_rows(cur: Any, table: str, select: str = TYPED_SELECT) -> dict[int, tuple]:
    """A typed table's rows by id, as `select` gives them (the source's: TYPED_SELECT; an entity table's:
    ENTITY_SELECT)."""
    cur.execute(f"SELECT {select} FROM {table}")
    return {row[0]: tuple(bytes(v) if isinstance(v, memoryview) else v for v in row[1:]) for row in cur.fetchall()}


# --- the typed table's change events, made by hand ------------------------------------------------------------------
# As Debezium's connector writes them without the JsonConverter's schemas, numerics as text; the time precision and
# bytea's base64 are its defaults (a benchmark's and a campaign's millions of events, with no source table behind).
TYPED_DEBEZIUM = {"decimal.handling.mode": "string", "interval.handling.mode": "string",
                  "value.converter.schemas.enable": False}
_EPOCH = datetime(1970, 1, 1)


def typed_image(seq: int) -> dict[str, tuple[Any, Any]]:
    """Row image `seq` of the typed table (but its id, jsonb and note), each value (as Debezium writes it in JSON
    without schemas, TYPED_DEBEZIUM, as an entity table of TYPED_DECLARED holds it): edges among them (the day's last
    microsecond, dates before 1970 and far ahead, negative and tiny numerics, NULLs, unicode)."""
    rng = random.Random(seq)

    def maybe(wire: Any, held: Any) -> tuple[Any, Any]:
        return (None, None) if rng.random() < 0.08 else (wire, held)

    day = rng.randrange(-25_000, 80_000)
    micros_of_day = rng.choice([rng.randrange(86_400_000_000), 86_399_999_999, 0])
    seconds_of_day, millis_of_day = micros_of_day // 1_000_000, micros_of_day // 1000
    instant = day * 86_400_000_000 + micros_of_day
    at = _EPOCH + timedelta(microseconds=instant)
    cents, money, big = rng.randrange(-10**11, 10**11), rng.randrange(-10**8, 10**8), rng.randrange(-10**37, 10**37)
    raw = rng.randbytes(rng.randrange(0, 40))
    document = rng.choice([{}, {"a": [1, 2.5, None, "x"]}, [1, {"b": {"c": True}}], "text", 7])
    words = rng.choice([[], ["a b", None, "ç"], ["\"quoted\""]])
    number = rng.choice([[], [1, 2, None], [-(2**31)]])
    key = str(uuid.UUID(int=rng.getrandbits(128)))
    months, span_days, span_micros = rng.randrange(40), rng.randrange(40), rng.randrange(200_000_000_000)
    return {
        "j": maybe(json.dumps(document), document),
        "d": maybe(day, date(1970, 1, 1) + timedelta(days=day)),
        "ts0": maybe(day * 86_400_000 + seconds_of_day * 1000, _EPOCH + timedelta(days=day, seconds=seconds_of_day)),
        "ts3": maybe(day * 86_400_000 + millis_of_day, _EPOCH + timedelta(days=day, milliseconds=millis_of_day)),
        "ts6": maybe(instant, at),
        "tstz": maybe(at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), at.replace(tzinfo=UTC)),
        "t3": maybe(millis_of_day, _time_of(millis_of_day * 1000)),
        "t6": maybe(micros_of_day, _time_of(micros_of_day)),
        "n": maybe(_decimal_text(cents, 2), Decimal(_decimal_text(cents, 2))),
        "nv": maybe(*(lambda t: (t, Decimal(t)))(rng.choice(["3.14159265358979323846", "-0.00000000000000000001",
                                                              "0", "123456789012345678"]))),
        "m": maybe(_decimal_text(money, 2), Decimal(_decimal_text(money, 2))),
        "b": maybe(base64.b64encode(raw).decode(), raw),
        "u": maybe(key, key),
        "e": maybe(*[rng.choice(["sad", "ok", "happy"])] * 2),
        "ai": maybe(number, number),
        "at": maybe(words, words),
        "r": maybe(*[rng.choice([1.5, -2.25, 0.0])] * 2),
        "dp": maybe(*[rng.choice([0.1, -1e-300, 12345.678901234])] * 2),
        "sm": maybe(*[rng.randrange(-32768, 32768)] * 2),
        "bo": maybe(*[rng.random() < 0.5] * 2),
        "vc": maybe(*[rng.choice(["héllo", "", "a\"b'c"])] * 2),
        "ch": maybe(*[rng.choice(["ab ", "xyz"])] * 2),
        "ip": maybe(*[rng.choice(["192.168.0.1/24", "::1/128"])] * 2),
        "big": maybe(_decimal_text(big, 10), Decimal(_decimal_text(big, 10))),
        # As Debezium's interval.handling.mode string writes it; held as psycopg2 reads an interval back (a year 365
        # days, a month 30).
        "iv": maybe(f"P{months // 12}Y{months % 12}M{span_days}DT0H0M{span_micros // 1_000_000}."
                    f"{span_micros % 1_000_000:06d}S",
                    timedelta(days=months // 12 * 365 + months % 12 * 30 + span_days, microseconds=span_micros)),
    }


def _time_of(micros: int) -> time_of_day:
    return (datetime.min + timedelta(microseconds=micros)).time()


def _decimal_text(unscaled: int, scale: int) -> str:
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return ("-" if unscaled < 0 else "") + digits[:-scale] + "." + digits[-scale:]
