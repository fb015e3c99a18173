"""The local stack's Prometheus (`scripts/stack.sh monitoring`), asked through its HTTP API as its user."""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
import urllib.request
from typing import Any

from tools import stack_env


def url() -> str:
    return f"http://127.0.0.1:{stack_env('KL_PROMETHEUS_PORT')}"


def query(promql: str) -> list[tuple[dict[str, str], float, float]]:
    """An instant query's vector: each series' labels, its sample's timestamp and value."""
    user, password = stack_env("KL_PROMETHEUS_USER"), stack_env("KL_PROMETHEUS_PASSWORD")
    request = urllib.request.Request(f"{url()}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", headers={
        "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()})
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, Any] = json.load(reply)
    if answer.get("status") != "success" or answer["data"]["resultType"] != "vector":
        raise RuntimeError(f"Prometheus answered {answer} to {promql!r}")
    # A function's result (timestamp(...)) has no metric name: series are told apart by their other labels.
    return [({k: v for k, v in r["metric"].items() if k != "__name__"}, float(r["value"][0]), float(r["value"][1]))
            for r in answer["data"]["result"]]


def scraped_after(selector: str, since: float, timeout: float = 60) -> list[tuple[dict[str, str], float]]:
    """The series of `selector` (a metric with its label matchers) as a scrape made after `since` (epoch seconds)
    saw them: waits for every such series to have one."""
    deadline = time.monotonic() + timeout
    while True:
        found = query(selector)
        stamps = {frozenset(labels.items()): stamp for labels, stamp, _ in query(f"timestamp({selector})")}
        if found and all(stamps.get(frozenset(labels.items()), 0) > since for labels, _, _ in found):
            return [(labels, value) for labels, _, value in found]
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prometheus has no scrape of {selector} after {since:.0f} within {timeout:.0f} s")
        time.sleep(1)
