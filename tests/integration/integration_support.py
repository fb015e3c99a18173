"""Helpers shared by the integration tests: test records, a producer that remembers where they landed, sockets,
the session's pipeline names, and looking at the ledger, the output and the CLI as the tests do."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import psycopg2
import trustme
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kafka_ledger.airflow.dags import SPARK_TASK
from kafka_ledger.batch.plan import plan_next_batch
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import kafka_for, services_for
from kafka_ledger.config.settings import runtime_name as spark_runtime
from kafka_ledger.kafka import consumer_group
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import OffsetRange, PartitionReadStats
from kafka_ledger.ops import readback as audit
from kafka_ledger.runtimes import run_batch
from tools.fault_campaign import launcher
from tools.fault_campaign.runner import task_main
from tools.fault_campaign.strikes import copying_into
from tools.kafka_topics import create_topic

# The columns of every test pipeline, and bad records with the reason the dead-letter table must give for each:
# the fault campaign's too, so defined once, in tools/records.py.
from tools.records import BAD_VALUES, COLUMNS  # noqa: F401 - the tests import them from here

HARNESS = Path(__file__).resolve().parents[2] / "tools" / "fault_campaign"
# The namespace of the test pipelines' Iceberg tables in the stack's lake.
LAKE_NAMESPACE = "it_lake"


def start_task(pipeline, batch_id: int, failpoints: str | None = None, once_dir: Path | None = None,
               **env: str) -> launcher.ForkedTask:
    """The connect runtime's Spark task (read, publish, commit) in its own process, as Airflow runs it: forked from
    a server with its heavy libraries loaded, as Airflow's LocalExecutor forks it (tools/fault_campaign/launcher)."""
    task_env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_LEDGER_FAILPOINTS")}
    if failpoints:
        task_env.update(KAFKA_LEDGER_FAILPOINTS=failpoints, KAFKA_LEDGER_FAILPOINTS_ONCE_DIR=str(once_dir))
    task_env.update(env)
    argv = ["read_and_commit", "--pipeline", pipeline.name, "--batch-id", str(batch_id)]
    return launcher.start(task_main, argv, task_env)


def finish(task: launcher.ForkedTask, timeout: float = 300) -> tuple[int, str, str]:
    out, err = task.communicate(timeout=timeout)
    return task.returncode, out, err


# The columns of the change-data-capture pipelines (test_debezium.py): the source table's, and two of the events' own.
CDC_COLUMNS = [
    {"name": "id", "type": "long"},
    {"name": "email", "type": "string", "required": True},
    {"name": "city", "type": "string"},
    {"name": "balance", "type": "decimal(12,2)"},
    {"name": "updated_at", "type": "timestamp"},
    {"name": "source_lsn", "type": "long", "path": "source.lsn"},
    {"name": "op", "type": "string", "path": "op"},
]

# The columns of the Avro pipelines (test_avro.py): every kind an Avro field maps to, a nested path, the Kafka key.
AVRO_COLUMNS = [
    {"name": "order_id", "type": "string", "required": True},
    {"name": "quantity", "type": "long"},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "ordered_on", "type": "date"},
    {"name": "at", "type": "timestamp"},
    {"name": "city", "type": "string", "path": "address.city"},
    {"name": "zip", "type": "string", "path": "address.zip"},
    {"name": "status", "type": "string"},
    {"name": "tags", "type": "jsonb"},
    {"name": "total", "type": "int"},
    {"name": "channel", "type": "string"},
    {"name": "customer", "type": "string", "source": "key"},
    {"name": "digest", "type": "bytes"},
    {"name": "attachment", "type": "bytes"},
    {"name": "trace", "type": "bytes", "source": "header:trace"},
]

