"""Named fail points for fault-injection tests; inert unless KAFKA_LEDGER_FAILPOINTS enables them.

KAFKA_LEDGER_FAILPOINTS="after_staging=kill,commit_after_publish=raise" arms fail points by name. With
KAFKA_LEDGER_FAILPOINTS_ONCE_DIR set, each fires only once: a marker file in that folder records it,
so a retry of the same task runs through.

Fail points: after_plan (the batch is recorded, the plan task has not returned), before_read and
after_staging (Spark job), commit_after_publish and commit_before_end (inside the commit transaction).
Actions: kill (SIGKILL this process), raise (FailPointError), pause (wait up to
KAFKA_LEDGER_FAILPOINTS_PAUSE_SECONDS, 15 by default, or until the file `<name>.resume` appears in the
once folder, so a test can restart a service meanwhile).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


class FailPointError(RuntimeError):
    """Raised by a fail point armed with the `raise` action."""


def armed() -> dict[str, str]:
    """Fail point name -> action, as configured in the environment."""
    result = {}
    for item in os.environ.get("KAFKA_LEDGER_FAILPOINTS", "").split(","):
        name, _, action = item.partition("=")
        if name.strip():
            result[name.strip()] = action.strip() or "raise"
    return result


def hit(name: str) -> None:
    """Fire fail point `name` if armed: `kill` SIGKILLs this process, `raise` raises FailPointError,
    `pause` sleeps (the marker file exists while it sleeps, so a test knows when to strike)."""
    action = armed().get(name)
    if action is None:
        return
    if action not in ("kill", "raise", "pause"):
        raise ValueError(f"fail point {name}: unknown action {action!r} (use kill, raise or pause)")
    once_dir = os.environ.get("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR")
    if once_dir:
        marker = Path(once_dir) / name
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    log.warning("fail point %s fired: %s", name, action)
    if action == "pause":
        deadline = time.monotonic() + float(os.environ.get("KAFKA_LEDGER_FAILPOINTS_PAUSE_SECONDS", "15"))
        resume = Path(once_dir) / f"{name}.resume" if once_dir else None
        while time.monotonic() < deadline and not (resume and resume.exists()):
            time.sleep(0.05)
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise FailPointError(f"fail point {name} fired")
