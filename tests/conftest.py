"""What every test process shares: its stack, and where its time goes.

A worker of the lane that runs the tests needing a stack of their own (scripts/test.sh: KL_TEST_STACKS="1 2", one
pytest-xdist worker per stack) takes its stack's environment before anything reads it. Each test's seconds (set-up,
call and teardown) go to the file KL_TEST_TIMES names, under the lane KL_TEST_LANE names, for the table
scripts/test.sh prints at the end (tools/test_times.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from tools.stack import stack_environment

_stacks, _worker = os.environ.get("KL_TEST_STACKS", "").split(), os.environ.get("PYTEST_XDIST_WORKER")
if _stacks and _worker:  # gw0 takes the first stack, gw1 the second
    os.environ.update(stack_environment(int(_stacks[int(_worker.removeprefix("gw"))])))


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
