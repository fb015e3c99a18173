"""The table of where a test run's time went (lane, file, seconds), from the lines scripts/test.sh collects.

Two kinds of line, one JSON object each: a lane's wall-clock time, `{"lane": ..., "wall": seconds}` (scripts/test.sh
times each of its steps), and one test's, `{"lane": ..., "file": ..., "test": ..., "seconds": ...}` (tests/conftest.py).
Lanes that run at once add up to more than the run's wall-clock time: the lane's own line says how long it took.

    python -m tools.test_times .stack/test-times.jsonl [--markdown]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> tuple[dict[str, float], dict[tuple[str, str], list[float]]]:
    """The lanes' wall-clock seconds, in the order they were written, and each (lane, file)'s tests' seconds."""
    walls: dict[str, float] = {}
    tests: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if "wall" in entry:
            walls[entry["lane"]] = entry["wall"]
        else:
            tests[entry["lane"], entry["file"]].append(entry["seconds"])
    return walls, tests


def table(walls: dict[str, float], tests: dict[tuple[str, str], list[float]], markdown: bool = False) -> str:
    """The lanes with their wall-clock time, then every (lane, file) with its tests' seconds, slowest first."""
    lanes = [(lane, "(the lane's wall clock)", "", f"{seconds:.0f}") for lane, seconds in walls.items()]
    files = sorted(tests.items(), key=lambda item: -sum(item[1]))
    rows = lanes + [(lane, file, str(len(times)), f"{sum(times):.0f}") for (lane, file), times in files]
    header = ("lane", "file", "tests", "seconds")
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|---|--:|--:|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(4)]
    return "\n".join(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]:>{widths[3]}}"
                     for row in [header, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.test_times", description=__doc__.splitlines()[0])
    parser.add_argument("times", type=Path, help="the lines scripts/test.sh collected (KL_TEST_TIMES)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (docs/testing.md carries one)")
    args = parser.parse_args(argv)
    if not args.times.exists():
        print(f"no test times in {args.times}")
        return 0
    print(table(*read(args.times), markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
