"""The Kafka Ledger page and its JSON API: a FastAPI app that the Airflow plugin mounts under URL_PREFIX."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from kafka_ledger.config import settings
from kafka_ledger.config.pipeline import ConfigError, PipelineConfig, read_pipelines
from kafka_ledger.kafka.headroom import duration, headroom_text
from kafka_ledger.ledger import db as ledger
from kafka_ledger.ops import overview
from kafka_ledger.ops.verify import VerifyReport, verify_pipeline
from kafka_ledger.ops.web.charts import Point, bar_chart
from kafka_ledger.sinks import ArtifactSink, sink_for

URL_PREFIX = "/kafka-ledger"
RECENT_BATCHES = 20
CHARTED_BATCHES = 60

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.filters["headroom_text"] = headroom_text
templates.env.filters["duration"] = duration
templates.env.filters["instant"] = overview.instant


def _to_app_root(request: Request) -> str:
    """A relative path from this page back to the app's root: links keep working behind any proxy prefix."""
    path, prefix = request.scope["path"], request.scope.get("root_path", "")
    # A mounted app's scope path still holds the mount prefix (Starlette >= 0.33); a root_path from a proxy does not.
    inner = path[len(prefix):] if prefix and path.startswith(prefix) else path
    return "../" * inner.count("/", 1) or "./"


def _pipelines() -> tuple[dict[str, PipelineConfig], dict[str, str]]:
    declarations = read_pipelines()
    return declarations.valid, {name: str(declarations.problem(name)) for name in declarations.invalid}


def _pipeline(name: str) -> PipelineConfig:
    valid, invalid = _pipelines()
    if name in valid:
        return valid[name]
    raise HTTPException(404, invalid.get(name) or f"no pipeline {name!r} is declared")


def _jsonable(data: Any) -> Any:
    return json.loads(json.dumps(data, default=overview.iso))


def _status(pipeline: PipelineConfig) -> dict[str, Any]:
    return overview.pipeline_status(settings.task_services(), pipeline, tolerate_kafka=True)


def _statuses(pipelines: list[PipelineConfig]) -> list[dict[str, Any]]:
    """Every pipeline's status, looked up together."""
    return overview.pipelines_status(settings.task_services(), pipelines, tolerate_kafka=True)


def _ledger_view(pipeline: PipelineConfig) -> dict[str, Any]:
    """Everything the pipeline page shows from the ledger."""
    with ledger.transaction(settings.ledger_database()) as cur:
        return {
            "batches": [overview.batch_summary(b) for b in ledger.list_batches(cur, pipeline.name, RECENT_BATCHES)],
            "history": overview.batch_history(cur, pipeline.name, CHARTED_BATCHES),
            "dead_letters": overview.dead_letter_groups(cur, pipeline.name),
            "resets": overview.recent_resets(cur, pipeline.name),
            "verified_point": ledger.verified_point(cur, pipeline.name),
        }


def _charts(history: list[dict[str, Any]]) -> list[str]:
    catch_ups = [h for h in history if h["kind"] == "catch_up"]
    lag = [Point(str(h["batch_id"]), h["lag_when_planned"],
                 f"batch {h['batch_id']} planned {h['planned_at']:%Y-%m-%d %H:%M:%S}: lag {h['lag_when_planned']}")
           for h in catch_ups]
    records = [Point(str(h["batch_id"]), h["records_read"],
                     f"batch {h['batch_id']} ({h['kind']}, {h['status']}): read {h['records_read']}, "
                     f"written {h['records_written']}, dead letters {h['records_dead_lettered']}")
               for h in history]
    return [bar_chart(lag, "Lag when each catch-up batch was planned (offsets)", "#f59e0b"),
            bar_chart(records, "Records read per batch", "#3b82f6")]


