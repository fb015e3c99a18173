"""Where the ledger database and Kafka are: environment first, then Airflow connections."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import get_args
from urllib.parse import quote, urlencode

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kafka_ledger import kafka_security
from kafka_ledger.config import PipelineConfig, SparkRuntime

LEDGER_DB_CONN_ID = "kafka_ledger_db"
KAFKA_CONN_ID = "kafka_ledger_kafka"
# The Spark provider's connection types: `spark` for spark-submit, `spark_connect` for the warm server.
SPARK_SUBMIT_CONN_ID = "spark_default"
SPARK_CONNECT_CONN_ID = "spark_connect_default"
SPARK_RUNTIME_ENV = "KAFKA_LEDGER_SPARK_RUNTIME"
# Without a deployment default, spark-submit: it needs nothing running beyond Spark itself.
DEFAULT_SPARK_RUNTIME = "submit"


class SettingsError(RuntimeError):
    """A service address is not configured."""


def _airflow_connection(conn_id: str):  # noqa: ANN202 - airflow's Connection type, imported lazily
    try:
        from airflow.sdk import BaseHook
    except ImportError as exc:  # pragma: no cover - airflow is always installed by set-up
        raise SettingsError(f"Airflow is not importable to look up connection {conn_id!r}") from exc
    return BaseHook.get_connection(conn_id)


class LedgerTimeouts(BaseSettings):
    """How long a ledger connection may wait, in seconds, each from $KAFKA_LEDGER_<FIELD>: nothing waits unbounded."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_LEDGER_", frozen=True)

    db_statement_timeout: int = Field(
        default=600, ge=1,
        description="any one ledger statement (a batch's publish and commit get its `spark_timeout_minutes`)")
    db_lock_timeout: int = Field(
        default=600, ge=1,
        description="a wait for a lock: the pipeline's or a batch's, held by the one plan, commit or reset of the "
                    "pipeline that runs at a time")


def ledger_timeouts() -> LedgerTimeouts:
    try:
        return LedgerTimeouts()
    except ValueError as exc:
        raise SettingsError(f"invalid ledger timeout in the environment: {exc}") from exc


def ledger_dsn() -> str:
    """The ledger database URL: $KAFKA_LEDGER_DB_URL, else the Airflow connection `kafka_ledger_db`."""
    dsn = os.environ.get("KAFKA_LEDGER_DB_URL")
    if dsn:
        return dsn
    try:
        return _airflow_connection(LEDGER_DB_CONN_ID).get_uri()
    except Exception as exc:
        raise SettingsError(
            f"no ledger database configured: set KAFKA_LEDGER_DB_URL or the Airflow connection "
            f"{LEDGER_DB_CONN_ID!r} (scripts/env.sh does both for the local stack)"
        ) from exc


def bootstrap_servers() -> str:
    """Kafka bootstrap servers: $KAFKA_LEDGER_BOOTSTRAP_SERVERS, else the `kafka_ledger_kafka` connection."""
    servers = os.environ.get("KAFKA_LEDGER_BOOTSTRAP_SERVERS")
    if servers:
        return servers
    try:
        conn = _airflow_connection(KAFKA_CONN_ID)
    except Exception as exc:
        raise SettingsError(
            f"no Kafka configured: set KAFKA_LEDGER_BOOTSTRAP_SERVERS or the Airflow connection {KAFKA_CONN_ID!r} "
            "with extra {\"bootstrap.servers\": \"host:port\"}"
        ) from exc
    servers = conn.extra_dejson.get("bootstrap.servers") or (f"{conn.host}:{conn.port or 9092}" if conn.host else "")
    if not servers:
        raise SettingsError(f"Airflow connection {KAFKA_CONN_ID!r} has no bootstrap.servers in its extra")
    return servers


def kafka_settings() -> dict[str, str]:
    """The deployment's Kafka client settings beyond the servers (security and the like), in librdkafka's names.

    They come from where the servers come from: $KAFKA_LEDGER_KAFKA_CONFIG (a JSON object) beside
    $KAFKA_LEDGER_BOOTSTRAP_SERVERS, else the extra of the Airflow connection `kafka_ledger_kafka`.
    """
    if os.environ.get("KAFKA_LEDGER_BOOTSTRAP_SERVERS") or os.environ.get(kafka_security.KAFKA_CONFIG_ENV):
        return kafka_security.client_settings()
    try:
        conn = _airflow_connection(KAFKA_CONN_ID)
    except Exception as exc:
        raise SettingsError(f"no Kafka configured: set KAFKA_LEDGER_BOOTSTRAP_SERVERS or the Airflow connection "
                            f"{KAFKA_CONN_ID!r}") from exc
    return kafka_security.client_settings(conn.extra_dejson)


def kafka_config(servers: str, **overrides: object) -> dict[str, object]:
    """A confluent-kafka client configuration for `servers` with the deployment's settings, then `overrides`."""
    return kafka_security.confluent_config(servers, kafka_settings(), **overrides)


