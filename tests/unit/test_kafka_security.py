"""Kafka client settings: where they come from, and their translation for Spark's Java Kafka client."""

import json
from types import SimpleNamespace

import pytest

from kafka_ledger.config import services as kafka_security
from kafka_ledger.config import settings
from kafka_ledger.config.services import KafkaClient, KafkaClientConfig, KafkaConfigError, SettingsError, spark_options

SCRAM = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ingest",
         "sasl.password": 'p"a\\ss', "ssl.ca.location": "/etc/kafka/ca.pem"}


def test_settings_come_from_the_environment_first_without_bootstrap_servers(monkeypatch):
    connection = SimpleNamespace(extra_dejson={"security.protocol": "PLAINTEXT", "bootstrap.servers": "x:1"},
                                 host=None, port=None)
    monkeypatch.setattr(settings, "_airflow_connection", lambda conn_id: connection)
    monkeypatch.setenv(kafka_security.KAFKA_CONFIG_ENV, json.dumps({**SCRAM, "bootstrap.servers": "x:1"}))
    assert dict(settings.kafka_client().settings) == SCRAM
    monkeypatch.delenv(kafka_security.KAFKA_CONFIG_ENV)
    connection.extra_dejson = {"security.protocol": "SSL", "bootstrap.servers": "x:1"}
    assert dict(settings.kafka_client().settings) == {"security.protocol": "SSL"}
    # Servers from the environment never get a connection's settings: none but the environment's.
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k:1")
    assert dict(settings.kafka_client().settings) == {}


def test_malformed_environment_settings_are_a_clear_error_that_shows_no_value(monkeypatch):
    monkeypatch.setenv(kafka_security.KAFKA_CONFIG_ENV, "{security.protocol: SSL}")
    with pytest.raises(SettingsError, match=r"^KAFKA_LEDGER_KAFKA_CONFIG: not a JSON object: ") as exc_info:
        dict(settings.kafka_client().settings)
    assert "SSL" not in str(exc_info.value)  # the value may hold a password
    monkeypatch.setenv(kafka_security.KAFKA_CONFIG_ENV, '["SSL"]')
    with pytest.raises(SettingsError, match="must be a JSON object, not list"):
        dict(settings.kafka_client().settings)


def test_deployment_settings_follow_the_servers_environment(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k:9093")
    monkeypatch.setenv(kafka_security.KAFKA_CONFIG_ENV, json.dumps(SCRAM))
    config = settings.kafka_client().confluent(**{"group.id": "g"})
    assert config == {"bootstrap.servers": "k:9093", "log_level": 4, **SCRAM, "group.id": "g"}


def test_scram_over_tls_becomes_a_jaas_configuration_and_a_pem_trust_store():
    assert spark_options(SCRAM) == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="ingest" password="p\\"a\\\\ss";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
    }


def test_plain_mechanism_and_librdkafka_plural_name():
    options = spark_options({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                             "sasl.username": "u", "sasl.password": "p"})
    assert options["kafka.sasl.mechanism"] == "PLAIN"
    assert options["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule")


def test_mutual_tls_reads_the_pem_files_into_a_key_store(tmp_path):
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nY\n-----END PRIVATE KEY-----\n")
    options = spark_options({"security.protocol": "SSL", "ssl.certificate.location": str(cert),
                             "ssl.key.location": str(key), "ssl.endpoint.identification.algorithm": "none"})
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.keystore.certificate.chain"] == cert.read_text()
    assert options["kafka.ssl.keystore.key"] == key.read_text()
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_what_spark_cannot_be_given_is_refused_by_name():
    with pytest.raises(KafkaConfigError, match="sasl.oauthbearer.config"):
        spark_options({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                       "sasl.oauthbearer.config": "x"})
    with pytest.raises(KafkaConfigError, match="supported mechanisms"):
        spark_options({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"})
    with pytest.raises(KafkaConfigError, match="needs both"):
        spark_options({"ssl.certificate.location": "/c.pem"})
    assert spark_options({"client.id": "me"}) == {}  # client tuning is the Python clients' business


def test_the_passwords_are_the_secrets_and_every_setting_is_kept_as_text():
    config = KafkaClientConfig.model_validate({**SCRAM, "ssl.key.password": "k", "ssl.keystore.password": "",
                                               "socket.timeout.ms": 5000})
    assert KafkaClient("k:1", config.client_settings()).secrets() == ['p"a\\ss', "k"]
    assert config.client_settings() == {**SCRAM, "ssl.key.password": "k", "ssl.keystore.password": "",
                                        "socket.timeout.ms": "5000"}
    assert 'p"a' not in repr(config)


def test_clients_log_warnings_and_worse_only_unless_the_deployment_says_otherwise():
    # librdkafka's informational lines ("Purging 1 unserved events from background queue") went to stderr:
    # an ERROR line in successful task logs, and noise after `kafka-ledger status`.
    config = kafka_security.confluent_config("k:9092", {"security.protocol": "SSL"}, **{"group.id": "g"})
    assert config == {"bootstrap.servers": "k:9092", "log_level": 4, "security.protocol": "SSL", "group.id": "g"}
    assert kafka_security.confluent_config("k:9092", {"log_level": "7"})["log_level"] == "7"


def test_java_client_properties_for_kafkas_tools_escape_multiline_values(tmp_path):
    certificate, key = tmp_path / "client.pem", tmp_path / "client.key"
    certificate.write_text("-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nBBB\n-----END PRIVATE KEY-----\n")
    text = kafka_security.java_client_properties({**SCRAM, "ssl.certificate.location": str(certificate),
                                                  "ssl.key.location": str(key)})
    lines = dict(line.split("=", 1) for line in text.splitlines())
    assert lines["security.protocol"] == "SASL_SSL" and lines["sasl.mechanism"] == "SCRAM-SHA-512"
    assert lines["sasl.jaas.config"].startswith("org.apache.kafka.common.security.scram.ScramLoginModule required")
    # One line per property: the PEM's line breaks are escaped as Java's Properties.load reads them back.
    assert lines["ssl.keystore.certificate.chain"] == "-----BEGIN CERTIFICATE-----\\nAAA\\n-----END CERTIFICATE-----\\n"
