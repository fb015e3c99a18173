"""Service settings: environment look-ups, Airflow connection fallback, SQLAlchemy and JDBC URL conversions."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from kafka_ledger import settings
from kafka_ledger.settings import (
    JdbcTarget,
    LedgerTimeouts,
    SettingsError,
    jdbc_target,
    ledger_timeouts,
    sqlalchemy_url,
)


@pytest.fixture
def no_airflow(monkeypatch):
    """Airflow has no such connection (never touch a real Airflow metadata DB or API)."""

    def missing(conn_id):
        raise LookupError(f"connection {conn_id} not defined")

    monkeypatch.setattr(settings, "_airflow_connection", missing)


def airflow_returns(monkeypatch, conn):
    calls = []

    def lookup(conn_id):
        calls.append(conn_id)
        return conn

    monkeypatch.setattr(settings, "_airflow_connection", lookup)
    return calls


# --- ledger_dsn / bootstrap_servers -----------------------------------------------------------------------------


def test_ledger_dsn_from_environment(monkeypatch, no_airflow):
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://u:p@db:5432/ledger")
    assert settings.ledger_dsn() == "postgresql://u:p@db:5432/ledger"


def test_ledger_dsn_falls_back_to_airflow_connection(monkeypatch):
    calls = airflow_returns(monkeypatch, SimpleNamespace(get_uri=lambda: "postgres://a:b@h:1/d"))
    assert settings.ledger_dsn() == "postgres://a:b@h:1/d"
    assert calls == [settings.LEDGER_DB_CONN_ID]


def test_ledger_dsn_empty_env_falls_back_to_airflow(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "")
    airflow_returns(monkeypatch, SimpleNamespace(get_uri=lambda: "postgres://x@h/d"))
    assert settings.ledger_dsn() == "postgres://x@h/d"


def test_ledger_dsn_unconfigured_raises_settings_error(no_airflow):
    with pytest.raises(SettingsError, match="KAFKA_LEDGER_DB_URL") as exc_info:
        settings.ledger_dsn()
    assert "kafka_ledger_db" in str(exc_info.value)


def test_bootstrap_servers_from_environment(monkeypatch, no_airflow):
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    assert settings.bootstrap_servers() == "k1:9092,k2:9092"


def test_bootstrap_servers_from_airflow_connection_extra(monkeypatch):
    conn = SimpleNamespace(extra_dejson={"bootstrap.servers": "k:9094"}, host="ignored", port=1)
    calls = airflow_returns(monkeypatch, conn)
    assert settings.bootstrap_servers() == "k:9094"
    assert calls == [settings.KAFKA_CONN_ID]


def test_bootstrap_servers_from_airflow_connection_host_and_port(monkeypatch):
    airflow_returns(monkeypatch, SimpleNamespace(extra_dejson={}, host="kafka", port=29092))
    assert settings.bootstrap_servers() == "kafka:29092"


def test_bootstrap_servers_connection_without_address_raises(monkeypatch):
    airflow_returns(monkeypatch, SimpleNamespace(extra_dejson={}, host=None, port=None))
    with pytest.raises(SettingsError, match="has no bootstrap.servers"):
        settings.bootstrap_servers()


def test_bootstrap_servers_unconfigured_raises_settings_error(no_airflow):
    with pytest.raises(SettingsError, match="KAFKA_LEDGER_BOOTSTRAP_SERVERS"):
        settings.bootstrap_servers()


# --- sqlalchemy_url -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgres://u:p@h:5432/db", "postgresql+psycopg2://u:p@h:5432/db"),
        ("postgresql://u:p@h:5432/db", "postgresql+psycopg2://u:p@h:5432/db"),
        ("postgresql+psycopg2://u:p@h/db?sslmode=require", "postgresql+psycopg2://u:p@h/db?sslmode=require"),
        ("postgresql://u:p%40ss@h/db", "postgresql+psycopg2://u:p%40ss@h/db"),
    ],
)
def test_sqlalchemy_url_uses_psycopg2_driver(dsn, expected):
    assert sqlalchemy_url(dsn) == expected


@pytest.mark.parametrize("dsn", ["mysql://u:p@h/db", "sqlite:///x.db", "postgresql+asyncpg://h/db"])
def test_sqlalchemy_url_rejects_other_schemes(dsn):
    with pytest.raises(SettingsError, match="unsupported ledger database URL scheme"):
        sqlalchemy_url(dsn)


# --- jdbc_target --------------------------------------------------------------------------------------------------


def test_jdbc_target_splits_credentials_out_of_the_url():
    assert jdbc_target("postgresql://ledger:secret@db.local:6543/kafka_ledger") == JdbcTarget(
        url="jdbc:postgresql://db.local:6543/kafka_ledger?reWriteBatchedInserts=true",
        user="ledger",
        password="secret",
    )


def test_jdbc_target_decodes_percent_encoded_credentials():
    target = jdbc_target("postgres://us%40er:p%40ss%3Aw%2Ford%25@h:5432/db")
    assert target.user == "us@er"
    assert target.password == "p@ss:w/ord%"
    assert target.url == "jdbc:postgresql://h:5432/db?reWriteBatchedInserts=true"
    assert "p@ss" not in target.url and "p%40ss" not in target.url


def test_jdbc_target_translates_libpq_settings_to_the_jdbc_driver():
    target = jdbc_target("postgresql://u:p@h:5432/db?sslmode=verify-full&sslrootcert=/ca/root.crt&connect_timeout=5")
    assert target.url == ("jdbc:postgresql://h:5432/db?connectTimeout=5&sslmode=verify-full"
                          "&sslrootcert=%2Fca%2Froot.crt&reWriteBatchedInserts=true")


def test_a_key_value_dsn_gives_the_same_targets_as_its_url():
    dsn = "host=db.local port=6543 dbname=kafka_ledger user=ledger password='s3 cr=t' sslmode=require"
    assert jdbc_target(dsn) == JdbcTarget(
        url="jdbc:postgresql://db.local:6543/kafka_ledger?sslmode=require&reWriteBatchedInserts=true",
        user="ledger", password="s3 cr=t")
    from sqlalchemy.engine import make_url

    url = make_url(sqlalchemy_url(dsn))
    assert (url.drivername, url.username, url.password, url.host, url.port, url.database, dict(url.query)) == (
        "postgresql+psycopg2", "ledger", "s3 cr=t", "db.local", 6543, "kafka_ledger", {"sslmode": "require"})


def test_jdbc_target_refuses_what_jdbc_cannot_do_instead_of_dropping_it():
    with pytest.raises(SettingsError, match="gssencmode have no equivalent"):
        jdbc_target("host=h dbname=d gssencmode=require")
    with pytest.raises(SettingsError, match="Unix socket"):
        jdbc_target("host=/var/run/postgresql dbname=d")
    with pytest.raises(SettingsError, match="not a valid Postgres connection string"):
        jdbc_target("host=h dbname")


def test_jdbc_target_lists_every_host():
    assert jdbc_target("postgresql://u@h1:5432,h2:5433/db").url.startswith("jdbc:postgresql://h1:5432,h2:5433/db?")


def test_jdbc_target_defaults_host_port_database_and_empty_credentials():
    assert jdbc_target("postgresql://") == JdbcTarget(
        url="jdbc:postgresql://127.0.0.1:5432/postgres?reWriteBatchedInserts=true", user="", password=""
    )


def test_jdbc_target_user_without_password():
    target = jdbc_target("postgresql://alice@h/db")
    assert (target.user, target.password) == ("alice", "")
    assert target.url == "jdbc:postgresql://h:5432/db?reWriteBatchedInserts=true"


def test_spark_runtime_pipeline_first_then_deployment_then_submit(monkeypatch):
    from kafka_ledger.config import parse_pipelines
    from kafka_ledger.settings import runtime_name as spark_runtime

    body = "topics: [t]\n    output_table: t\n    columns: [{name: a, type: string}]"
    default, pinned = (parse_pipelines(f"pipelines:\n  p:\n    {body}{extra}")["p"]
                       for extra in ("", "\n    spark_runtime: submit"))
    assert spark_runtime(default) == "submit"
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_RUNTIME", "connect")
    assert (spark_runtime(default), spark_runtime(pinned)) == ("connect", "submit")
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_RUNTIME", "yarn")
    with pytest.raises(SettingsError, match="KAFKA_LEDGER_SPARK_RUNTIME='yarn'"):
        spark_runtime(default)


def test_spark_connect_url_names_the_batch_session(monkeypatch):
    from kafka_ledger.settings import spark_connect_url

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
                       '{"conn_type": "spark_connect", "host": "sc://spark.internal", "port": 15002, '
                       '"password": "t0k"}')
    assert spark_connect_url() == "sc://spark.internal:15002/;token=t0k"
    assert spark_connect_url("abc") == "sc://spark.internal:15002/;token=t0k;session_id=abc"


def test_ledger_timeouts_default_and_come_from_the_environment(monkeypatch):
    assert ledger_timeouts() == LedgerTimeouts(db_statement_timeout=600, db_lock_timeout=600)
    monkeypatch.setenv("KAFKA_LEDGER_DB_LOCK_TIMEOUT", "5")
    assert ledger_timeouts().db_lock_timeout == 5
    monkeypatch.setenv("KAFKA_LEDGER_DB_LOCK_TIMEOUT", "0")
    with pytest.raises(SettingsError, match="db_lock_timeout"):
        ledger_timeouts()


def test_the_configuration_reference_documents_every_ledger_timeout_with_its_default():
    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for name, field in LedgerTimeouts.model_fields.items():
        assert f"| `KAFKA_LEDGER_{name.upper()}` | {field.default} | {field.description} |" in readme
