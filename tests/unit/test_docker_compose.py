"""Static checks of docker-compose.yaml, the optional Docker version of the local stack.

Docker does not run where the tests run, so the file is checked as data: the services exist and are wired
together (dependencies, addresses, mounts), every Airflow service gets the same settings, and the names and
versions stay in sync with the Docker-less stack (scripts/env.sh, requirements.txt, the Maven poms). The
KAFKA_LEDGER_* variables of both are generated from include/kafka_ledger/config/settings.py (test_config_reference.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yaml"
DOCKERFILE = REPO / "docker" / "airflow.Dockerfile"

AIRFLOW_SERVICES = [
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
]
SPARK_SERVICES = ["spark-master", "spark-worker"]
SERVICES = ["kafka", "postgres", *SPARK_SERVICES, *AIRFLOW_SERVICES]

# Settings both stacks must define under the same names (values differ: container vs 127.0.0.1 addresses).
# kafka-ledger's own (KAFKA_LEDGER_*) are generated in both from include/kafka_ledger/config/settings.py
# (test_config_reference.py).
SHARED_ENV_NAMES = [
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__PLUGINS_FOLDER",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
    "AIRFLOW_CONN_SPARK_DEFAULT",
    "AIRFLOW_CONN_KAFKA_LEDGER_DB",
    "AIRFLOW_CONN_KAFKA_LEDGER_KAFKA",
    "PYSPARK_PYTHON",
    "SPARK_CONF_DIR",
]

@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # safe_load resolves the anchors and `<<` merges


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):  # the KEY=VALUE list form
        environment = dict(item.split("=", 1) for item in environment)
    return {key: str(value) for key, value in environment.items()}


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency -> condition; the short list form means service_started."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def bind_sources(service: dict[str, Any]) -> list[str]:
    """Host paths of the service's bind mounts (short `./src:/dst[:mode]` or long `type: bind` syntax)."""
    sources = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                sources.append(source)
        elif volume.get("type") == "bind":
            sources.append(volume["source"])
    return sources


def mount_targets(service: dict[str, Any]) -> set[str]:
    targets = set()
    for volume in service.get("volumes") or []:
        targets.add(volume.split(":")[1] if isinstance(volume, str) else volume["target"])
    return targets


def pinned(requirement: str) -> str:
    match = re.search(rf"^{re.escape(requirement)}==(\S+)", (REPO / "requirements.txt").read_text(), re.M)
    assert match, f"{requirement} is not pinned in requirements.txt"
    return match.group(1)


def test_all_services_exist(services):
    assert sorted(set(SERVICES) - set(services)) == []


def test_every_dependency_is_a_service(services):
    for name, service in services.items():
        for dependency in depends_on(service):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            assert dependency != name


