"""The fault campaign's record-by-record final check, in arrays (tools/fault_campaign/tally.py), and the store of where
each record landed (producer.Landed) with its journal, which a resumed campaign reads back."""

from __future__ import annotations

import numpy as np

from tools.fault_campaign.producer import BAD_EVERY, Landed, append_journal, expected_reason, read_journal
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


def test_landed_takes_many_records_of_a_partition_at_once():
    landed = Landed({(0, 3): 9})
    landed.assign(0, np.array([0, 1, 3, 2000]), np.array([1, 2, 9, 40]))
    landed.assign(2, np.array([4]), np.array([41]))
    landed.assign(1, np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert dict(landed.items()) == {(0, 0): 1, (0, 1): 2, (0, 3): 9, (0, 2000): 40, (2, 4): 41}
    assert len(landed) == 5 and landed.max_seq == 41
    assert landed.counts() == {0: 4, 2: 1}
    assert landed.next_offsets() == {0: 2001, 2: 5}


def test_the_journal_reads_back_what_was_appended_but_a_line_cut_short(tmp_path):
    journal = tmp_path / "landed.tsv"
    assert len(read_journal(journal)) == 0  # no journal yet
    append_journal(journal, [(0, 0, 0), (1, 0, 1)])
    append_journal(journal, [(0, 1, 2), (1, 1, 13)])
    with journal.open("a") as out:
        out.write("0\t2\t1")  # the interruption came mid-line: Kafka has that record, the resume reads it there
    landed = read_journal(journal)
    assert dict(landed.items()) == {(0, 0): 0, (1, 0): 1, (0, 1): 2, (1, 1): 13}
    assert landed.next_offsets() == {0: 2, 1: 2}
    append_journal(journal, [(0, 2, 14)])  # what the resume read back from Kafka replaces the line cut short
    assert journal.read_text().endswith("1\t1\t13\n0\t2\t14\n")
    assert dict(read_journal(journal).items()) == {(0, 0): 0, (1, 0): 1, (0, 1): 2, (1, 1): 13, (0, 2): 14}


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
