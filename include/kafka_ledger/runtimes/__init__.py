"""The Spark runtimes a batch can run in, behind one interface (base.Runtime); runtime_for() picks a pipeline's.

- `connect` (connect/): a warm Spark Connect server; the task reads there and commits the batch itself.
- `submit` (submit/): one spark-submit per batch stages the rows; a commit task publishes them.

A pipeline picks one with `spark_runtime`; the deployment's default is $KAFKA_LEDGER_SPARK_RUNTIME (else submit).
Each runtime makes its own Airflow tasks (Runtime.build_tasks) and its pipelines' other Spark sessions.
"""

from __future__ import annotations

from typing import Any

from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import CarrierDeclaration, PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import runtime_name
from kafka_ledger.runtimes.base import Runtime
from kafka_ledger.runtimes.connect import CONNECT
from kafka_ledger.runtimes.connect.runtime import ConnectRuntime
from kafka_ledger.runtimes.submit.runtime import SubmitRuntime

__all__ = ["RUNTIMES", "Runtime", "build_carrier_task", "run_batch", "runtime_for"]

RUNTIMES: dict[str, Runtime] = {runtime.name: runtime for runtime in (ConnectRuntime(), SubmitRuntime())}


def runtime_for(pipeline: PipelineConfig) -> Runtime:
    """The pipeline's runtime: its own `spark_runtime`, else the deployment's."""
    return RUNTIMES[runtime_name(pipeline)]


def run_batch(pipeline: PipelineConfig, batch_id: int, services: Services) -> CommitResult:
    """Read, publish and commit one planned batch here and now, in the pipeline's runtime (CLI, benchmark)."""
    return runtime_for(pipeline).run_batch(pipeline, batch_id, services)


def build_carrier_task(carrier: CarrierDeclaration) -> Any:
    """A carrier's tasks in its DAG being built: the connect runtime's, whose warm session reads many pipelines'
    ranges at once (runtimes/connect/carrier.py)."""
    return RUNTIMES[CONNECT].build_carrier_task(carrier)
