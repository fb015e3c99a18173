"""Where a test run's time goes: each test's seconds (set-up, call and teardown) appended to the file that
KL_TEST_TIMES names, under the lane KL_TEST_LANE names; scripts/test.sh prints them as a table (tools/test_times.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    started = time.monotonic()
    yield
    times = os.environ.get("KL_TEST_TIMES")
    if times:
        line = json.dumps({"lane": os.environ.get("KL_TEST_LANE", "pytest"), "file": item.location[0],
                           "test": item.nodeid, "seconds": round(time.monotonic() - started, 2)})
        # One short line per write, appended: the lanes' workers write to the same file at once.
        with open(times, "a", encoding="utf-8") as out:
            out.write(line + "\n")
