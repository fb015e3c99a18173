"""The local stack: its running services and their pids, as its supervisord reports them (scripts/stack.sh), and the
environment of another stack beside it (scripts/env.sh's KL_STACK_SLOT)."""

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


# Set by scripts/env.sh, yet the same for every stack of the clone: kept from the caller's environment.
_SHARED = ("PATH", "KL_HOME", "KL_VENV", "KL_CACHE")


def _env_sh(env: dict[str, str], script: str) -> str:
    return subprocess.run(["bash", "-c", f'. "{PROJECT_ROOT}/scripts/env.sh" && {script}'], env=env,
                          capture_output=True, text=True, check=True).stdout


def stack_environment(slot: int) -> dict[str, str]:
    """The caller's environment with stack `slot`'s settings (its own state, ports and secrets) in place of those
    of the caller's stack: scripts/env.sh made again without what it had set (which would win over the slot's
    defaults), all else kept (a proxy's certificates, JAVA_HOME)."""
    made = set(_env_sh({"PATH": os.environ.get("PATH", "")}, "compgen -e").split())
    kept = {name: value for name, value in os.environ.items() if name not in made or name in _SHARED}
    pairs = (entry.split("=", 1) for entry in _env_sh({**kept, "KL_STACK_SLOT": str(slot)}, "env -0").split("\0"))
    return {name: value for name, value in (pair for pair in pairs if len(pair) == 2)
            if name not in ("PWD", "SHLVL", "_", "OLDPWD")}


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.stack run N command...`: a command in stack N's own environment (scripts/test.sh brings
    stacks 1 and 2 up with it: `python -m tools.stack run 1 bash scripts/stack.sh up`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.stack", description=main.__doc__)
    parser.add_argument("action", choices=["run"])
    parser.add_argument("slot", type=int, help="the stack (KL_STACK_SLOT): 0 is the usual one")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("no command to run")
    return subprocess.run(args.command, env=stack_environment(args.slot), check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