# The columns of test_protobuf.py's shop.Order: a field of each type a column reads.
PROTOBUF_COLUMNS = [
    {"name": "order_id", "type": "string", "required": True},
    {"name": "quantity", "type": "long"},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "at", "type": "timestamp"},
    {"name": "city", "type": "string", "path": "address.city"},
    {"name": "zip", "type": "string", "path": "address.zip"},
    {"name": "status", "type": "string"},
    {"name": "tags", "type": "jsonb"},
    {"name": "counts", "type": "jsonb"},
    {"name": "total", "type": "int"},
    {"name": "digest", "type": "bytes"},
    {"name": "discount", "type": "long"},
    {"name": "took", "type": "decimal(30,9)"},
    {"name": "waited", "type": "interval"},
    {"name": "big", "type": "decimal(20,0)"},
    {"name": "card", "type": "string"},
    {"name": "iban", "type": "string"},
    {"name": "customer", "type": "string", "source": "key"},
]
# An entity table of Protobuf values whose keys are Protobuf too (shop.OrderKey: its id names the entity).
PROTOBUF_KEYED_COLUMNS = [
    {"name": "order_id", "type": "string", "source": "key", "path": "id", "required": True},
    {"name": "region", "type": "long", "source": "key", "path": "region"},
    {"name": "quantity", "type": "long"},
    {"name": "amount", "type": "decimal(10,2)"},
]


def lean_decoded(records, pipeline, fmt, names: list[str]) -> dict[int, dict]:
    """Records decoded as a batch decodes them (the lean path: reasons worked out for the records failing the cheap
    checks only), asserted equal to the reference path (every record's reason worked out); rows by offset, with
    `error` and the columns `names`."""
    from kafka_ledger.formats.decode import decode_records
    from kafka_ledger.sinks import sink_for

    def decoded(lean: bool) -> dict[int, dict]:
        frame = decode_records(records, pipeline, sink_for(pipeline).envelope, lean=lean, fmt=fmt)
        return {row["kafka_offset"]: row.asDict() for row in frame.select("kafka_offset", "error", *names).collect()}

    lean, full = decoded(True), decoded(False)
    assert {o: (lean[o], full[o]) for o in lean if lean[o] != full[o]} == {}
    return lean


def published_rows(dsn: str, pipeline, names: list[str]) -> dict[tuple[int, int], dict]:
    """The pipeline's output rows by (partition, offset), the columns `names` of each: its Postgres table, or its
    Iceberg table read back without Spark."""
    from kafka_ledger.sinks import sink_for

    if pipeline.sink.type == "iceberg":
        table = sink_for(pipeline).table().scan().to_arrow().to_pylist()
        return {(r["kafka_partition"], r["kafka_offset"]): {n: r[n] for n in names} for r in table}
    return {(p, o): dict(zip(names, rest, strict=True)) for p, o, *rest in query(
        dsn, f"SELECT kafka_partition, kafka_offset, {', '.join(names)} FROM {pipeline.qualified_output_table}")}


def declared(pipeline, columns: list[dict]):
    """The pipeline as its file would declare it with `columns` (a declaration that changed)."""
    from kafka_ledger.config.pipeline import PipelineConfig

    return PipelineConfig.model_validate({**pipeline.model_dump(exclude_unset=True), "columns": columns})


def good_value(i: int) -> bytes:
    return json.dumps(
        {"event_id": f"e{i}", "amount": i, "price": i / 4, "ok": i % 2 == 0, "event_time": "2026-11-21T10:00:00Z"}
    ).encode()


