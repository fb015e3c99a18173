# The one image of every Airflow service in docker-compose.yaml (api-server, scheduler, dag-processor,
# triggerer, init). Build context: the repository root (see `build:` in docker-compose.yaml).
#
# Besides Airflow it holds what the LocalExecutor's task processes need to launch Spark jobs in client
# mode: a Java runtime, spark-submit (from the pinned PySpark), the project's Python packages at the
# versions frozen in requirements.lock, and the Spark connector jars resolved from Maven Central at build
# time, so nothing is downloaded when a job starts.
#
# The base tag must stay equal to the apache-airflow pin in requirements.txt (tests/unit/test_docker_compose.py
# checks it), and the image's Python to the one requirements.lock was compiled for (3.11).
FROM apache/airflow:3.3.2-python3.11

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# --- OS packages (as root) --------------------------------------------------------------------------
# A JDK for spark-submit and the Spark driver (and javac for kafka-ledger's own Spark function below), and
# Maven to resolve the connector jars below. Java 17 is what the apache/spark:4.0.0 executors run; a base image
# whose Debian no longer ships it (trixie) gets the distribution's default JDK instead (21, also supported by
# Spark 4.0).
USER root
RUN apt-get update -qq \
    && jre=openjdk-17-jdk-headless \
    && { apt-cache show "$jre" >/dev/null 2>&1 || jre=default-jdk-headless; } \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$jre" maven \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/kafka-ledger/spark-jars /opt/kafka-ledger/plugins \
    && chown -R airflow:0 /opt/kafka-ledger
USER airflow
WORKDIR /opt/kafka-ledger

# --- Python dependencies, frozen exactly as in the local stack (scripts/stack.sh install_python) ------
# requirements.txt pins apache-airflow to the base image's version, so pip never swaps Airflow itself.
COPY --chown=airflow:0 requirements.txt requirements.lock ./
RUN pip install --no-cache-dir -r requirements.txt -c requirements.lock

# --- Spark connector jars (scripts/stack.sh install_jars) --------------------------------------------
# The Kafka source at the exact PySpark version and the Postgres JDBC driver (and the rest of the pom's list), then
# kafka-ledger's own Spark function (the Protobuf decoder) compiled against them. Only the jars PySpark does
# not already ship are kept: a second copy of a jar at another version breaks the classpath. spark-submit
# ships them to the executors with --jars (KAFKA_LEDGER_SPARK_JARS_DIR points the DAGs here).
COPY --chown=airflow:0 stack/maven ./stack/maven
COPY --chown=airflow:0 stack/spark-jars ./stack/spark-jars
RUN tmp=$(mktemp -d) \
    && mvn -q -B -s stack/maven/settings.xml -f stack/maven/spark-jars/pom.xml \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
    && pyspark_jars=$(python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))') \
    && for jar in "$tmp"/*.jar; do \
         artifact=$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$//'); \
         compgen -G "$pyspark_jars/$artifact-[0-9]*.jar" >/dev/null || cp "$jar" /opt/kafka-ledger/spark-jars/; \
       done \
    && ls /opt/kafka-ledger/spark-jars/*.jar >/dev/null \
    && rm -rf "$tmp" && tmp=$(mktemp -d) \
    && javac -nowarn --release 17 -cp "$pyspark_jars/*:/opt/kafka-ledger/spark-jars/*" -d "$tmp" stack/spark-jars/*.java \
    && jar --create --file /opt/kafka-ledger/spark-jars/kafka-ledger-spark-functions.jar -C "$tmp" . \
    && rm -rf "$tmp" "$HOME/.m2"
ENV KAFKA_LEDGER_SPARK_JARS_DIR=/opt/kafka-ledger/spark-jars

# --- The project itself ------------------------------------------------------------------------------
# Installed editable from /opt/kafka-ledger/include, where docker-compose.yaml bind-mounts ./include: a
# code change on the host is live in the containers without a rebuild (as are dags/, spark_jobs/, config/).
COPY --chown=airflow:0 . .
RUN pip install --no-cache-dir --no-deps -e .