def deployment_spark_runtime() -> str:
    """The deployment's Spark runtime: $KAFKA_LEDGER_SPARK_RUNTIME, else submit."""
    runtime = os.environ.get(SPARK_RUNTIME_ENV) or DEFAULT_SPARK_RUNTIME
    if runtime not in get_args(SparkRuntime):
        raise SettingsError(f"{SPARK_RUNTIME_ENV}={runtime!r}: expected one of {', '.join(get_args(SparkRuntime))}")
    return runtime


def runtime_name(pipeline: PipelineConfig) -> str:
    """Where the pipeline's Spark work runs: its own `spark_runtime`, else the deployment's."""
    return pipeline.spark_runtime or deployment_spark_runtime()


def spark_connect_url(session_id: str | None = None) -> str:
    """The Spark Connect server's URL from the Airflow connection `spark_connect_default` (type spark_connect).

    With `session_id`, the URL names that server-side session, so that every attempt of a batch works in
    the same session and can interrupt what an earlier, killed attempt left running.
    """
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    try:
        url = SparkConnectHook(SPARK_CONNECT_CONN_ID).get_connection_url()
    except Exception as exc:
        raise SettingsError(
            f"no Spark Connect server configured: define the Airflow connection {SPARK_CONNECT_CONN_ID!r} "
            f"(type spark_connect, e.g. AIRFLOW_CONN_SPARK_CONNECT_DEFAULT='{{\"conn_type\": \"spark_connect\", "
            f"\"host\": \"sc://127.0.0.1\", \"port\": 19002}}'), or run the pipeline with spark_runtime: submit"
        ) from exc
    return f"{url};session_id={session_id}" if session_id else url


def libpq_settings(dsn: str) -> dict[str, str]:
    """The settings of a libpq connection string, URL (postgresql://...) or key=value, parsed by libpq itself."""
    from psycopg2.extensions import parse_dsn

    try:
        return parse_dsn(dsn)
    except Exception as exc:  # psycopg2.ProgrammingError: libpq's own message says what is wrong
        raise SettingsError(f"the ledger database setting is not a valid Postgres connection string: {exc}") from None


def sqlalchemy_url(dsn: str) -> str:
    """The same database as a SQLAlchemy URL with the psycopg2 driver (from a URL or a key=value DSN)."""
    if "://" in dsn:
        scheme, _, rest = dsn.partition("://")
        if scheme not in ("postgres", "postgresql", "postgresql+psycopg2"):
            raise SettingsError(f"unsupported ledger database URL scheme {scheme!r} (expected postgresql://)")
        return f"postgresql+psycopg2://{rest}"
    from sqlalchemy.engine import URL

    parts = libpq_settings(dsn)
    port = parts.pop("port", None)
    url = URL.create(
        "postgresql+psycopg2", username=parts.pop("user", None), password=parts.pop("password", None),
        host=parts.pop("host", None), port=int(port) if port else None, database=parts.pop("dbname", None),
        query=parts,
    )
    return url.render_as_string(hide_password=False)


@dataclass(frozen=True)
class JdbcTarget:
    """A Postgres connection string split the way Spark's JDBC writer wants it."""

    url: str
    user: str
    password: str


# libpq settings and the Postgres JDBC driver's name for each; any other setting has no JDBC equivalent
# here and is refused rather than dropped (a dropped sslmode would silently connect without TLS).
JDBC_PROPERTIES = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "options": "options",
}


def jdbc_target(dsn: str) -> JdbcTarget:
    """Split a libpq connection string (URL or key=value) into a JDBC URL plus credentials kept out of it."""
    parts = libpq_settings(dsn)
    user = parts.pop("user", "")
    password = parts.pop("password", "")
    hosts = (parts.pop("host", None) or "127.0.0.1").split(",")
    ports = (parts.pop("port", None) or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        raise SettingsError(f"the ledger database names {len(hosts)} host(s) but {len(ports)} port(s)")
    addresses = []
    for host, port in zip(hosts, ports, strict=True):
        if host.startswith("/"):
            raise SettingsError(f"the ledger database host {host!r} is a Unix socket folder: Spark's JDBC "
                                "writer needs a TCP host name or address")
        addresses.append(f"[{host}]:{port or 5432}" if ":" in host else f"{host}:{port or 5432}")
    database = parts.pop("dbname", None) or user or "postgres"
    unsupported = sorted(set(parts) - set(JDBC_PROPERTIES))
    if unsupported:
        raise SettingsError(f"ledger database setting(s) {', '.join(unsupported)} have no equivalent for Spark's "
                            f"JDBC writer (supported: {', '.join(JDBC_PROPERTIES)})")
    properties = {JDBC_PROPERTIES[key]: value for key, value in parts.items()}
    properties["reWriteBatchedInserts"] = "true"
    return JdbcTarget(
        url=f"jdbc:postgresql://{','.join(addresses)}/{quote(database, safe='')}?{urlencode(properties)}",
        user=user,
        password=password,
    )
