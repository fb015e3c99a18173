"""Probes of two publishing ideas of issue 22 on the local stack's Postgres: what TLS costs a binary COPY, and COPYs
in parallel attached as partitions against one COPY; prints one JSON line (docs/benchmark.md has the figures).

    . scripts/env.sh && python -m tools.copy_probe --records 545884 --rounds 5

The rows are made up in W1's table shape (benchmark_peers.create_table) and read out once as binary COPY data,
untimed; each round then times, alternately, one COPY of all of them over TLS and without it, and two COPYs in
parallel (each half of the Kafka partitions, into a table of its own) with attaching both to a table partitioned
by the Kafka partition. A connection without TLS needs the stack's superuser (the ledger's role is refused without
TLS): its password is the stack's, KL_PG_SUPERUSER_PASSWORD in $KL_SECRETS (scripts/env.sh sets both).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import threading
import time

import psycopg2
from psycopg2 import sql

from kafka_ledger.config.settings import ledger_database
from tools.benchmark_peers import TABLE_COLUMNS, create_table

SCHEMA = "copy_probe"
KAFKA_PARTITIONS = 18
COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in TABLE_COLUMNS)


def superuser_password() -> str:
    """The local stack's Postgres superuser password: from the environment, else from the stack's secrets file."""
    if password := os.environ.get("KL_PG_SUPERUSER_PASSWORD"):
        return password
    with open(os.environ["KL_SECRETS"]) as secrets:
        for line in secrets:
            name, _, value = line.strip().partition("=")
            if name == "KL_PG_SUPERUSER_PASSWORD":
                return value
    raise SystemExit(f"no KL_PG_SUPERUSER_PASSWORD in {os.environ['KL_SECRETS']}: is this the local stack?")


def connect(tls: bool) -> psycopg2.extensions.connection:
    """The ledger database as the stack's superuser, with or without TLS (the DSN's own host, port and CA)."""
    options = {} if tls else {"sslmode": "disable"}
    conn = psycopg2.connect(ledger_database().url, user="postgres", password=superuser_password(), **options)
    with conn.cursor() as cur:
        cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        if cur.fetchone()[0] != tls:
            raise SystemExit(f"the connection's TLS is not what was asked ({tls})")
    return conn


def copy_into(table: str, data: bytes, tls: bool = True) -> float:
    """Seconds of one binary COPY of `data` into `table`, committed."""
    conn = connect(tls)
    started = time.monotonic()
    with conn, conn.cursor() as cur:
        cur.copy_expert(sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(
            sql.Identifier(SCHEMA, table), COLUMNS), io.BytesIO(data), size=1 << 20)
    seconds = time.monotonic() - started
    conn.close()
    return seconds


def made_up_rows(records: int) -> tuple[bytes, list[bytes]]:
    """W1-shaped rows as binary COPY data: all of them, and each half of the Kafka partitions apart."""
    dsn = ledger_database().url
    create_table(dsn, SCHEMA, "source")
    conn = connect(True)
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL(
            """INSERT INTO {} SELECT 'probe-topic', mod(i, %(partitions)s), i / %(partitions)s, now(), 'e' || i,
                      'u' || mod(i, 5000), i, i / 7.0, now() FROM generate_series(0, %(last)s) AS i""").format(
            sql.Identifier(SCHEMA, "source")), {"partitions": KAFKA_PARTITIONS, "last": records - 1})
        parts = []
        for where in ("TRUE", "kafka_partition < 9", "kafka_partition >= 9"):
            rows = io.BytesIO()
            cur.copy_expert(sql.SQL("COPY (SELECT {} FROM {} WHERE {} ORDER BY kafka_partition, kafka_offset) "
                                    "TO STDOUT WITH (FORMAT binary)").format(
                COLUMNS, sql.Identifier(SCHEMA, "source"), sql.SQL(where)), rows)
            parts.append(rows.getvalue())
    conn.close()
    return parts[0], parts[1:]


def parallel_then_attach(halves: list[bytes]) -> tuple[float, float]:
    """Seconds of two COPYs in parallel into tables of their own, then of attaching both as partitions."""
    bounds = ((0, 9), (9, KAFKA_PARTITIONS))
    conn = connect(True)
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(SCHEMA, "partitioned")))
    for i in range(len(bounds)):
        create_table(ledger_database().url, SCHEMA, f"half_{i}")
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (LIKE {}) PARTITION BY RANGE (kafka_partition)").format(
            sql.Identifier(SCHEMA, "partitioned"), sql.Identifier(SCHEMA, "source")))
        cur.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset)").format(
            sql.Identifier(SCHEMA, "partitioned")))
        for i, (low, high) in enumerate(bounds):
            # The partition bound as a constraint beforehand spares ATTACH a scan of the rows.
            cur.execute(sql.SQL("ALTER TABLE {} ADD CHECK (kafka_partition >= %s AND kafka_partition < %s)").format(
                sql.Identifier(SCHEMA, f"half_{i}")), (low, high))
    copies = [threading.Thread(target=copy_into, args=(f"half_{i}", half)) for i, half in enumerate(halves)]
    started = time.monotonic()
    for copy in copies:
        copy.start()
    for copy in copies:
        copy.join()
    parallel = time.monotonic() - started
    started = time.monotonic()
    with conn, conn.cursor() as cur:
        for i, (low, high) in enumerate(bounds):
            cur.execute(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM (%s) TO (%s)").format(
                sql.Identifier(SCHEMA, "partitioned"), sql.Identifier(SCHEMA, f"half_{i}")), (low, high))
    attach = time.monotonic() - started
    # A COPY that failed in its thread would only print: the rows must all be there for the figures to count.
    with conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT (SELECT count(*) FROM {}) = (SELECT count(*) FROM {})").format(
            sql.Identifier(SCHEMA, "partitioned"), sql.Identifier(SCHEMA, "source")))
        if not cur.fetchone()[0]:
            raise SystemExit("the parallel COPYs did not publish every row")
    conn.close()
    return parallel, attach


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=545_884)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    whole, halves = made_up_rows(args.records)
    seconds: dict[str, list[float]] = {}
    try:
        for _ in range(args.rounds):
            for name, tls in (("copy_tls", True), ("copy_without_tls", False)):
                create_table(ledger_database().url, SCHEMA, name)
                seconds.setdefault(name, []).append(copy_into(name, whole, tls))
            parallel, attach = parallel_then_attach(halves)
            seconds.setdefault("two_parallel_copies", []).append(parallel)
            seconds.setdefault("attach_both", []).append(attach)
    finally:
        conn = connect(True)
        with conn, conn.cursor() as cur:
            cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        conn.close()
    print(json.dumps({
        "records": args.records, "bytes": len(whole), "rounds": args.rounds,
        **{f"{name}_seconds": round(statistics.median(values), 3) for name, values in seconds.items()},
        "ranges": {name: [round(min(values), 3), round(max(values), 3)] for name, values in seconds.items()},
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }))


if __name__ == "__main__":
    main()
