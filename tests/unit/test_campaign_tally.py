"""The fault campaign's record-by-record final check, in arrays (tools/fault_campaign/tally.py), and the store of where
each record landed (producer.Landed)."""

from __future__ import annotations

import numpy as np

from tools.fault_campaign.producer import BAD_EVERY, Landed, expected_reason
from tools.fault_campaign.tally import Tally


def landed_round_robin(records: int, partitions: int) -> Landed:
    landed = Landed()
    for seq in range(records):
        landed[seq % partitions, seq // partitions] = seq
    return landed


def rows_of(landed: Landed) -> tuple[list[tuple[int, int, str, int]], list[tuple[int, int, str]]]:
    """The rows a correct pipeline publishes: a row per good record, a dead letter per bad one."""
    output, dead = [], []
    for (partition, offset), seq in landed.items():
        if seq % BAD_EVERY == 0:
            dead.append((partition, offset, expected_reason(seq)))
        else:
            output.append((partition, offset, f"s{seq}", seq))
    return output, dead


def tally(landed: Landed, output: list[tuple[int, int, str, int]], dead: list[tuple[int, int, str]],
          chunk: int = 7) -> dict:
    check = Tally(landed.partitions(), expected_reason)
    for start in range(0, len(output), chunk):
        part = output[start:start + chunk]
        check.output(np.array([r[0] for r in part]), np.array([r[1] for r in part]),
                     np.array([r[2] for r in part], dtype=object), np.array([r[3] for r in part]))
    check.dead_letters(dead)
    return check.figures()


def test_landed_reads_as_the_dict_it_replaces():
    landed = Landed({(0, 0): 0, (1, 0): 1})
    landed[0, 5000] = 7
    landed[1, 0] = 1  # the same record again counts once
    assert len(landed) == 3 and landed.max_seq == 7
    assert landed[0, 5000] == 7 and landed.get((0, 1)) is None and (0, 1) not in landed and (1, 0) in landed
    assert dict(landed.items()) == {(0, 0): 0, (1, 0): 1, (0, 5000): 7}
    assert sorted(landed) == [(0, 0), (0, 5000), (1, 0)]
    assert [len(seqs) for _, seqs in sorted(landed.partitions().items())] == [5001, 1]


def test_a_correct_output_tallies_clean():
    landed = landed_round_robin(500, 3)
    output, dead = rows_of(landed)
    figures = tally(landed, output, dead)
    assert {k: v for k, v in figures.items() if k != "examples"} == {
        "records_produced": 500, "output_rows": 490, "dead_letters": 10, "lost": 0, "duplicated": 0, "unexpected": 0,
        "wrong_content": 0}


def test_lost_doubled_unexpected_and_wrong_records_are_each_counted_with_examples():
    landed = landed_round_robin(500, 3)
    output, dead = rows_of(landed)
    lost = output.pop(10)
    doubled = output[20]
    output.append(doubled)
    output.append((2, 900, "s999", 999))  # no record was produced there
    output.append((7, 0, "s0", 0))  # nor in a partition the topic never had
    p, o, _, seq = output[30]
    output[30] = (p, o, f"s{seq}", seq + 1)  # a wrong amount
    dp, do, _ = dead[0]
    dead[0] = (dp, do, "another reason")
    figures = tally(landed, output, dead)
    assert (figures["lost"], figures["duplicated"], figures["unexpected"], figures["wrong_content"]) == (1, 1, 2, 2)
    examples = figures["examples"]
    assert examples["lost"] == [lost[:2]] and examples["duplicated"] == [doubled[:2]]
    assert examples["unexpected"] == [(2, 900), (7, 0)]
    assert any("another reason" in w for w in examples["wrong"])


def test_a_bad_records_row_in_the_output_is_wrong():
    landed = landed_round_robin(100, 2)
    output, dead = rows_of(landed)
    p, o, _ = dead.pop()
    seq = landed[p, o]
    output.append((p, o, f"s{seq}", seq))
    figures = tally(landed, output, dead)
    assert figures["wrong_content"] == 1 and figures["lost"] == 0
