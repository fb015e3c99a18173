"""Service settings: environment look-ups, Airflow connection fallback, SQLAlchemy and JDBC URL conversions."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kafka_ledger.config import pipeline as config
from kafka_ledger.config import settings
from kafka_ledger.config.services import JdbcTarget, SettingsError, jdbc_target, sqlalchemy_url


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


# --- the ledger database and Kafka --------------------------------------------------------------------------------


def test_ledger_dsn_from_environment(monkeypatch, no_airflow):
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://u:p@db:5432/ledger")
    assert settings.ledger_database().url == "postgresql://u:p@db:5432/ledger"


def test_ledger_dsn_falls_back_to_airflow_connection(monkeypatch):
    calls = airflow_returns(monkeypatch, SimpleNamespace(get_uri=lambda: "postgres://a:b@h:1/d"))
    assert settings.ledger_database().url == "postgres://a:b@h:1/d"
    assert calls == [settings.LEDGER_DB_CONN_ID]


def test_ledger_dsn_empty_env_falls_back_to_airflow(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "")
    airflow_returns(monkeypatch, SimpleNamespace(get_uri=lambda: "postgres://x@h/d"))
    assert settings.ledger_database().url == "postgres://x@h/d"


def test_ledger_dsn_unconfigured_raises_settings_error(no_airflow):
    with pytest.raises(SettingsError, match="KAFKA_LEDGER_DB_URL") as exc_info:
        settings.ledger_database()
    assert "kafka_ledger_db" in str(exc_info.value)


def test_bootstrap_servers_from_environment(monkeypatch, no_airflow):
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    assert settings.kafka_client().servers == "k1:9092,k2:9092"


def test_bootstrap_servers_from_airflow_connection_extra(monkeypatch):
    conn = SimpleNamespace(extra_dejson={"bootstrap.servers": "k:9094"}, host="ignored", port=1)
    calls = airflow_returns(monkeypatch, conn)
    assert settings.kafka_client().servers == "k:9094"
    assert calls == [settings.KAFKA_CONN_ID]


def test_bootstrap_servers_from_airflow_connection_host_and_port(monkeypatch):
    airflow_returns(monkeypatch, SimpleNamespace(extra_dejson={}, host="kafka", port=29092))
    assert settings.kafka_client().servers == "kafka:29092"


def test_bootstrap_servers_connection_without_address_raises(monkeypatch):
    airflow_returns(monkeypatch, SimpleNamespace(extra_dejson={}, host=None, port=None))
    with pytest.raises(SettingsError, match="has no bootstrap.servers"):
        settings.kafka_client()


def test_bootstrap_servers_unconfigured_raises_settings_error(no_airflow):
    with pytest.raises(SettingsError, match="KAFKA_LEDGER_BOOTSTRAP_SERVERS"):
        settings.kafka_client()


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
        url="jdbc:postgresql://db.local:6543/kafka_ledger?reWriteBatchedInserts=true&stringtype=unspecified",
        user="ledger",
        password="secret",
    )


def test_jdbc_target_decodes_percent_encoded_credentials():
    target = jdbc_target("postgres://us%40er:p%40ss%3Aw%2Ford%25@h:5432/db")
    assert target.user == "us@er"
    assert target.password == "p@ss:w/ord%"
    assert target.url == "jdbc:postgresql://h:5432/db?reWriteBatchedInserts=true&stringtype=unspecified"
    assert "p@ss" not in target.url and "p%40ss" not in target.url


def test_jdbc_target_translates_libpq_settings_to_the_jdbc_driver():
    target = jdbc_target("postgresql://u:p@h:5432/db?sslmode=verify-full&sslrootcert=/ca/root.crt&connect_timeout=5")
    assert target.url == ("jdbc:postgresql://h:5432/db?connectTimeout=5&sslmode=verify-full"
                          "&sslrootcert=%2Fca%2Froot.crt&reWriteBatchedInserts=true&stringtype=unspecified")


def test_a_key_value_dsn_gives_the_same_targets_as_its_url():
    dsn = "host=db.local port=6543 dbname=kafka_ledger user=ledger password='s3 cr=t' sslmode=require"
    assert jdbc_target(dsn) == JdbcTarget(
        url="jdbc:postgresql://db.local:6543/kafka_ledger?sslmode=require&reWriteBatchedInserts=true&stringtype=unspecified",
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
        url="jdbc:postgresql://127.0.0.1:5432/postgres?reWriteBatchedInserts=true&stringtype=unspecified", user="",
        password="")


def test_jdbc_target_user_without_password():
    target = jdbc_target("postgresql://alice@h/db")
    assert (target.user, target.password) == ("alice", "")
    assert target.url == "jdbc:postgresql://h:5432/db?reWriteBatchedInserts=true&stringtype=unspecified"


def test_spark_runtime_pipeline_first_then_deployment_then_submit(monkeypatch):
    from kafka_ledger.config.pipeline import parse_pipelines
    from kafka_ledger.config.settings import runtime_name as spark_runtime

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
    from kafka_ledger.config.settings import spark_connect_url

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
                       '{"conn_type": "spark_connect", "host": "sc://spark.internal", "port": 15002, '
                       '"password": "t0k"}')
    assert spark_connect_url() == "sc://spark.internal:15002/;token=t0k"
    assert spark_connect_url("abc") == "sc://spark.internal:15002/;token=t0k;session_id=abc"


def test_ledger_timeouts_default_and_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://u@h/d")
    db = settings.ledger_database()
    assert (db.statement_timeout, db.lock_timeout) == (600, 600)
    monkeypatch.setenv("KAFKA_LEDGER_DB_LOCK_TIMEOUT", "5")
    assert settings.ledger_database().lock_timeout == 5
    monkeypatch.setenv("KAFKA_LEDGER_DB_LOCK_TIMEOUT", "0")
    with pytest.raises(SettingsError, match="KAFKA_LEDGER_DB_LOCK_TIMEOUT='0': Input should be greater than"):
        settings.ledger_database()


# --- the Settings model ---------------------------------------------------------------------------------------


def test_every_setting_is_described_and_named_kafka_ledger_field():
    from kafka_ledger.config.services import KAFKA_CONFIG_ENV

    assert [name for name, field in settings.Settings.model_fields.items() if not field.description] == []
    assert settings.env_name("kafka_config") == KAFKA_CONFIG_ENV
    assert settings.env_name("db_url") == "KAFKA_LEDGER_DB_URL"
    with pytest.raises(KeyError):
        settings.env_name("nothing")


def test_the_environment_wins_and_no_connection_is_looked_up_for_what_it_gives(monkeypatch):
    calls = airflow_returns(monkeypatch, SimpleNamespace(get_uri=lambda: "postgres://conn@h/d"))
    monkeypatch.setenv("KAFKA_LEDGER_DB_URL", "postgresql://env@h/d")
    assert settings.ledger_database().url == "postgresql://env@h/d"
    assert calls == []


def test_only_the_connections_a_caller_names_are_looked_up(monkeypatch):
    def refuse(conn_id):
        raise AssertionError(f"looked up {conn_id}")

    monkeypatch.setattr(settings, "_airflow_connection", refuse)
    # The environment's settings alone (the Spark runtime, the pipelines file, the timeouts): no look-up.
    assert settings.deployment_settings().spark_runtime == "submit"
    assert settings.deployment_spark_runtime() == "submit"
    from kafka_ledger.config import pipeline as config

    assert config.config_path() == settings.DEFAULT_CONFIG_PATH


def test_building_a_dag_looks_up_no_connection(monkeypatch):
    from kafka_ledger.airflow.dags import build_pipeline_dag
    from kafka_ledger.config.pipeline import parse_pipelines

    def refuse(conn_id):
        raise AssertionError(f"looked up {conn_id} while building a DAG")

    monkeypatch.setattr(settings, "_airflow_connection", refuse)
    pipeline = parse_pipelines("pipelines:\n  p:\n    topics: [t]\n    output_table: t\n"
                               "    columns: [{name: a, type: string}]\n")["p"]
    assert build_pipeline_dag(pipeline).dag_id == "kafka_ledger__p"


def test_why_a_connection_could_not_be_read_is_the_errors_cause(monkeypatch):
    def broken(conn_id):
        raise LookupError(f"secrets backend down for {conn_id}")

    monkeypatch.setattr(settings, "_airflow_connection", broken)
    with pytest.raises(SettingsError, match="no ledger database configured") as exc_info:
        settings.ledger_database()
    assert isinstance(exc_info.value.__cause__, LookupError)
    with pytest.raises(SettingsError, match="no Kafka configured") as exc_info:
        dict(settings.kafka_client().settings)
    assert isinstance(exc_info.value.__cause__, LookupError)


def test_kafka_settings_from_the_connection_are_secrets_too(monkeypatch):
    extra = {"bootstrap.servers": "k:9094", "security.protocol": "SASL_SSL", "sasl.password": "c0nn"}
    airflow_returns(monkeypatch, SimpleNamespace(extra_dejson=extra, host=None, port=None))
    loaded = settings.deployment_settings(settings.KAFKA_CONN_ID)
    assert (loaded.kafka_servers(), loaded.kafka_client_settings()) == (
        "k:9094", {"security.protocol": "SASL_SSL", "sasl.password": "c0nn"})
    assert settings.kafka_client().secrets() == ["c0nn"]
    assert "c0nn" not in repr(loaded)


def test_an_invalid_setting_is_one_sentence_naming_the_variable_and_never_showing_a_secret(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_DB_STATEMENT_TIMEOUT", "soon")
    monkeypatch.setenv("KAFKA_LEDGER_KAFKA_CONFIG", '{"sasl.password": "s3cret",}')
    with pytest.raises(SettingsError) as exc_info:
        settings.deployment_settings()
    message = str(exc_info.value)
    assert message.startswith("KAFKA_LEDGER_KAFKA_CONFIG: not a JSON object: "), message
    assert "; KAFKA_LEDGER_DB_STATEMENT_TIMEOUT='soon': Input should be a valid integer" in message
    assert "s3cret" not in message and "\n" not in message


def test_spark_jars_need_their_folder_named(monkeypatch, tmp_path):
    from kafka_ledger.runtimes.submit.spark_submit import spark_jars

    with pytest.raises(SettingsError, match="set KAFKA_LEDGER_SPARK_JARS_DIR"):
        spark_jars()
    (tmp_path / "b.jar").touch()
    (tmp_path / "a.jar").touch()
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_JARS_DIR", str(tmp_path))
    assert spark_jars() == f"{tmp_path}/a.jar,{tmp_path}/b.jar"


def test_the_spark_job_gets_the_settings_under_their_variables(monkeypatch):
    from kafka_ledger.config.services import KafkaClient, LedgerDatabase, Services
    from kafka_ledger.runtimes.submit.spark_submit import spark_job_environment

    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", "/etc/pipelines.yaml")
    from kafka_ledger.config.settings import schema_registry

    services = Services(LedgerDatabase("postgresql://h/d", 30, 20), KafkaClient("k:1", {"security.protocol": "SSL"}),
                        schema_registry=schema_registry)
    pipeline = config.parse_pipelines(json.dumps({"pipelines": {"p": {
        "topics": ["t"], "output_table": "t", "columns": [{"name": "id", "type": "string"}]}}}))["p"]
    expected = {
        "KAFKA_LEDGER_DB_URL": "postgresql://h/d", "KAFKA_LEDGER_BOOTSTRAP_SERVERS": "k:1",
        "KAFKA_LEDGER_KAFKA_CONFIG": '{"security.protocol": "SSL"}', "KAFKA_LEDGER_DB_STATEMENT_TIMEOUT": "30",
        "KAFKA_LEDGER_DB_LOCK_TIMEOUT": "20", "KAFKA_LEDGER_PIPELINES": "/etc/pipelines.yaml"}
    assert spark_job_environment(services, pipeline) == expected
    # Avro values: the job reads the schemas from the registry the task found (environment or Airflow connection).
    avro = pipeline.model_copy(update={"value": pipeline.value.model_copy(update={"format": "avro"})})
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_URL", "http://registry:8081")
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG", '{"basic.auth.user.info": "u:p"}')
    assert spark_job_environment(services, avro) == {
        **expected, "KAFKA_LEDGER_SCHEMA_REGISTRY_URL": "http://registry:8081",
        "KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG": '{"basic.auth.user.info": "u:p"}'}


def test_no_kafka_ledger_variable_is_read_outside_the_settings_models():
    """Nor any of the local stack's KL_* variables: what the package needs from them is a setting of its own."""
    import re

    root = Path(__file__).resolve().parents[2] / "include" / "kafka_ledger"
    reads = re.compile(r"(?:os\.environ(?:\.get\(|\[)|os\.getenv\()\s*[\"'](?:KAFKA_LEDGER|KL)_")
    found = sorted(str(path.relative_to(root)) for path in root.rglob("*.py") if reads.search(path.read_text()))
    # The benchmark's Python peer stands for a job written without kafka-ledger: it reads its database itself.
    assert [name for name in found if name != "benchmark_peers.py"] == []


