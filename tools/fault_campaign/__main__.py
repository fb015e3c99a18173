"""Runs the campaign's command line: `python -m tools.fault_campaign` from the project root (as
scripts/fault_campaign.sh does), or `python tools/fault_campaign` by path from anywhere (as each task process
is started)."""

import sys
from pathlib import Path

if not __package__:  # run by path: import from the project root, not from this folder
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from tools.fault_campaign.main import main  # noqa: E402

if __name__ == "__main__":  # not when multiprocessing's forkserver prepares its children from this main module
    sys.exit(main())
