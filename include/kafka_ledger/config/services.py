"""The deployment's Kafka client settings (security and the like) for the Python clients and Spark's Java client."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from kafka_ledger.model.refusals import Refusal

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

