"""Developer tools, not part of the kafka_ledger package: the demo, the benchmark, the fault campaign.

Each runs from the project root with the project's Python, e.g. `python -m tools.demo` (see README.md's Layout).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def stack_env(name: str) -> str:
    """A setting of the local stack that scripts/env.sh exports (a port, a password): an error saying so if unset."""
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: source scripts/env.sh first")
    return value


def git_commit() -> str:
    """The checkout's commit (short), named beside the figures a tool reports."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True).stdout.strip()
