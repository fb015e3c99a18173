"""One DAG per valid pipeline declared in config/pipelines.yaml (or $KAFKA_LEDGER_PIPELINES).

Each DAG plans a batch (exact offset ranges recorded in the ledger before anything is read), reads and
stages it with Spark, then commits the rows and the offsets in one Postgres transaction. The logic lives
in include/kafka_ledger; this file only wires it together. Each entry of the pipelines file is validated on
its own: an invalid one is left out here and reported by kafka_ledger_invalid_pipelines.py. A pipeline that
publishes into Iceberg also has a DAG that maintains its table (compaction, snapshot expiry). A task's process
builds its own DAG only (Airflow's parsing context).
"""

from airflow.sdk import get_parsing_context

from kafka_ledger.airflow.dags import declared_dags
from kafka_ledger.config.pipeline import read_pipelines

globals().update(declared_dags(read_pipelines().valid.values(), get_parsing_context().dag_id))