def test_every_field_that_names_an_airflow_connection_comes_from_it(monkeypatch):
    connection = SimpleNamespace(get_uri=lambda: "postgres://c@h/d", extra_dejson={"bootstrap.servers": "k:1"},
                                 host="http://registry:8081", port=None, login=None, password=None)
    airflow_returns(monkeypatch, connection)
    named = {name: (field.json_schema_extra or {}).get("airflow_connection")
             for name, field in settings.Settings.model_fields.items()}
    named = {name: conn_id for name, conn_id in named.items() if conn_id}
    assert named == {"bootstrap_servers": "kafka_ledger_kafka", "kafka_config": "kafka_ledger_kafka",
                     "db_url": "kafka_ledger_db", "schema_registry_url": "kafka_ledger_schema_registry",
                     "schema_registry_config": "kafka_ledger_schema_registry"}
    loaded = settings.deployment_settings(*set(named.values()))
    assert all(getattr(loaded, name) is not None for name in named)
    assert settings.deployment_settings().model_fields_set == set()  # none without the connections named


# --- the schema registry ------------------------------------------------------------------------------------------


def test_schema_registry_from_environment(monkeypatch, no_airflow):
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_URL", "https://registry:8081/apis/ccompat/v7")
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG",
                       '{"basic.auth.user.info": "ingest:s3cret", "ssl.ca.location": "/etc/ca.pem"}')
    registry = settings.schema_registry()
    assert registry.client_config() == {"url": "https://registry:8081/apis/ccompat/v7",
                                        "basic.auth.user.info": "ingest:s3cret", "ssl.ca.location": "/etc/ca.pem"}
    assert registry.secrets() == ["ingest:s3cret", "s3cret"]
    assert "s3cret" not in repr(settings.deployment_settings()) and "s3cret" not in str(registry)