def test_airflow_services_share_one_environment(services):
    reference = env(services["airflow-init"])
    for name in AIRFLOW_SERVICES:
        assert env(services[name]) == reference, f"{name} does not use the x-airflow-common environment"


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_reaches_the_other_services(services, name):
    service = services[name]
    variables = env(service)
    assert variables["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == (
        "postgresql+psycopg2://airflow:${KAFKA_LEDGER_AIRFLOW_DB_PASSWORD:?set it in .env}@postgres:5432/airflow"
    )
    assert variables["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert variables["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    assert variables["AIRFLOW__API_AUTH__JWT_SECRET"]

    spark = json.loads(variables["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark == {"conn_type": "spark", "host": "spark://spark-master:7077"}
    assert variables["KAFKA_LEDGER_SPARK_MASTER"] == spark["host"]

    assert variables["KAFKA_LEDGER_BOOTSTRAP_SERVERS"] == "kafka:9092"
    kafka_conn = json.loads(variables["AIRFLOW_CONN_KAFKA_LEDGER_KAFKA"])
    assert kafka_conn["extra"]["bootstrap.servers"] == "kafka:9092"

    ledger = "postgresql://kafka_ledger:${KAFKA_LEDGER_DB_PASSWORD:?set it in .env}@postgres:5432/kafka_ledger"
    assert variables["KAFKA_LEDGER_DB_URL"] == ledger
    assert variables["AIRFLOW_CONN_KAFKA_LEDGER_DB"] == ledger

    # The folders Airflow and kafka-ledger read are the ones the host's files are mounted on.
    targets = mount_targets(service)
    pipelines = Path(variables["KAFKA_LEDGER_PIPELINES"])
    assert pipelines.name == "pipelines.yaml" and str(pipelines.parent) in targets
    assert variables["AIRFLOW__CORE__DAGS_FOLDER"] in targets
    assert variables["AIRFLOW__CORE__PLUGINS_FOLDER"] in targets
    assert {"/opt/kafka-ledger/include", "/opt/kafka-ledger/spark_jobs"} <= targets


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_waits_for_its_dependencies(services, name):
    deps = depends_on(services[name])
    assert deps.get("postgres") == "service_healthy"
    if name == "airflow-init":
        assert "airflow-init" not in deps
    else:
        assert deps.get("kafka") == "service_healthy"
        assert deps.get("airflow-init") == "service_completed_successfully"


def test_services_waited_on_as_healthy_have_a_healthcheck(services):
    for name, service in services.items():
        for dependency, condition in depends_on(service).items():
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}, which has no healthcheck"


def test_airflow_init_migrates_both_databases_and_creates_the_pool(services):
    script = " ".join(services["airflow-init"]["command"])
    assert "airflow db migrate" in script
    assert "python -m kafka_ledger.ledger.migrations" in script
    assert "airflow pools set kafka_ledger_spark 2" in script


def test_bind_mounted_host_paths_exist(services):
    for name, service in services.items():
        for source in bind_sources(service):
            path = (REPO / source).resolve()
            assert REPO in path.parents, f"{name} mounts {source}, outside the repository"
            assert path.exists(), f"{name} mounts {source}, which does not exist"


def test_kafka_listeners(services):
    variables = env(services["kafka"])
    advertised = dict(listener.split("://", 1) for listener in variables["KAFKA_ADVERTISED_LISTENERS"].split(","))
    # Containers (and the broker itself) use the inter-broker listener; the host gets the local stack's port.
    assert advertised[variables["KAFKA_INTER_BROKER_LISTENER_NAME"]] == "kafka:9092"
    external = [address for address in advertised.values() if address.startswith("localhost:")]
    assert external == ["localhost:19092"]
    assert "127.0.0.1:19092:19092" in services["kafka"]["ports"]
    assert variables["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert variables["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert variables["KAFKA_LOG_RETENTION_MS"] == "-1"


def test_postgres_creates_both_databases(services):
    postgres = services["postgres"]
    assert "127.0.0.1:15432:5432" in postgres["ports"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    init_sql = "\n".join((REPO / source).read_text() for source in bind_sources(postgres) if source.endswith(".sql"))
    roles = {"kafka_ledger": "KAFKA_LEDGER_DB_PASSWORD", "airflow": "KAFKA_LEDGER_AIRFLOW_DB_PASSWORD"}
    for name, variable in roles.items():
        # The password comes from the container's environment, which compose requires.
        password = re.search(rf"CREATE ROLE {name} LOGIN PASSWORD :'(\w+)';", init_sql).group(1)
        assert f"\\getenv {password} {variable}" in init_sql
        assert env(postgres)[variable] == f"${{{variable}:?set it in .env}}"
        assert f"CREATE DATABASE {name} OWNER {name}" in init_sql


def test_spark_worker_connects_to_the_master_service(services):
    master_command = [str(arg) for arg in services["spark-master"]["command"]]
    worker_command = [str(arg) for arg in services["spark-worker"]["command"]]
    master_urls = [arg for arg in worker_command if arg.startswith("spark://")]
    assert master_urls == ["spark://spark-master:7077"]
    assert master_command[master_command.index("--host") + 1] == "spark-master"
    assert master_command[master_command.index("--port") + 1] == "7077"
    assert "spark-master" in depends_on(services["spark-worker"])


def test_spark_worker_cleans_finished_applications_as_the_local_stacks_does(services):
    """Each submit batch is an application whose folder holds every executor's copy of the jars: without the
    worker's cleanup the disk fills."""
    stack = re.search(r'^SPARK_WORKER_CLEANUP="([^"]+)"$', (REPO / "scripts" / "stack.sh").read_text(), re.M)
    assert stack, "scripts/stack.sh sets no SPARK_WORKER_CLEANUP"
    assert "-Dspark.worker.cleanup.enabled=true" in stack.group(1).split()
    assert env(services["spark-worker"])["SPARK_WORKER_OPTS"] == stack.group(1)


def test_image_versions_match_the_pins(services):
    assert services["spark-master"]["image"] == services["spark-worker"]["image"] == f"apache/spark:{pinned('pyspark')}"
    kafka_pom = (REPO / "stack" / "maven" / "kafka" / "pom.xml").read_text()
    assert f"<kafka.version>{services['kafka']['image'].split(':')[1]}</kafka.version>" in kafka_pom
    assert re.search(rf"^FROM apache/airflow:{re.escape(pinned('apache-airflow'))}-", DOCKERFILE.read_text(), re.M)


def test_env_names_match_the_local_stack(services):
    env_sh = (REPO / "scripts" / "env.sh").read_text()
    compose_env = env(services["airflow-scheduler"])
    for name in SHARED_ENV_NAMES:
        assert name in compose_env, f"{name} is missing from docker-compose.yaml"
        assert re.search(rf"\b{name}=", env_sh), f"{name} is missing from scripts/env.sh"


def test_airflow_image_is_built_from_the_locked_requirements(services):
    for name in AIRFLOW_SERVICES:
        build = services[name]["build"]
        assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    dockerfile = DOCKERFILE.read_text()
    assert re.search(r"pip install .*-r requirements\.txt -c requirements\.lock", dockerfile)
    assert "pip install --no-cache-dir --no-deps -e ." in dockerfile
    assert "stack/maven/spark-jars/pom.xml" in dockerfile
    assert "kafka-ledger-spark-functions.jar" in dockerfile and "stack/spark-jars/*.java" in dockerfile
    assert "ENV KAFKA_LEDGER_SPARK_JARS_DIR=/opt/kafka-ledger/spark-jars" in dockerfile
    assert env(services["airflow-scheduler"])["KAFKA_LEDGER_SPARK_JARS_DIR"] == "/opt/kafka-ledger/spark-jars"


def test_no_secret_has_a_default_and_every_variable_is_required():
    text = COMPOSE_FILE.read_text()
    variables = re.findall(r"(?<!\$)\$\{([^}]*)\}", text)
    assert variables, "no ${...} found"
    for variable in variables:
        if variable.startswith("VAR"):  # the header comment's example
            continue
        assert re.fullmatch(r"[A-Z_]+:\?.+", variable), f"${{{variable}}} is not required (use ${{NAME:?message}})"
    for secret in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        assert re.search(rf"{secret}: \$\{{KAFKA_LEDGER_\w+:\?", text), secret


def test_ports_are_published_on_the_hosts_loopback_only(services):
    published = [(name, port) for name, service in services.items() for port in service.get("ports") or []]
    assert published
    for name, port in published:
        assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def command_line(service: dict[str, Any]) -> str:
    """Everything of a service that ends up on a process's command line or in its environment."""
    parts = []
    for key in ("command", "entrypoint"):
        value = service.get(key) or []
        parts += [value] if isinstance(value, str) else [str(arg) for arg in value]
    parts += [str(arg) for arg in (service.get("healthcheck") or {}).get("test") or []]
    parts += [f"{key}={value}" for key, value in env(service).items()]
    return " ".join(parts)


def test_every_spark_process_authenticates_with_a_secret_from_spark_defaults_and_never_from_a_command_line(
    compose, services
):
    """As the local stack's spark-defaults.conf (scripts/stack.sh write_spark_conf): spark.authenticate with a
    secret that compose requires, in a file the master, the worker and spark-submit read, on no command line."""
    secret = "${KAFKA_LEDGER_SPARK_AUTH_SECRET:?set it in .env}"
    for name in [*SPARK_SERVICES, *AIRFLOW_SERVICES]:
        service = services[name]
        if name in SPARK_SERVICES:
            # The apache/spark image's daemons, from its SPARK_HOME: their settings are in its conf/.
            assert str(service["command"][0]).startswith("/opt/spark/bin/"), name
            assert "SPARK_CONF_DIR" not in env(service)
            conf_dir = "/opt/spark/conf"
        else:  # spark-submit (PySpark's) and the driver it starts: the folder SPARK_CONF_DIR names
            conf_dir = env(service)["SPARK_CONF_DIR"]
        mounted = {config["target"]: config["source"] for config in service.get("configs") or []}
        source = mounted.get(f"{conf_dir}/spark-defaults.conf")
        assert source, f"{name} gets no spark-defaults.conf in {conf_dir}"
        lines = [line.split(None, 1) for line in compose["configs"][source]["content"].splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        assert dict(lines) == {"spark.authenticate": "true", "spark.authenticate.secret": secret}, name
        assert len(lines) == 2  # each once: the local stack's loopback driver bindings are wrong in containers
    for name, service in services.items():
        given = command_line(service)
        assert "KAFKA_LEDGER_SPARK_AUTH_SECRET" not in given, f"{name} has Spark's secret on a command line"
        assert "spark.authenticate" not in given, f"{name} sets Spark's authentication on a command line"
    # Required wherever it is used: no default, so compose refuses to start without it in .env.
    text = COMPOSE_FILE.read_text()
    assert set(re.findall(r"\$\{KAFKA_LEDGER_SPARK_AUTH_SECRET[^}]*\}", text)) == {secret}


def test_the_env_file_recipes_write_every_variable_compose_requires():
    text = COMPOSE_FILE.read_text()
    settings = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    required = set(re.findall(r"\$\{([A-Z_]+):\?", settings))
    assert "KAFKA_LEDGER_SPARK_AUTH_SECRET" in required
    deployment = (REPO / "docs" / "deployment.md").read_text()
    for where, recipe_text in (("docker-compose.yaml's header", text), ("docs/deployment.md", deployment)):
        recipe = re.search(r"for v in ([A-Z_\s\\#]+?);", recipe_text)
        assert recipe, f"no .env recipe in {where}"
        assert set(re.findall(r"[A-Z_]{2,}", recipe.group(1))) == required, where
