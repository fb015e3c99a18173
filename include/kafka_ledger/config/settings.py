"""The deployment's settings, one typed model: the environment first, then Airflow connections.

Settings declares every KAFKA_LEDGER_* variable the package reads (type, default, description; secrets as
SecretStr). deployment_settings() reads them; the entry points (a task, the CLI, the page) turn them into the
services they hand down (deployment_services(), task_services(): config/services.py), raising SettingsError in one
sentence naming the variable.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, get_args

from pydantic import BaseModel, Field, PrivateAttr, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from kafka_ledger.config.services import (
    KafkaClient,
    KafkaClientConfig,
    LedgerDatabase,
    SchemaRegistry,
    SchemaRegistryConfig,
    Services,
    SettingsError,
)
from kafka_ledger.observe.observer import Observer, default_observer

LEDGER_DB_CONN_ID = "kafka_ledger_db"
KAFKA_CONN_ID = "kafka_ledger_kafka"
# The Spark provider's connection types: `spark` for spark-submit, `spark_connect` for the warm server.
SPARK_SUBMIT_CONN_ID = "spark_default"
SPARK_CONNECT_CONN_ID = "spark_connect_default"
SCHEMA_REGISTRY_CONN_ID = "kafka_ledger_schema_registry"

SparkRuntime = Literal["connect", "submit"]
# Without a deployment default, spark-submit: it needs nothing running beyond Spark itself.
DEFAULT_SPARK_RUNTIME: SparkRuntime = "submit"
PROJECT_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG_PATH = PROJECT_ROOT / "config" / "pipelines.yaml"


class ConnectionString(SecretStr):
    """A libpq connection string (URL or key=value): a secret as a whole, and its password on its own."""


class Settings(BaseSettings):
    """The deployment's settings, each from the environment variable KAFKA_LEDGER_<FIELD NAME> (empty means unset).

    A field whose json_schema_extra names an `airflow_connection` comes from that Airflow connection when its
    variable is unset (AirflowConnections, for the callers of deployment_settings() that name the connection).
    Its `local_stack` and `compose` values are what scripts/env.sh and docker-compose.yaml set the variable to
    (generated there by config_reference; env.sh's values may use the KL_* variables it sets before).
    """

    model_config = SettingsConfigDict(env_prefix="KAFKA_LEDGER_", env_ignore_empty=True, frozen=True)

    bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka's bootstrap servers, `host:port[,host:port...]`; from the Airflow connection: its "
                    "extra's `bootstrap.servers`, else its host and port",
        json_schema_extra={"airflow_connection": KAFKA_CONN_ID, "local_stack": "127.0.0.1:$KL_KAFKA_PORT",
                           "compose": "kafka:9092"})
    # NoDecode: the validator below reads the JSON, so that a malformed value is an error in its own words.
    kafka_config: Annotated[KafkaClientConfig | None, NoDecode] = Field(
        default=None,
        description="the Kafka client settings beside the servers (security and the like), a JSON object in "
                    "confluent-kafka's names (see [Secured Kafka](deployment.md#secured-kafka)); "
                    f"{', '.join(f'`{f.alias}`' for f in KafkaClientConfig.model_fields.values())} are secrets. "
                    "They come from where the servers come from: without this variable and "
                    "`KAFKA_LEDGER_BOOTSTRAP_SERVERS`, the extra of the Airflow connection; with the servers "
                    "alone, none (plaintext)",
        json_schema_extra={"airflow_connection": KAFKA_CONN_ID})
    db_url: ConnectionString | None = Field(
        default=None,
        description="the ledger database (ledger, staging and output tables): any libpq connection string, URL "
                    "or `host=... dbname=...` key=value, parsed by libpq; Spark's JDBC writer gets the same "
                    "settings translated (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `sslpassword`, "
                    "`connect_timeout`, `application_name`, `options`; any other setting is refused with its name "
                    "rather than dropped). A secret: it holds the password",
        json_schema_extra={
            "airflow_connection": LEDGER_DB_CONN_ID,
            # The local Postgres accepts the ledger role over TLS only, and the ledger checks its certificate.
            "local_stack": "postgresql://kafka_ledger:$KL_PG_LEDGER_PASSWORD@127.0.0.1:$KL_PG_PORT/kafka_ledger"
                           "?sslmode=verify-full&sslrootcert=$KL_TLS_DIR/ca.pem",
            # Compose refuses to start without the password in .env.
            "compose": "postgresql://kafka_ledger:${KAFKA_LEDGER_DB_PASSWORD:?set it in .env}@postgres:5432"
                       "/kafka_ledger",
        })
    schema_registry_url: str | None = Field(
        default=None,
        description="the schema registry of Avro and registry-framed values: the base URL of its Confluent Schema "
                    "Registry API (Confluent's registry, Karapace, Apicurio's `/apis/ccompat/v7`); from the Airflow "
                    "connection: its host, the whole URL",
        json_schema_extra={"airflow_connection": SCHEMA_REGISTRY_CONN_ID,
                           "local_stack": "http://127.0.0.1:$KL_SCHEMA_REGISTRY_PORT/apis/ccompat/v7"})
    schema_registry_config: Annotated[SchemaRegistryConfig | None, NoDecode] = Field(
        default=None,
        description="the registry client's settings beside the URL, a JSON object in confluent-kafka's names "
                    "(`basic.auth.user.info`, a secret: `user:password`; `ssl.ca.location`, "
                    "`ssl.certificate.location`, `ssl.key.location`). They come from where the URL comes from: "
                    "without this variable and `KAFKA_LEDGER_SCHEMA_REGISTRY_URL`, the Airflow connection (its login "
                    "and password, and its extra)",
        json_schema_extra={"airflow_connection": SCHEMA_REGISTRY_CONN_ID})
    spark_runtime: SparkRuntime = Field(
        default=DEFAULT_SPARK_RUNTIME,
        description="the deployment's Spark runtime, `connect` or `submit` (a pipeline's `spark_runtime` wins; "
                    "[Spark runtimes](deployment.md#spark-runtimes))",
        # The local stack runs a warm Spark Connect server, so pipelines use it unless they say submit.
        json_schema_extra={"local_stack": "connect"})
    spark_master: str | None = Field(
        default=None,
        description="the Spark master spark-submit must use: a batch is refused when the `spark_default` "
                    "connection says another (`scripts/env.sh` makes that connection from this variable; the "
                    "local Spark Connect server uses it too)",
        json_schema_extra={"local_stack": "local[*]", "compose": "spark://spark-master:7077"})
    spark_driver_secret: str | None = Field(
        default=None,
        description="the Kubernetes Secret a batch's driver in cluster deploy mode (a `k8s://` master with "
                    "`deploy-mode: cluster` in the `spark_default` connection) reads the ledger's and Kafka's secrets "
                    "from, in its own namespace: keys named like the variables (`KAFKA_LEDGER_DB_URL`, "
                    "`KAFKA_LEDGER_KAFKA_CONFIG`, `KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG`); "
                    "[Spark on Kubernetes](deployment.md#spark-on-kubernetes)")
    pipelines: Path = Field(
        default=DEFAULT_CONFIG_PATH, description="the pipelines file",
        json_schema_extra={"local_stack": "$KL_HOME/config/pipelines.yaml",
                           "compose": "/opt/kafka-ledger/config/pipelines.yaml"})  # bind-mounted from config/
    spark_jars_dir: Path | None = Field(
        default=None,
        description="the folder of jars passed to spark-submit (`--jars`): the Kafka connector and the Postgres "
                    "JDBC driver (`scripts/stack.sh install` fills the local stack's)",
        # The Airflow image is built with them there (docker/airflow.Dockerfile).
        json_schema_extra={"local_stack": "$KL_CACHE/spark-jars", "compose": "/opt/kafka-ledger/spark-jars"})
    kafka_tools_dir: Path | None = Field(
        default=None,
        description="the folder holding Kafka's jars (a `kafka-tools` jar and its dependencies) that "
                    "`kafka-ledger kafka <tool>` runs Kafka's own command-line tools from (`scripts/stack.sh "
                    "install` fills the local stack's)",
        # The local stack's are the jars its broker runs from. The Airflow image of Docker Compose has no Kafka
        # tools (only the Spark connector's Kafka client): unset there.
        json_schema_extra={"local_stack": "$KL_KAFKA_LIBS"})
    db_statement_timeout: int = Field(
        default=600, ge=1,
        description="any one ledger statement (a batch's publish and commit get its `spark_timeout_minutes`); a "
                    "client that has no answer 15 s past it takes the server for unreachable and fails the call")
    db_lock_timeout: int = Field(
        default=600, ge=1,
        description="a wait for a lock: the pipeline's or a batch's, held by the one plan, commit or reset of the "
                    "pipeline that runs at a time")

    metrics_token: SecretStr | None = Field(
        default=None,
        description="the bearer token `kafka-ledger metrics serve` asks of every scrape (Prometheus: its scrape "
                    "config's `authorization: {credentials_file: ...}`). A secret",
        json_schema_extra={"local_stack": "$KL_METRICS_TOKEN"})
    metrics_basic_auth: SecretStr | None = Field(
        default=None,
        description="`user:password` the metrics endpoint accepts through basic auth (beside or instead of the "
                    "token). A secret")

    # The Airflow connections looked up while these settings were read: id -> None when read, else why not.
    _connections: dict[str, Exception | None] = PrivateAttr(default_factory=dict)

    @field_validator("kafka_config", "schema_registry_config", mode="before")
    @classmethod
    def _json_object(cls, value: object) -> object:
        if not isinstance(value, str):
            return value  # an Airflow connection's extra, already a mapping
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON object: {exc.msg}") from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment first, then the Airflow connections deployment_settings() was asked for: no .env
        # file or secrets folder, which the deployment does not use.
        connections = _CONNECTIONS.get()
        return (init_settings, env_settings) if connections is None else (init_settings, env_settings, connections)

    def ledger_dsn(self) -> str:
        """The ledger database URL, or SettingsError saying where to set it."""
        if self.db_url is None:
            raise SettingsError(
                f"no ledger database configured: set KAFKA_LEDGER_DB_URL or the Airflow connection "
                f"{LEDGER_DB_CONN_ID!r} (scripts/env.sh does both for the local stack)"
            ) from self._connections.get(LEDGER_DB_CONN_ID)
        return self.db_url.get_secret_value()

    def kafka_servers(self) -> str:
        """Kafka's bootstrap servers, or SettingsError saying where to set them."""
        if self.bootstrap_servers:
            return self.bootstrap_servers
        if KAFKA_CONN_ID in self._connections and self._connections[KAFKA_CONN_ID] is None:
            raise SettingsError(f"Airflow connection {KAFKA_CONN_ID!r} has no bootstrap.servers in its extra")
        raise SettingsError(
            f"no Kafka configured: set KAFKA_LEDGER_BOOTSTRAP_SERVERS or the Airflow connection {KAFKA_CONN_ID!r} "
            "with extra {\"bootstrap.servers\": \"host:port\"}"
        ) from self._connections.get(KAFKA_CONN_ID)

    def schema_registry(self) -> SchemaRegistry:
        """The schema registry, or SettingsError saying where to set it."""
        if self.schema_registry_url is None:
            raise SettingsError(
                f"no schema registry configured: set KAFKA_LEDGER_SCHEMA_REGISTRY_URL or the Airflow connection "
                f"{SCHEMA_REGISTRY_CONN_ID!r} (its host the registry's URL; scripts/env.sh sets the variable for the "
                "local stack)") from self._connections.get(SCHEMA_REGISTRY_CONN_ID)
        config = self.schema_registry_config
        return SchemaRegistry(self.schema_registry_url, config.client_settings() if config is not None else {})

    def kafka_client_settings(self) -> dict[str, str]:
        """The Kafka client settings beyond the servers, in librdkafka's names, their secrets revealed."""
        if self.kafka_config is not None:
            return self.kafka_config.client_settings()
        if self.bootstrap_servers is None:  # neither in the environment nor from a connection: unknown
            raise SettingsError(f"no Kafka configured: set KAFKA_LEDGER_BOOTSTRAP_SERVERS or the Airflow connection "
                                f"{KAFKA_CONN_ID!r}") from self._connections.get(KAFKA_CONN_ID)
        return {}


def env_name(field: str) -> str:
    """The environment variable of a Settings field."""
    if field not in Settings.model_fields:
        raise KeyError(f"Settings has no field {field!r}")
    return f"{Settings.model_config['env_prefix']}{field.upper()}"


def _airflow_connection(conn_id: str):  # noqa: ANN202 - airflow's Connection type, imported lazily
    try:
        from airflow.sdk import BaseHook
    except ImportError as exc:  # pragma: no cover - airflow is always installed by set-up
        raise SettingsError(f"Airflow is not importable to look up connection {conn_id!r}") from exc
    return BaseHook.get_connection(conn_id)


class AirflowConnections(PydanticBaseSettingsSource):
    """The settings the environment leaves unset, from the Airflow connections named (Airflow imported only then).

    `kafka_ledger_db` gives the ledger database URL (the connection's URI). `kafka_ledger_kafka` gives the
    bootstrap servers (its extra's bootstrap.servers, else host:port) and, unless the environment gives them,
    the Kafka client settings (its extra): they come from where the servers come from, so servers set in the
    environment never get a connection's security settings. `kafka_ledger_schema_registry` gives the registry's URL
    (its host) and, likewise, its client settings (its extra, and basic auth from its login and password). A
    connection that cannot be read leaves its settings unset, and their readers say why (Settings._connections).
    """

    def __init__(self, settings_cls: type[BaseSettings], conn_ids: Collection[str]):
        super().__init__(settings_cls)
        self.conn_ids = conn_ids
        self.outcomes: dict[str, Exception | None] = {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Not used: __call__ reads each connection once for all the settings it gives.
        return None, field_name, False

    def _read(self, conn_id: str) -> Any:
        try:
            connection = _airflow_connection(conn_id)
        except Exception as exc:  # noqa: BLE001 - whatever the reason, the setting stays unset and its reader says so
            self.outcomes[conn_id] = exc
            return None
        self.outcomes[conn_id] = None
        return connection

    def __call__(self) -> dict[str, Any]:
        given = self.current_state  # what the environment set
        values: dict[str, Any] = {}
        if LEDGER_DB_CONN_ID in self.conn_ids and "db_url" not in given:
            connection = self._read(LEDGER_DB_CONN_ID)
            if connection is not None:
                values["db_url"] = connection.get_uri()
        if KAFKA_CONN_ID in self.conn_ids and "bootstrap_servers" not in given:
            connection = self._read(KAFKA_CONN_ID)
            if connection is not None:
                extra = connection.extra_dejson
                servers = extra.get("bootstrap.servers") or (
                    f"{connection.host}:{connection.port or 9092}" if connection.host else None)
                if servers:
                    values["bootstrap_servers"] = servers
                if "kafka_config" not in given:
                    values["kafka_config"] = extra
        if SCHEMA_REGISTRY_CONN_ID in self.conn_ids and "schema_registry_url" not in given:
            connection = self._read(SCHEMA_REGISTRY_CONN_ID)
            if connection is not None and connection.host:
                values["schema_registry_url"] = connection.host
                if "schema_registry_config" not in given:
                    credentials = ({"basic.auth.user.info": f"{connection.login}:{connection.password or ''}"}
                                   if connection.login else {})
                    values["schema_registry_config"] = {**connection.extra_dejson, **credentials}
        return values


# The Airflow connections source of the Settings being read, set by deployment_settings() for the connections
# its caller names, so that no connection is looked up that the caller does not need: building a DAG reads
# the Spark runtime and the pipelines file and must look up none. A context variable because pydantic-settings
# makes a model's sources in a class method (settings_customise_sources), which takes no arguments of a call.
_CONNECTIONS: ContextVar[AirflowConnections | None] = ContextVar("kafka_ledger_airflow_connections", default=None)


def _holds_secrets(annotation: Any) -> bool:
    """Whether a field's type holds a secret (a SecretStr, or a model with one), whose value no error may show."""
    if isinstance(annotation, type) and issubclass(annotation, SecretStr):
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_holds_secrets(field.annotation) for field in annotation.model_fields.values())
    return any(_holds_secrets(argument) for argument in get_args(annotation))


def _in_words(exc: ValidationError) -> str:
    """A validation error of the settings as one sentence: each variable with its value (unless secret) and why."""
    problems = []
    for error in exc.errors():
        field, *inside = (str(part) for part in error["loc"])
        where = env_name(field) + (f" ({'.'.join(inside)})" if inside else "")
        if not _holds_secrets(Settings.model_fields[field].annotation):
            where += f"={error['input']!r}"
        problems.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)


