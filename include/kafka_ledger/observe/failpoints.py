"""Named fail points for fault-injection tests; inert unless KAFKA_LEDGER_FAILPOINTS enables them.

KAFKA_LEDGER_FAILPOINTS="after_staging=kill,commit_after_publish=raise" arms fail points by name. With
KAFKA_LEDGER_FAILPOINTS_ONCE_DIR set, each fires only once: a marker file in that folder records it,
so a retry of the same task runs through.

Fail points: after_plan (the batch is recorded, the plan task has not returned), before_read and
after_staging (Spark job), after_snapshot (an Iceberg sink's snapshot committed, the ledger's transaction not begun:
the critical window), commit_after_publish and commit_before_end (inside the commit transaction).
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

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger(__name__)


class FailPointSettings(BaseSettings):
    """The fail points' environment, KAFKA_LEDGER_<FIELD NAME>: for fault-injection tests, never a deployment
    (so not among settings.Settings, the deployment's settings)."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_LEDGER_", env_ignore_empty=True, frozen=True)

    failpoints: str = Field(default="", description="armed fail points, `name=action` separated by commas")
    failpoints_once_dir: Path | None = Field(
        default=None, description="a folder of marker files: with it, each fail point fires once")
    failpoints_pause_seconds: float = Field(default=15, description="how long the `pause` action waits at most")


# The variable that arms them (FailPointSettings.failpoints), in capitals.
ARMED_VARIABLE = "KAFKA_LEDGER_FAILPOINTS"


class FailPointError(RuntimeError):
    """Raised by a fail point armed with the `raise` action."""


def armed() -> dict[str, str]:
    """Fail point name -> action, as configured in the environment (read at every hit: a test arms them in its
    process's environment)."""
    if not os.environ.get(ARMED_VARIABLE):
        # Nothing armed, as in every deployment: one look at the variable. Reading the settings parses the whole
        # environment, which cost a carrier's cycle more CPU than its members' commits (6 hits a member).
        return {}
    result = {}
    for item in FailPointSettings().failpoints.split(","):
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
    settings = FailPointSettings()
    once_dir = settings.failpoints_once_dir
    if once_dir:
        marker = once_dir / name
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    log.warning("fail point %s fired: %s", name, action)
    if action == "pause":
        deadline = time.monotonic() + settings.failpoints_pause_seconds
        resume = once_dir / f"{name}.resume" if once_dir else None
        while time.monotonic() < deadline and not (resume and resume.exists()):
            time.sleep(0.05)
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise FailPointError(f"fail point {name} fired")
