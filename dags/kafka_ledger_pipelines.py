"""One DAG per pipeline declared in config/pipelines.yaml (or $KAFKA_LEDGER_PIPELINES).

Each DAG plans a batch (exact offset ranges recorded in the ledger before anything is read), reads and
stages it with Spark, then commits the rows and the offsets in one Postgres transaction. The logic lives
in include/kafka_ledger; this file only wires it together.
"""

from kafka_ledger.airflow_dag import build_pipeline_dag
from kafka_ledger.config import load_pipelines

for _pipeline in load_pipelines().values():
    globals()[_pipeline.dag_id] = build_pipeline_dag(_pipeline)