def test_schema_registry_from_airflow_connection_host_login_and_extra(monkeypatch):
    connection = SimpleNamespace(host="https://registry.example.com/apis/ccompat/v7", login="ingest",
                                 password="c0nn", extra_dejson={"ssl.ca.location": "/etc/ca.pem"}, port=None)
    calls = airflow_returns(monkeypatch, connection)
    registry = settings.schema_registry()
    assert calls == [settings.SCHEMA_REGISTRY_CONN_ID]
    assert registry.client_config() == {"url": "https://registry.example.com/apis/ccompat/v7",
                                        "basic.auth.user.info": "ingest:c0nn", "ssl.ca.location": "/etc/ca.pem"}
    assert "c0nn" not in str(registry)


def test_a_registry_url_in_the_environment_takes_no_settings_from_the_connection(monkeypatch):
    connection = SimpleNamespace(host="http://other", login="ingest", password="c0nn", extra_dejson={}, port=None)
    calls = airflow_returns(monkeypatch, connection)
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_URL", "http://127.0.0.1:18085/apis/ccompat/v7")
    assert settings.schema_registry().client_config() == {"url": "http://127.0.0.1:18085/apis/ccompat/v7"}
    assert calls == []


def test_schema_registry_unconfigured_says_where_to_set_it(no_airflow):
    with pytest.raises(SettingsError, match="no schema registry configured: set KAFKA_LEDGER_SCHEMA_REGISTRY_URL "
                                            "or the Airflow connection 'kafka_ledger_schema_registry'") as exc_info:
        settings.schema_registry()
    assert isinstance(exc_info.value.__cause__, LookupError)


