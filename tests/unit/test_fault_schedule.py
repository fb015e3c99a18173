"""The fault campaign's schedule and records: reproducible from the seed, every kind once per round."""

import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from fault_campaign import BAD_EVERY, FAULT_KINDS, expected_reason, fault_schedule, record_value  # noqa: E402


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