def deployment_settings(*conn_ids: str) -> Settings:
    """The deployment's settings from the environment; the Airflow connections `conn_ids` fill what it leaves unset.

    Read afresh at every call (a task, a test or the CLI may change the environment). Only the connections
    named are looked up, each once.
    """
    connections = AirflowConnections(Settings, conn_ids) if conn_ids else None
    token = _CONNECTIONS.set(connections)
    try:
        settings = Settings()
    except ValidationError as exc:
        raise SettingsError(_in_words(exc)) from None
    finally:
        _CONNECTIONS.reset(token)
    if connections is not None:
        settings._connections.update(connections.outcomes)
    return settings


def _ledger_database(settings: Settings) -> LedgerDatabase:
    return LedgerDatabase(settings.ledger_dsn(), settings.db_statement_timeout, settings.db_lock_timeout)


def deployment_services(*conn_ids: str, observer: Observer | None = None) -> Services:
    """The deployment's ledger database and Kafka (the environment first, then the Airflow connections `conn_ids`)
    as one value, with `observer` (default: the log) hearing of every event."""
    settings = deployment_settings(*conn_ids)
    kafka = KafkaClient(settings.kafka_servers(), settings.kafka_client_settings())
    ledger = _ledger_database(settings)
    return Services(ledger, kafka, default_observer() if observer is None else observer, schema_registry)