def test_a_registry_url_with_credentials_never_shows_the_password():
    from kafka_ledger.config.services import SchemaRegistry

    registry = SchemaRegistry("https://ingest:pa55@registry:8081/apis/ccompat/v7")
    assert str(registry) == "https://ingest:***@registry:8081/apis/ccompat/v7"
    assert registry.secrets() == ["pa55"]


def test_a_registry_setting_the_client_does_not_know_is_refused_by_name(monkeypatch, no_airflow):
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_URL", "http://registry:8081")
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG", '{"ssl.ca.locaton": "/etc/ca.pem"}')
    with pytest.raises(SettingsError, match="ssl.ca.locaton"):
        settings.schema_registry().client()


def test_registry_settings_keep_their_json_types_and_a_wrong_type_is_refused_by_name(monkeypatch, no_airflow):
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_URL", "http://registry:8081")
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG", '{"max.retries": 1, "timeout": 2.5}')
    client = settings.schema_registry().client()
    assert (client._rest_client.max_retries, client._rest_client.timeout) == (1, 2.5)
    monkeypatch.setenv("KAFKA_LEDGER_SCHEMA_REGISTRY_CONFIG", '{"max.retries": "1"}')
    with pytest.raises(SettingsError, match="max.retries must be a number"):
        settings.schema_registry().client()