class RecordedProducer:
    """Produces records and returns each one's (topic, partition, offset) from its delivery report."""

    def __init__(self, servers: str):
        self.producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5})

    def send(
        self, topic: str, values: list[bytes | None], partition: int | None = None, timestamp_ms: int | None = None,
        keys: list[str | bytes | None] | None = None, headers: list[list[tuple[str, bytes]]] | None = None,
    ) -> list[tuple[str, int, int]]:
        """Produce `values` in order (optionally with one Kafka timestamp, keys and headers; by default key i is
        "k{i}"); element i says where value i landed."""
        landed: dict[int, tuple[str, int, int]] = {}
        errors: list[str] = []

        def on_delivery(index: int):
            def report(err, msg) -> None:  # noqa: ANN001 - confluent-kafka callback
                if err is not None:
                    errors.append(str(err))
                else:
                    landed[index] = (msg.topic(), msg.partition(), msg.offset())
            return report

        for i, value in enumerate(values):
            kwargs = {"partition": partition} if partition is not None else {}
            if timestamp_ms is not None:
                kwargs["timestamp"] = timestamp_ms
            if headers is not None and headers[i]:
                kwargs["headers"] = headers[i]
            key = keys[i] if keys is not None else f"k{i}"
            self.producer.produce(topic, key=key.encode() if isinstance(key, str) else key, value=value,
                                  on_delivery=on_delivery(i), **kwargs)
            self.producer.poll(0)
        self.producer.flush(30)
        assert not errors, errors
        return [landed[i] for i in range(len(values))]


