"""The campaign's network: Toxiproxy between the task processes and each service, and the faults it injects."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from typing import Any

# The proxies scripts/stack.sh `proxies` declares, by the service they stand in front of.
KAFKA, KAFKA_SASL, POSTGRES, SPARK_CONNECT = "kafka", "kafka-sasl", "postgres", "spark-connect"
SCHEMA_REGISTRY = "schema-registry"


def _port(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


# Toxiproxy removes a toxic only once each of its links has written what the toxic held: a link whose reader has
# stopped reading holds the removal, and every API call after it, until its connection closes. Seen for 6.5 minutes
# on a Kafka link (about the five minutes after which Spark closes an idle pooled consumer).
API_SECONDS = 600


class Toxiproxy:
    """The stack's Toxiproxy, through its HTTP API (loopback): add a toxic to a proxy, remove it, reset all."""

    def __init__(self, port: int | None = None):
        self.url = f"http://127.0.0.1:{port or _port('KL_TOXIPROXY_PORT', 18474)}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=API_SECONDS) as response:
            text = response.read()
        return json.loads(text) if text else None

    def available(self) -> bool:
        try:
            return KAFKA in self._call("GET", "/proxies")
        except OSError:
            return False

    def add(self, proxy: str, name: str, kind: str, attributes: dict[str, int], stream: str = "downstream") -> None:
        self._call("POST", f"/proxies/{proxy}/toxics",
                   {"name": name, "type": kind, "stream": stream, "attributes": attributes})

    def remove(self, proxy: str, name: str) -> None:
        """Remove the toxic if it is there (a strike that missed never added it)."""
        try:
            self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise

    def reset(self) -> None:
        """Every proxy enabled and without toxics."""
        self._call("POST", "/reset")


def proxied_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` with Kafka, the ledger database and the Spark Connect server reached through their proxies."""
    kafka = {str(_port("KL_KAFKA_PORT", 19092)): str(_port("KL_KAFKA_PROXY_PORT", 19097)),
             str(_port("KL_KAFKA_SASL_PORT", 19094)): str(_port("KL_KAFKA_SASL_PROXY_PORT", 19098))}
    servers = env["KAFKA_LEDGER_BOOTSTRAP_SERVERS"]
    proxied = {**env, "KAFKA_LEDGER_BOOTSTRAP_SERVERS": re.sub(
        r":(\d+)\b", lambda m: ":" + kafka.get(m.group(1), m.group(1)), servers)}
    pg, pg_proxy = _port("KL_PG_PORT", 15432), _port("KL_PG_PROXY_PORT", 15433)
    proxied["KAFKA_LEDGER_DB_URL"] = env["KAFKA_LEDGER_DB_URL"].replace(f":{pg}/", f":{pg_proxy}/")
    connect = json.loads(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    connect["port"] = _port("KL_SPARK_CONNECT_PROXY_PORT", 19003)
    proxied["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(connect)
    return proxied


def registry_proxied_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` with the schema registry reached through its proxy (an Avro campaign's tasks: its registry faults)."""
    port, proxy = _port("KL_SCHEMA_REGISTRY_PORT", 18085), _port("KL_SCHEMA_REGISTRY_PROXY_PORT", 18086)
    url = env["KAFKA_LEDGER_SCHEMA_REGISTRY_URL"]
    if f":{proxy}/" in url + "/":  # through the proxy already (the submit runtime's job environment, set before)
        return dict(env)
    if f":{port}/" not in url + "/":
        raise ValueError(f"the schema registry {url} is not the stack's (port {port}): its faults need the stack's")
    return {**env, "KAFKA_LEDGER_SCHEMA_REGISTRY_URL": re.sub(rf":{port}\b", f":{proxy}", url, count=1)}


def kafka_proxy(servers: str) -> str:
    """The proxy in front of the listener `servers` name (SASL_SSL or PLAINTEXT)."""
    return KAFKA_SASL if f":{_port('KL_KAFKA_SASL_PORT', 19094)}" in servers else KAFKA
