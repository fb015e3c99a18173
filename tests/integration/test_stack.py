"""The local stack as deployed by scripts/stack.sh: every service on loopback, no common-word passwords."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from integration_support import listening_sockets, not_loopback

pytestmark = pytest.mark.integration

STATE = Path(os.environ.get("KL_STATE") or Path(__file__).resolve().parents[2] / ".stack")


def service_pids() -> dict[str, int]:
    """The running local services, by name (those scripts/stack.sh started and records)."""
    pid_files = {
        "kafka": STATE / "run" / "kafka.pid",
        "spark connect": STATE / "run" / "spark-connect.pid",
        "postgres": STATE / "postgres" / "data" / "postmaster.pid",  # its first line is the postmaster's pid
    }
    return {name: int(path.read_text().split()[0]) for name, path in pid_files.items() if path.exists()}


def test_every_local_service_listens_on_loopback_only():
    pids = service_pids()
    if os.environ.get("KL_LOCAL_KAFKA", "1") == "1" and os.environ.get("KL_LOCAL_POSTGRES", "1") == "1":
        assert {"kafka", "postgres"} <= set(pids), pids
    for name, pid in pids.items():
        sockets = listening_sockets([pid])
        assert sockets, f"{name} (pid {pid}) listens nowhere: is it running?"
        assert not_loopback(sockets) == set(), f"{name} listens beyond loopback: {sorted(sockets)}"