def task_services() -> Services:
    """The services of a task (and of the CLI and the page): the environment first, then the Airflow connections
    `kafka_ledger_db` and `kafka_ledger_kafka`."""
    return deployment_services(LEDGER_DB_CONN_ID, KAFKA_CONN_ID)


def kafka_for(servers: str) -> KafkaClient:
    """Kafka at `servers` with the deployment's client settings from the environment (a tool's, a test's own Kafka)."""
    settings = deployment_settings()
    return KafkaClient(servers, settings.kafka_config.client_settings() if settings.kafka_config else {})


def services_for(dsn: str, servers: str, observer: Observer | None = None) -> Services:
    """The services of a ledger database and a Kafka given by the caller (a tool's, a test's), with the
    deployment's ledger timeouts and Kafka client settings from the environment."""
    settings = deployment_settings()
    ledger = LedgerDatabase(dsn, settings.db_statement_timeout, settings.db_lock_timeout)
    kafka = kafka_for(servers)
    return Services(ledger, kafka, default_observer() if observer is None else observer, schema_registry)


def ledger_database() -> LedgerDatabase:
    """The ledger database alone, for work that needs no Kafka: the environment first, then the Airflow connection
    `kafka_ledger_db`."""
    return _ledger_database(deployment_settings(LEDGER_DB_CONN_ID))


def kafka_client() -> KafkaClient:
    """Kafka alone: the environment first, then the Airflow connection `kafka_ledger_kafka`."""
    settings = deployment_settings(KAFKA_CONN_ID)
    return KafkaClient(settings.kafka_servers(), settings.kafka_client_settings())


def schema_registry() -> SchemaRegistry:
    """The schema registry: the environment first, then the Airflow connection `kafka_ledger_schema_registry`."""
    return deployment_settings(SCHEMA_REGISTRY_CONN_ID).schema_registry()


def deployment_spark_runtime() -> str:
    """The deployment's Spark runtime: $KAFKA_LEDGER_SPARK_RUNTIME, else submit."""
    return deployment_settings().spark_runtime


class ChoosesSparkRuntime(Protocol):
    """A pipeline's declaration, as far as the Spark runtime goes (config.PipelineConfig)."""

    @property
    def spark_runtime(self) -> SparkRuntime | None: ...


def runtime_name(pipeline: ChoosesSparkRuntime) -> str:
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