def listening_sockets(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of `pids` holds (read from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # the process ended meanwhile
            continue
        for fd in fds:
            try:
                link = os.readlink(fd_dir / fd)
            except OSError:  # this descriptor closed meanwhile (a busy JVM opens and closes files all the time)
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word of the address in host (little-endian) byte order.
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(packed)
            found.add((str(getattr(ip, "ipv4_mapped", None) or ip), int(port, 16)))
    return found


def not_loopback(sockets: set[tuple[str, int]]) -> set[tuple[str, int]]:
    return {(address, port) for address, port in sockets if not ipaddress.ip_address(address).is_loopback}


def other_ca(folder: Path) -> Path:
    """A CA (PEM) that signed none of the stack's certificates: a client trusting only it must refuse them."""
    trustme.CA(organization_name="another CA").cert_pem.write_to_path(str(folder / "other.pem"))
    return folder / "other.pem"


STACK_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "stack.sh"
CLUSTER_MASTER = os.environ.get("KL_SPARK_CLUSTER_MASTER", "spark://127.0.0.1:17077")


def stack(*args: str, **env: str) -> None:
    """Run scripts/stack.sh with `args` (and `env` on top of this process's environment); fail on failure."""
    done = subprocess.run(["bash", str(STACK_SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert done.returncode == 0, f"scripts/stack.sh {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@contextlib.contextmanager
def spark_connect_on_cluster() -> Iterator[str]:
    """The stack's cluster running, and its Spark Connect server on it; the server back on local[*] after."""
    stack("cluster")
    stack("start", KAFKA_LEDGER_SPARK_MASTER=CLUSTER_MASTER)
    try:
        yield CLUSTER_MASTER
    finally:
        stack("start", KAFKA_LEDGER_SPARK_MASTER="local[*]")


# The broker's SASL_SSL listener (SCRAM-SHA-512 over TLS, the stack's CA), and the client settings for it.
SECURED_SERVERS = f"127.0.0.1:{os.environ.get('KL_KAFKA_SASL_PORT', '19094')}"
TLS_DIR = Path(os.environ.get("KL_TLS_DIR", Path(__file__).resolve().parents[2] / ".stack" / "tls"))


def secured_kafka_settings(**changes: str) -> dict[str, str]:
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": os.environ["KL_KAFKA_SASL_USER"], "sasl.password": os.environ["KL_KAFKA_SASL_PASSWORD"],
            "ssl.ca.location": str(TLS_DIR / "ca.pem"), **changes}


class _TableCells(HTMLParser):
    """The text of each cell of one table (by id), row by row, header rows included."""

    def __init__(self, table_id: str):
        super().__init__()
        self.table_id, self.depth, self.rows, self.cell = table_id, 0, [], None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and (self.depth or dict(attrs).get("id") == self.table_id):
            self.depth += 1
        elif self.depth == 1 and tag == "tr":
            self.rows.append([])
        elif self.depth == 1 and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self.depth:
            self.depth -= 1
        elif self.depth == 1 and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def html_table(html: str, table_id: str) -> list[list[str]]:
    """Rows of the table with this id as cell texts (what a reader sees, markup removed), header first."""
    parser = _TableCells(table_id)
    parser.feed(html)
    assert parser.rows, f"no table with id {table_id!r} in the page"
    return parser.rows


# The session's pipelines and topics (declared in conftest.py): every name carries the session's run id.
RUN = uuid.uuid4().hex[:8]


def pipeline_name(key: str) -> str:
    return f"it_{RUN}_{key}"


def topic_name(key: str) -> str:
    return f"it-{RUN}-{key}"


# What the ledger, the output tables and the CLI say, as the tests check them.
def spark_task(pipeline) -> str:
    """The id of the pipeline DAG's Spark task in the pipeline's runtime."""
    return SPARK_TASK[spark_runtime(pipeline)]


def stored(dsn: str, pipeline) -> tuple[Counter, dict[tuple[str, int, int], str]]:
    """Output rows as a multiset of Kafka coordinates, and dead letters with their reasons."""
    records = audit.postgres_record_ids(LedgerDatabase(dsn), pipeline)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT kafka_topic, kafka_partition, kafka_offset, error FROM kafka_ledger.dead_letters "
            "WHERE pipeline = %s",
            (pipeline.name,),
        )
        reasons = {(t, p, o): e for t, p, o, e in cur.fetchall()}
    return Counter(records.output), reasons


def positions_equal_end_offsets(dsn: str, servers: str, pipeline) -> None:
    ends = {tp: o.end for tp, o in kafka_offsets.partition_offsets(kafka_for(servers), pipeline.topics).items()}
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        assert ledger.positions(cur, pipeline.name) == ends


def batches(dsn: str, pipeline) -> list[ledger.Batch]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %s ORDER BY batch_id", (pipeline.name,))
        return [ledger.get_batch(cur, batch_id) for (batch_id,) in cur.fetchall()]


def assert_exactly_once(dsn: str, servers: str, pipeline, expected_dead: dict[tuple[str, int, int], str]) -> None:
    """Kafka's records == output ∪ dead letters as sets, nothing twice, dead letters with their exact reasons."""
    produced = audit.kafka_record_ids(kafka_for(servers), pipeline.topics)
    output, dead = stored(dsn, pipeline)
    assert max(output.values(), default=1) == 1, "an output row is duplicated"
    assert not set(output) & set(dead), "a record is both in the output and in the dead letters"
    assert set(output) | set(dead) == produced
    assert dead == expected_dead
    positions_equal_end_offsets(dsn, servers, pipeline)


def drain(dsn: str, servers: str, pipeline, most: int = 40) -> int:
    """Catch-up batches, each run here and now, until the positions reach Kafka's ends; returns how many ran."""
    services = services_for(dsn, servers)
    for runs in range(most + 1):
        planned = plan_next_batch(services, pipeline)
        if planned.batch_id is None:
            return runs
        run_batch(pipeline, planned.batch_id, services)
    raise AssertionError(f"the pipeline did not catch up in {most} batches")


def catch_up(dsn, servers, pipeline):
    planned = plan_next_batch(services_for(dsn, servers), pipeline)
    run_batch(pipeline, planned.batch_id, services_for(dsn, servers))
    return batches(dsn, pipeline)[-1]


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict | list | None, str]:
    """Run the installed `kafka-ledger` console script with --json (`env` added to the environment);
    (exit code, parsed output, stderr)."""
    done = subprocess.run(["kafka-ledger", *args, "--json"], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        data = None
    return done.returncode, data, done.stderr


def query(dsn: str, statement: str, *params) -> list[tuple]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(statement, params)
        rows = cur.fetchall() if cur.description else []
    conn.close()
    return rows


def copying(dsn: str, table: str, running: bool = True) -> bool:
    """strikes.copying_into on a connection of the test's own: a COPY into the table runs (or its transaction goes
    on, not `running`)."""
    return copying_into(lambda statement, params: query(dsn, statement, *params), table, running=running)


def positions(dsn: str, pipeline) -> dict[tuple[str, int], int]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        return {(tp.topic, tp.partition): p for tp, p in ledger.positions(cur, pipeline.name).items()}


def coverage(dsn: str, pipeline) -> list[tuple]:
    return query(dsn, "SELECT topic, partition, from_offset, until_offset, disposition FROM "
                      "kafka_ledger.committed_ranges WHERE pipeline = %s ORDER BY 1, 2, 3", pipeline.name)


def verify_ok(pipeline) -> dict:
    # --full: these tests assert on everything their pipeline produced, whatever earlier verifies checked.
    code, data, err = cli("verify", pipeline.name, "--full")
    assert code == 0, (data, err)
    (report,) = data["pipelines"]
    assert report["ok"] and report["missing"] == 0 and report["unexpected"] == 0, report
    return report


# Bad records of every kind, each with its expected reason (test_bad_records.py, test_decode.py).
NEAR_MAX = 900_000  # the broker's default message.max.bytes is 1,048,588


def nested(depth: int) -> str:
    return '{"n":' * depth + "1" + "}" * depth


# (value, key, expected dead-letter reason or None when the record must be published)
# A pipeline of the newer kinds and sources: nested fields, a decimal, a date, a jsonb object, the Kafka key (whole and
# a field of a JSON key) and a header.
RICH_COLUMNS = [
    {"name": "id", "type": "string", "required": True},
    {"name": "city", "type": "string", "path": "customer.address.city"},
    {"name": "customer_id", "type": "long", "path": "customer.id"},
    {"name": "amount", "type": "decimal(12,2)"},
    {"name": "ordered_on", "type": "date"},
    {"name": "doc", "type": "jsonb"},
    {"name": "at", "type": "timestamp", "path": "meta.at"},
    {"name": "order_key", "type": "string", "source": "key"},
    {"name": "tenant", "type": "long", "source": "header:tenant"},
    {"name": "trace", "type": "string", "source": "header:trace", "path": "id"},
    {"name": "span", "type": "interval"},
]

CASES: dict[str, tuple[bytes | None, bytes | None, str | None]] = {
    "malformed JSON": (b'{"event_id": "x", "amount": 1', b"k", "malformed JSON (not a JSON object)"),
    "non-UTF-8 bytes": (b'{"event_id": "\xff\xfe"}', b"k", "value is not valid UTF-8"),
    "null value (tombstone)": (None, b"k", "null value (tombstone)"),
    "null key": (good_value(1), None, None),  # an unkeyed record is ordinary Kafka: published
    "missing required field": (b'{"amount": 3}', b"k", "required field 'event_id' is missing or null"),
    "wrong type": (b'{"event_id": "y", "amount": "many"}', b"k", "field 'amount' is not a valid long"),
    "object for a string": (b'{"event_id": {"a": 1}}', b"k",
                            "field 'event_id' is not a valid string (a JSON object or array)"),
    "unexpected extra field": (b'{"event_id": "z", "surprise": 1}', b"k", "unexpected field(s): surprise"),
    "value near the max message size": (json.dumps({"event_id": "big" + "x" * NEAR_MAX}).encode(), b"k", None),
    "malformed value near the max message size": (b'{"event_id": "' + b"x" * NEAR_MAX, b"k",
                                                  "malformed JSON (not a JSON object)"),
    "deeply nested JSON": (('{"event_id": "d", "n": ' + nested(1500) + "}").encode(), b"k",
                           "JSON nested too deeply to parse (over 1000 levels)"),
    "huge number": (b'{"event_id": "h", "amount": 123456789012345678901234567890}', b"k",
                    "field 'amount' is not a valid long"),
    "invalid timestamp": (b'{"event_id": "t", "event_time": "2026-13-45T99:00:00Z"}', b"k",
                          "field 'event_time' is not a valid timestamp"),
}


def consumer_groups(servers: str) -> list[str]:
    """The ids of the consumer groups Kafka knows."""
    admin = kafka_offsets.admin_client(kafka_for(servers))
    # librdkafka sends ListGroups to the brokers it knows when asked: asked before its first metadata reply, about one
    # call in 60 waited out its whole timeout (none in 300 after it). So the metadata first.
    admin.topics(kafka_for(servers), timeout=30)
    return [g.group_id for g in admin.list_consumer_groups(request_timeout=30).result().valid]


def committed_group_offsets(servers: str, topic: str) -> dict[str, list[int]]:
    """Every consumer group with an offset committed for `topic`, and the partitions it committed."""
    found = {}
    for group in consumer_groups(servers):
        committed = consumer_group.read_positions(kafka_for(servers), group)
        if partitions := sorted(tp.partition for tp in committed if tp.topic == topic):
            found[group] = partitions
    return found


def recreate_topic(servers: str, topic: str) -> RecordedProducer:
    """Delete `topic` and create it again under the same name (Kafka gives it a new topic id); returns a producer
    for the new topic, once the broker's metadata shows its partition led."""
    admin = AdminClient({"bootstrap.servers": servers})  # keep a reference until the futures resolve
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:  # the broker refuses the name while the old topic is still being deleted
        try:  # create_topic returns once its partition has a leader (before, a send fails: "Unknown partition")
            create_topic(admin, topic, partitions=1, timeout=30)
            break
        except Exception:
            assert time.monotonic() < deadline, f"{topic} could not be created again"
            time.sleep(0.5)
    # A producer that sent to the old topic keeps its metadata and can fail the new topic's first records.
    return RecordedProducer(servers)


def stage_rows(cur, pipeline, batch_id: int, attempt: int, ranges: list[OffsetRange]) -> None:
    """Stage one decoded row per offset, as the Spark job would, and declare the attempt written."""
    for r in ranges:
        for offset in range(r.from_offset, r.until_offset):
            cur.execute(
                f"INSERT INTO kafka_ledger_staging.{pipeline.name} "
                "(batch_id, attempt, kafka_topic, kafka_partition, kafka_offset, event_id) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (batch_id, attempt, r.topic, r.partition, offset, f"e{offset}"),
            )
    stats = [
        PartitionReadStats(r.topic, r.partition, r.span, r.span, r.from_offset, r.until_offset - 1) for r in ranges
    ]
    ledger.mark_written(cur, batch_id, attempt, stats, read_seconds=0.1)


def output_count(cur, pipeline) -> int:
    cur.execute(f"SELECT count(*) FROM it_output.{pipeline.name}")
    return cur.fetchone()[0]


# Compaction at once: tiny segments, any dirty ratio, no lag (the broker looks every second, see server.properties).
COMPACT_NOW = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
               "min.compaction.lag.ms": "0", "delete.retention.ms": "0"}


def produce_versions(producer, topic: str, keys: list[str], first: int) -> list[tuple[str, int, int]]:
    """One version of each key, in a segment of its own (the next append rolls it: segment.ms is 100)."""
    landed = producer.send(topic, [good_value(first + i) for i in range(len(keys))], partition=0, keys=keys)
    time.sleep(0.3)
    return landed


def wait_until_compacted(servers: str, topic: str, gone: list[tuple[str, int, int]], timeout: float = 90) -> set:
    deadline = time.monotonic() + timeout
    while True:
        held = audit.kafka_record_ids(kafka_for(servers), [topic])
        if not held & set(gone):
            return held
        assert time.monotonic() < deadline, f"the log cleaner did not remove {sorted(held & set(gone))}"
        time.sleep(1)
