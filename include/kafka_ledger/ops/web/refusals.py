"""Airflow's 400 for a trigger form value it rejects, cut to its first sentence: no JSON schema in the reply.

Airflow validates a run's conf against the DAG's params and answers `Invalid input for param mode: 'x' is
not one of [...]` followed by the whole JSON schema of the field (its descriptions, display names and
sections). For kafka-ledger's DAGs this middleware keeps the sentence and drops the schema dump.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kafka_ledger.config.pipeline import DAG_ID_PREFIX

TRIGGER_PATH = re.compile(rf"/api/v2/dags/{DAG_ID_PREFIX}[^/]+/dagRuns$")
PARAM_ERROR = "Invalid input for param"


def first_paragraph(detail: str) -> str:
    """The reason alone: jsonschema puts the failed schema and the instance after a blank line."""
    return detail.split("\n\n", 1)[0].strip()


def shortened(body: bytes) -> bytes:
    """The response body with a param error's detail cut to its first paragraph; anything else unchanged."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    detail = data.get("detail") if isinstance(data, dict) else None
    if not isinstance(detail, str) or not detail.startswith(PARAM_ERROR):
        return body
    return json.dumps({**data, "detail": first_paragraph(detail)}).encode()


class ShortParamErrors:
    """ASGI middleware: only 400 replies to POST …/dags/kafka_ledger__<pipeline>/dagRuns are looked at."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not TRIGGER_PATH.search(scope["path"]):
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def send_shortened(message: dict[str, Any]) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] == 400:
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = shortened(b"".join(chunks))
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            await send({**held, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_shortened)
