"""The services kafka-ledger uses, as values: the ledger database and Kafka, each in every client's form, and the
observer of its events, carried together (`Services`) from the entry points (a task, the CLI, the page) instead of
connection strings looked up wherever one is needed.

`LedgerDatabase` gives its libpq, SQLAlchemy and JDBC forms; `KafkaClient` its confluent-kafka and Spark forms. Both
hold secrets: their `str` shows none (a password is `***`), so either can be logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from kafka_ledger.model.refusals import Refusal
from kafka_ledger.observe.observer import Observer, default_observer

# The environment variable of settings.Settings.kafka_config, for callers that set it (a test, a Spark job's
# environment); tests/unit/test_settings.py checks that it is the model's.
KAFKA_CONFIG_ENV = "KAFKA_LEDGER_KAFKA_CONFIG"

# librdkafka (confluent-kafka) settings that reach Spark's Java Kafka client under the same name.
SAME_NAME_IN_JAVA = ("security.protocol", "sasl.mechanism", "ssl.key.password")
SASL_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class SettingsError(RuntimeError, Refusal):
    """A setting is missing or invalid; the message names the variable."""


class KafkaConfigError(ValueError, Refusal):
    """The Kafka client settings cannot be given to one of the clients."""


class KafkaClientConfig(BaseModel):
    """Kafka client settings beyond bootstrap.servers, in librdkafka's names (security.protocol, sasl.*, ssl.*, ...).

    Every setting is kept, as text (as the clients take it); the passwords are declared, as secrets: never
    logged, and registered with Airflow's masker (airflow_dag.mask_secrets).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    sasl_password: SecretStr | None = Field(default=None, alias="sasl.password", description="the SASL password")
    ssl_key_password: SecretStr | None = Field(default=None, alias="ssl.key.password",
                                               description="the password of the client's private key")
    ssl_keystore_password: SecretStr | None = Field(default=None, alias="ssl.keystore.password",
                                                    description="the password of the client's key store")

    @model_validator(mode="before")
    @classmethod
    def _as_text(cls, data: object) -> object:
        if not isinstance(data, dict):
            raise ValueError(f"the Kafka client settings must be a JSON object, not {type(data).__name__}")
        # bootstrap.servers is settings.bootstrap_servers()'s, wherever the rest comes from.
        return {str(key): str(value) for key, value in data.items() if key != "bootstrap.servers"}

    def client_settings(self) -> dict[str, str]:
        """The settings as the clients take them, the secrets revealed."""
        secrets = {field.alias: getattr(self, name) for name, field in type(self).model_fields.items()}
        return {**{key: value.get_secret_value() for key, value in secrets.items() if value is not None},
                **(self.model_extra or {})}