def create_app(dependencies: Sequence[Any] = ()) -> FastAPI:
    """The app; `dependencies` guard every route (the plugin passes Airflow's authorization check)."""
    app = FastAPI(title="Kafka Ledger", dependencies=list(dependencies), docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(ConfigError)
    def config_error(request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": f"the pipelines file is not valid: {exc}"}, status_code=500)

    # --- JSON API ---------------------------------------------------------------------------------------------

    @app.get("/api/pipelines")
    def api_pipelines() -> list[dict[str, Any]]:
        """Every declared pipeline with its partitions, positions, end offsets and lag."""
        valid, invalid = _pipelines()
        found = _statuses(list(valid.values()))
        found += [{"pipeline": name, "invalid": problem} for name, problem in invalid.items()]
        return _jsonable(found)

    @app.get("/api/pipelines/{name}")
    def api_pipeline(name: str, page: int = 1) -> dict[str, Any]:
        """One pipeline: its status (a page of its partitions), recent batches, dead letters by reason, resets and
        verified point."""
        pipeline = _pipeline(name)
        return _jsonable({**_status_page(pipeline, page), **_ledger_view(pipeline)})

    @app.get("/api/pipelines/{name}/batches/{batch_id}")
    def api_batch(name: str, batch_id: int) -> dict[str, Any]:
        """One batch with its ranges: topic, partition, from, until, records read."""
        return _jsonable(_batch(_pipeline(name), batch_id))

    # --- pages ------------------------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        valid, invalid = _pipelines()
        return templates.TemplateResponse(request, "index.html", {
            "root": _to_app_root(request), "statuses": _statuses(list(valid.values())), "invalid": invalid,
        })

    @app.get("/dags/{dag_id}")
    def dag_page(request: Request, dag_id: str) -> RedirectResponse:
        """Where a DAG's "Kafka Ledger" tab lands: its pipeline's page."""
        valid, _ = _pipelines()
        for pipeline in valid.values():
            if pipeline.dag_id == dag_id:
                return RedirectResponse(f"{_to_app_root(request)}pipelines/{pipeline.name}", status_code=303)
        raise HTTPException(404, f"DAG {dag_id!r} is not a kafka-ledger pipeline")

    @app.get("/pipelines/{name}", response_class=HTMLResponse)
    def pipeline_page(request: Request, name: str, page: int = 1) -> HTMLResponse:
        return _pipeline_page(request, _pipeline(name), verify=None, page=page)

    @app.post("/pipelines/{name}/verify", response_class=HTMLResponse)
    def verify_page(request: Request, name: str) -> HTMLResponse:
        """Verify on demand (incremental): the report, on the pipeline's page."""
        pipeline = _pipeline(name)
        report = verify_pipeline(settings.task_services(), pipeline)
        return _pipeline_page(request, pipeline, verify=report)

    @app.get("/pipelines/{name}/batches/{batch_id}", response_class=HTMLResponse)
    def batch_page(request: Request, name: str, batch_id: int) -> HTMLResponse:
        pipeline = _pipeline(name)
        return templates.TemplateResponse(request, "batch.html", {
            "root": _to_app_root(request), "pipeline": pipeline, "batch": _batch(pipeline, batch_id),
        })

    return app


def _status_page(pipeline: PipelineConfig, page: int) -> dict[str, Any]:
    try:
        return overview.partition_page(_status(pipeline), page)
    except overview.PageError as exc:
        raise HTTPException(404, str(exc)) from exc


def _pipeline_page(request: Request, pipeline: PipelineConfig, verify: VerifyReport | None, page: int = 1
                   ) -> HTMLResponse:
    view = _ledger_view(pipeline)
    return templates.TemplateResponse(request, "pipeline.html", {
        "root": _to_app_root(request), "pipeline": pipeline, "status": _status_page(pipeline, page), **view,
        "charts": _charts(view["history"]), "verify": verify,
        # An artifact sink's batches name their artifact (an Iceberg snapshot).
        "snapshots": isinstance(sink_for(pipeline), ArtifactSink),
    })


def _batch(pipeline: PipelineConfig, batch_id: int) -> dict[str, Any]:
    try:
        with ledger.transaction(settings.ledger_database()) as cur:
            return overview.batch_detail(cur, pipeline.name, batch_id)
    except ledger.LedgerError as exc:  # no such batch, or another pipeline's
        raise HTTPException(404, str(exc)) from exc
