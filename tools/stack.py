"""The local stack's running services and their pids, as its supervisord reports them (scripts/stack.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def stack_command(command: str, output: IO | None = None) -> None:
    """Run `scripts/stack.sh <command>` (restart-spark-connect, kill-spark-worker, ...); its output to `output`
    (stderr when None), a failure raised."""
    output = output or sys.stderr
    subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "stack.sh"), command], check=True, stdout=output,
                   stderr=output)


def supervisor_conf() -> Path:
    """supervisord's configuration file of this checkout's stack ($KL_STATE/run, .stack/ by default)."""
    return Path(os.environ.get("KL_STATE") or PROJECT_ROOT / ".stack") / "run" / "supervisord.conf"


def _ctl(*args: str) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).parent / "supervisorctl"), "-c", str(supervisor_conf()), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def service_pids() -> dict[str, int]:
    """Every RUNNING service by program name (postgres, kafka, spark-connect, ...) and supervisord itself;
    empty when the stack's supervisord does not run."""
    supervisord = _ctl("pid").stdout.strip()
    if not supervisord.isdigit():
        return {}
    pids = {"supervisord": int(supervisord)}
    for line in _ctl("status").stdout.splitlines():
        name, state, *rest = line.split()
        if state == "RUNNING":  # "spark-connect  RUNNING  pid 1234, uptime 0:01:02"
            pids[name] = int(rest[1].rstrip(","))
    return pids
