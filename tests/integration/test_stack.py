"""The local stack as deployed by scripts/stack.sh: every service on loopback, the ledger over verified TLS."""

from __future__ import annotations

import json
import os
import subprocess

import psycopg2
import pytest
from integration_support import listening_sockets, not_loopback, other_ca

from tools.stack import service_pids

pytestmark = pytest.mark.integration

def test_every_local_service_listens_on_loopback_only():
    pids = service_pids()
    if os.environ.get("KL_LOCAL_KAFKA", "1") == "1" and os.environ.get("KL_LOCAL_POSTGRES", "1") == "1":
        assert {"kafka", "postgres"} <= set(pids), pids
    # supervisord is controlled through a Unix socket only: it must hold no TCP listener at all.
    assert listening_sockets([pids.pop("supervisord")]) == set()
    for name, pid in pids.items():
        sockets = listening_sockets([pid])
        assert sockets, f"{name} (pid {pid}) listens nowhere: is it running?"
        assert not_loopback(sockets) == set(), f"{name} listens beyond loopback: {sorted(sockets)}"


def with_settings(dsn: str, **changes: str) -> str:
    """The same connection string with some libpq settings changed, as a key=value DSN."""
    from psycopg2.extensions import make_dsn

    return make_dsn(dsn, **changes)


def test_postgres_serves_the_ledger_over_verified_tls_only(dsn, tmp_path):
    """The stack's DSN checks the server's certificate; the ledger role is refused without TLS or by another CA."""
    from psycopg2.extensions import parse_dsn

    if os.environ.get("KL_LOCAL_POSTGRES", "1") != "1":
        pytest.skip("an external Postgres: its TLS is its operator's")
    assert parse_dsn(dsn)["sslmode"] == "verify-full"
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        assert cur.fetchone() == (True,)
    conn.close()
    with pytest.raises(psycopg2.OperationalError, match="no encryption"):
        psycopg2.connect(with_settings(dsn, sslmode="disable")).close()
    with pytest.raises(psycopg2.OperationalError, match="certificate verify failed"):
        psycopg2.connect(with_settings(dsn, sslrootcert=str(other_ca(tmp_path)))).close()


def test_the_cli_reaches_the_ledger_over_tls_through_the_airflow_connection(dsn, servers, pipeline_factory):
    """Without KAFKA_LEDGER_DB_URL the DSN comes from the connection kafka_ledger_db: its TLS settings survive."""
    pipeline = pipeline_factory("tls_connection", partitions=1)
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_LEDGER_DB_URL"}
    env["AIRFLOW_CONN_KAFKA_LEDGER_DB"] = dsn
    done = subprocess.run(["kafka-ledger", "status", pipeline.name, "--json"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pipeline"] == pipeline.name