class SchemaRegistryConfig(BaseModel):
    """The schema registry client's settings beside its URL, in confluent-kafka's names (SchemaRegistryClient's
    configuration: `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`, `timeout`, ...); the basic
    auth credentials are declared, as a secret. A setting the client does not know is refused by the client, by name.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    basic_auth_user_info: SecretStr | None = Field(default=None, alias="basic.auth.user.info",
                                                   description="`user:password` for the registry's basic auth")

    @model_validator(mode="before")
    @classmethod
    def _without_url(cls, data: object) -> object:
        if not isinstance(data, dict):
            raise ValueError(f"the schema registry client settings must be a JSON object, not {type(data).__name__}")
        # Values keep their JSON types: the client takes `timeout` or `max.retries` as numbers only.
        return {str(key): value for key, value in data.items() if key != "url"}

    def client_settings(self) -> dict[str, Any]:
        """The settings as the client takes them, the secret revealed."""
        secret = {} if self.basic_auth_user_info is None else {
            "basic.auth.user.info": self.basic_auth_user_info.get_secret_value()}
        return {**secret, **(self.model_extra or {})}


# librdkafka writes its informational lines (syslog level 6, such as "Purging 1 unserved events from background
# queue" while a client is destroyed) to stderr, which Airflow logs as ERROR in a successful task's log and the
# CLI shows after its output. Warnings and worse only, unless the deployment's settings say otherwise.
LIBRDKAFKA_LOG_LEVEL = 4


def confluent_config(servers: str, settings: dict[str, str], **overrides: object) -> dict[str, object]:
    """A confluent-kafka client configuration: the servers, the deployment's settings, then the caller's own."""
    return {"bootstrap.servers": servers, "log_level": LIBRDKAFKA_LOG_LEVEL, **settings, **overrides}


def java_client_properties(settings: dict[str, str]) -> str:
    """The deployment's settings as a Java client properties file (for Kafka's own command-line tools)."""
    def escaped(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")

    return "".join(f"{key.removeprefix('kafka.')}={escaped(value)}\n" for key, value in spark_options(settings).items())


def _jaas_value(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_options(settings: dict[str, str]) -> dict[str, str]:
    """The same settings as options of Spark's Kafka source (`kafka.`-prefixed Java client properties).

    SASL credentials become the JAAS configuration the Java client wants; PEM files (ssl.ca.location, a
    client certificate and key) become PEM trust and key stores. Security settings the Java client has no
    translation for here are refused by name rather than dropped: a dropped one would connect differently.
    """
    options: dict[str, str] = {}
    remaining = dict(settings)
    for key in SAME_NAME_IN_JAVA:
        if key in remaining:
            options[f"kafka.{key}"] = remaining.pop(key)
    mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms"))
    remaining.pop("sasl.mechanisms", None)
    if mechanism is not None:
        options["kafka.sasl.mechanism"] = mechanism
    username, password = remaining.pop("sasl.username", None), remaining.pop("sasl.password", None)
    if username is not None or password is not None:
        module = SASL_LOGIN_MODULES.get(mechanism or "")
        if module is None:
            raise KafkaConfigError(f"sasl.mechanism {mechanism!r} with a username and password: supported "
                                   f"mechanisms are {', '.join(SASL_LOGIN_MODULES)}")
        options["kafka.sasl.jaas.config"] = (
            f"{module} required username={_jaas_value(username or '')} password={_jaas_value(password or '')};")
    ca = remaining.pop("ssl.ca.location", None)
    if ca is not None:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = ca
    certificate, key = remaining.pop("ssl.certificate.location", None), remaining.pop("ssl.key.location", None)
    if (certificate is None) != (key is None):
        raise KafkaConfigError("a client certificate needs both ssl.certificate.location and ssl.key.location")
    if certificate is not None and key is not None:
        # The Java client takes a PEM key store as values: the certificate chain and the PKCS#8 key.
        options["kafka.ssl.keystore.type"] = "PEM"
        options["kafka.ssl.keystore.certificate.chain"] = Path(certificate).read_text()
        options["kafka.ssl.keystore.key"] = Path(key).read_text()
    identification = remaining.pop("ssl.endpoint.identification.algorithm", None)
    if identification is not None:
        options["kafka.ssl.endpoint.identification.algorithm"] = "" if identification == "none" else identification
    unsupported = sorted(key for key in remaining if key.split(".")[0] in ("security", "sasl", "ssl"))
    if unsupported:
        raise KafkaConfigError(f"Kafka setting(s) {', '.join(unsupported)} cannot be given to Spark's Kafka "
                               "reader here; supported: security.protocol, sasl.mechanism, sasl.username, "
                               "sasl.password, ssl.ca.location, ssl.certificate.location, ssl.key.location, "
                               "ssl.key.password, ssl.endpoint.identification.algorithm")
    return options


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
    # Strings go untyped, so that Postgres reads each into its column's type: Spark writes a jsonb column's text as
    # a string, which Postgres would refuse as `character varying` for a jsonb column.
    properties["stringtype"] = "unspecified"
    return JdbcTarget(
        url=f"jdbc:postgresql://{','.join(addresses)}/{quote(database, safe='')}?{urlencode(properties)}",
        user=user,
        password=password,
    )


def _masked_dsn(dsn: str) -> str:
    """A libpq connection string with its password as `***`: a URL's user info and `password` parameter, a key=value
    string's `password` (quoted or not)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            if ":" in userinfo:
                netloc = f"{userinfo.partition(':')[0]}:***@{hosts}"
        query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    return re.sub(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


@dataclass(frozen=True, repr=False)
class LedgerDatabase:
    """The ledger's Postgres database: one libpq connection string (URL or key=value, a secret as a whole) and the
    bounds of its statements and lock waits, in seconds (settings.Settings.db_statement_timeout, db_lock_timeout)."""

    url: str
    statement_timeout: int = 600
    lock_timeout: int = 600

    def libpq(self) -> str:
        """The connection string as psycopg2 takes it."""
        return self.url

    def settings(self) -> dict[str, str]:
        """Its settings, parsed by libpq."""
        return libpq_settings(self.url)

    def sqlalchemy(self) -> str:
        """The same database as a SQLAlchemy URL (psycopg2 driver)."""
        return sqlalchemy_url(self.url)

    def jdbc(self) -> JdbcTarget:
        """The same database as Spark's JDBC writer takes it: a URL, and the credentials apart."""
        return jdbc_target(self.url)

    def password(self) -> str | None:
        return self.settings().get("password")

    def __str__(self) -> str:
        return _masked_dsn(self.url)

    __repr__ = __str__


@dataclass(frozen=True, repr=False)
class KafkaClient:
    """Kafka: its bootstrap servers and the client settings beside them (security and the like, secrets among them),
    in librdkafka's names."""

    servers: str
    settings: Mapping[str, str] = field(default_factory=dict)

    def confluent(self, **overrides: object) -> dict[str, object]:
        """A confluent-kafka client configuration: the servers, the settings, then `overrides`."""
        return confluent_config(self.servers, dict(self.settings), **overrides)

    def spark_options(self) -> dict[str, str]:
        """The same as options of Spark's Kafka source (`kafka.`-prefixed Java client properties)."""
        return {"kafka.bootstrap.servers": self.servers, **spark_options(dict(self.settings))}

    def java_properties(self) -> str:
        """The settings as a Java client properties file (Kafka's own command-line tools)."""
        return java_client_properties(dict(self.settings))

    def secrets(self) -> list[str]:
        """The secret values among the settings."""
        return [value for key, value in self.settings.items() if key in _SECRET_KEYS and value]

    def __str__(self) -> str:
        return self.servers

    __repr__ = __str__


_SECRET_KEYS = {f.alias for f in KafkaClientConfig.model_fields.values()}


def _masked_url(url: str) -> str:
    """A URL with the password of its user info as `***`."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return urlunsplit(parts._replace(netloc=f"{userinfo.partition(':')[0]}:***@{hosts}"))


@dataclass(frozen=True, repr=False)
class SchemaRegistry:
    """A schema registry with the Confluent Schema Registry API (Confluent's, Karapace, Apicurio's ccompat API): its
    URL and the client settings beside it (basic auth, TLS), in confluent-kafka's names. `str` shows no secret."""

    url: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def client_config(self) -> dict[str, Any]:
        """confluent-kafka's SchemaRegistryClient configuration."""
        return {"url": self.url, **self.settings}

    def client(self) -> Any:  # confluent_kafka.schema_registry.SchemaRegistryClient, imported only here
        """A client of the registry (confluent-kafka's: it caches the schemas it has read)."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        # Its HTTP client logs every request at INFO: a line per schema in every task log.
        logging.getLogger("httpx2").setLevel(logging.WARNING)
        try:  # new_client: a `mock://` URL gives the client's in-process registry (the unit tests')
            return SchemaRegistryClient.new_client(self.client_config())
        except (ValueError, TypeError) as exc:  # an unknown or malformed setting, in the client's own words
            raise SettingsError(f"the schema registry client settings are not valid: {exc}") from None

    def secrets(self) -> list[str]:
        """The secret values: the basic auth credentials, from the settings or the URL's user info."""
        password = urlsplit(self.url).password
        user_info = self.settings.get("basic.auth.user.info")
        return [value for value in (user_info, user_info and user_info.partition(":")[2], password) if value]

    def __str__(self) -> str:
        return _masked_url(self.url)

    __repr__ = __str__


def no_schema_registry() -> SchemaRegistry:
    raise SettingsError("no schema registry configured: set KAFKA_LEDGER_SCHEMA_REGISTRY_URL")


@dataclass(frozen=True)
class Services:
    """What a piece of kafka-ledger work talks to: the ledger database and Kafka, who hears of its events, and the
    schema registry, found when first asked (a registry format's plan, read or warm-up: a deployment of JSON values
    needs none, and never looks it up)."""

    ledger: LedgerDatabase
    kafka: KafkaClient
    observer: Observer = field(default_factory=default_observer)
    schema_registry: Callable[[], SchemaRegistry] = no_schema_registry

    def registry(self) -> SchemaRegistry:
        """The schema registry, or SettingsError saying where to set it."""
        return self.schema_registry()

    def secrets(self) -> list[str]:
        """Every secret the services hold: the ledger's connection string and its password (a log may show either),
        Kafka's passwords."""
        password = self.ledger.password()
        return [self.ledger.url, *([password] if password else []), *self.kafka.secrets()]

    def with_observer(self, observer: Observer) -> Services:
        """The same services, their events told to `observer` instead."""
        return replace(self, observer=observer)

    def describe(self) -> dict[str, Any]:
        """The services in words, secrets masked (a log line, the CLI)."""
        return {"ledger": str(self.ledger), "kafka": str(self.kafka)}
