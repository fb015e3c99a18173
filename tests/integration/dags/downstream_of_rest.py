"""A downstream DAG of the integration tests, scheduled on the output asset of the session's "rest" pipeline.

Loaded only by the tests' own Airflow (a DAG bundle of its own, see tools/airflow_server.airflow_env). Its one task
returns the extra of the asset events that triggered it: what the pipeline's commit said about its batch.
"""

import pendulum
from airflow.sdk import DAG, task

from kafka_ledger.airflow.dags import output_asset
from kafka_ledger.config.pipeline import read_pipelines

for _name, _pipeline in read_pipelines().valid.items():
    if not _name.endswith("_rest"):
        continue
    with DAG(dag_id=f"downstream_of_{_name}", schedule=[output_asset(_pipeline)],
             start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, tags=["kafka-ledger-tests"]) as _dag:

        @task
        def triggering_events(**context) -> list[dict]:
            return [dict(event.extra) for events in context["triggering_asset_events"].values() for event in events]

        triggering_events()
    globals()[_dag.dag_id] = _dag
