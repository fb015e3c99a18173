"""The Kafka Ledger page in the Airflow UI: the app of include/kafka_ledger/ops/web, behind Airflow's own auth."""

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends

from kafka_ledger.ops.web.app import URL_PREFIX, create_app
from kafka_ledger.ops.web.refusals import ShortParamErrors

# Plugin apps are not authenticated by Airflow core: without this, anyone reaching the API server reads the ledger.
app = create_app(dependencies=[Depends(requires_access_view(AccessView.PLUGINS))])


class KafkaLedgerPlugin(AirflowPlugin):
    """Mounts the page and its API under /kafka-ledger, links it in the navigation and on each pipeline's DAG."""

    name = "kafka_ledger"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Kafka Ledger"}]
    # A pipeline's trigger refused by Airflow's param validation: one sentence, not the field's JSON schema.
    fastapi_root_middlewares = [{"middleware": ShortParamErrors, "name": "kafka-ledger short param errors"}]
    external_views = [
        # Shown inside the UI (an iframe under /plugin/kafka-ledger); relative hrefs follow the UI's base URL.
        {"name": "Kafka Ledger", "href": f"{URL_PREFIX.lstrip('/')}/", "url_route": "kafka-ledger",
         "destination": "nav", "category": "browse"},
        # A tab on every DAG's page; a DAG that is not a pipeline's gets a clear 404 from the app.
        {"name": "Kafka Ledger", "href": f"{URL_PREFIX.lstrip('/')}/dags/{{DAG_ID}}", "destination": "dag"},
    ]
