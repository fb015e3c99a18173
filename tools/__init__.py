"""Developer tools, not part of the kafka_ledger package: the demo, the benchmark, the fault campaign.

Each runs from the project root with the project's Python, e.g. `python -m tools.demo` (see README.md's Layout).
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str:
    """The checkout's commit (short), named beside the figures a tool reports."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True).stdout.strip()
