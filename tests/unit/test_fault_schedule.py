"""The fault campaign's pure parts: a schedule reproducible from the seed, its records, and its report."""

import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from fault_campaign import (  # noqa: E402
    BAD_EVERY,
    FAULT_KINDS,
    expected_reason,
    fault_schedule,
    record_value,
    render_report,
)


def test_the_same_seed_gives_the_same_schedule():
    assert fault_schedule(50, random.Random(7)) == fault_schedule(50, random.Random(7))
    assert fault_schedule(50, random.Random(7)) != fault_schedule(50, random.Random(8))


def test_every_kind_appears_once_per_round():
    schedule = fault_schedule(200, random.Random(20261121))
    assert len(schedule) == 200
    rounds = len(FAULT_KINDS)
    for start in range(0, 200 - rounds + 1, rounds):
        assert sorted(schedule[start:start + rounds]) == sorted(FAULT_KINDS)
    assert Counter(schedule) == dict.fromkeys(FAULT_KINDS, 25)


def test_a_short_schedule_still_has_every_kind_once():
    assert sorted(fault_schedule(len(FAULT_KINDS), random.Random(4))) == sorted(FAULT_KINDS)


def test_records_carry_their_sequence_number_and_bad_ones_their_reason():
    assert b'"event_id": "s7"' in record_value(7) and expected_reason(7) is None
    bad = [seq for seq in range(1000) if expected_reason(seq) is not None]
    assert bad == list(range(0, 1000, BAD_EVERY))
    assert len({expected_reason(seq) for seq in bad}) == 5  # every kind of bad record


def report_data(faults: int, records: int) -> dict:
    return {
        "command": "bash scripts/fault_campaign.sh --faults 200", "git_commit": "abc1234",
        "started_at": "2026-11-21T16:00:00+00:00", "elapsed_seconds": 9000.0,
        "faults_injected": faults, "records_produced": records, "output_rows": records - records // 50,
        "dead_letters": records // 50, "lost": 0, "duplicated": 0, "unexpected": 0, "wrong_content": 0,
        "verify_ok": True, "pipeline_runs": 260, "spark_submits": 330,
        "faults_by_kind": {"kill_commit": faults}, "fault_variants": {"kill_commit": {"commit_before_end": faults}},
        "fault_landings": {"kill_commit": {"commit task died at commit_before_end=kill": faults}},
    }


def test_the_report_shows_the_figures_and_flags_a_short_campaign():
    iterations = [{"fault": "kill_commit", "recovered_by": "task retry (commit)"}] * 3
    short = render_report(report_data(3, 15_000), iterations)
    assert "**This is not the full campaign**" in short
    assert "| **lost** | **0** |" in short and "| **duplicated** | **0** |" in short
    assert "| `kill_commit` | 3 | commit_before_end: 3 |" in short and "task retry (commit): 3" in short
    assert "bash scripts/fault_campaign.sh --faults 200" in short
    full = render_report(report_data(200, 1_000_000), iterations)
    assert "not the full campaign" not in full
    assert "| records produced | 1,000,000 |" in full and "took 2 h 30 min" in full
