"""Where every produced record ended up, tallied from the output's and the dead letters' rows a chunk at a time in
arrays: the final check of a campaign of any size (at 60,000 records/s over a hundred million records, where one
Python tuple per row and a Counter of them would not fit in memory)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tools.fault_campaign.producer import BAD_EVERY

EXAMPLES = 5  # of each kind of problem, kept for the report


class Tally:
    """Fed the output's rows (`output`, in chunks of arrays) and the dead letters (`dead_letters`), against `landed`:
    per partition the sequence number at each offset, -1 where none landed (producer.Landed.partitions())."""

    def __init__(self, landed: dict[int, np.ndarray], reason: Callable[[int], str | None]):
        self.landed = landed
        self.reason = reason
        self.seen = {partition: np.zeros(len(seqs), dtype=np.int16) for partition, seqs in landed.items()}
        self.output_rows = self.dead_letter_rows = 0
        self.unexpected, self.wrong = 0, 0
        self.unexpected_examples: list[tuple[int, int]] = []
        self.wrong_examples: list[str] = []

    def _place(self, partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Each row's record's sequence number (-1: no record produced there, counted unexpected); counts it seen."""
        seqs = np.full(len(offsets), -1, dtype=np.int64)
        for partition in np.unique(partitions):
            landed = self.landed.get(int(partition))
            if landed is None:
                continue
            rows = np.flatnonzero(partitions == partition)
            where = offsets[rows]
            inside = (where >= 0) & (where < len(landed))
            seqs[rows[inside]] = landed[where[inside]]
            known = rows[seqs[rows] >= 0]
            np.add.at(self.seen[int(partition)], offsets[known], 1)
        missing = np.flatnonzero(seqs < 0)
        self.unexpected += len(missing)
        room = EXAMPLES - len(self.unexpected_examples)
        self.unexpected_examples += [(int(partitions[i]), int(offsets[i])) for i in missing[:room]]
        return seqs

    def _wrong(self, rows: Iterable[str]) -> None:
        for row in rows:
            self.wrong += 1
            if len(self.wrong_examples) < EXAMPLES:
                self.wrong_examples.append(row)

    def output(self, partitions: np.ndarray, offsets: np.ndarray, event_ids: np.ndarray, amounts: np.ndarray
               ) -> None:
        """A chunk of the output's rows: a good record's row holds its event id `s<seq>` and its amount `seq`; a bad
        record has no row."""
        self.output_rows += len(offsets)
        seqs = self._place(partitions, offsets)
        known = seqs >= 0
        expected_ids = np.char.add("s", seqs.astype(str))
        wrong = known & ((seqs % BAD_EVERY == 0) | (amounts != seqs) | (event_ids.astype(str) != expected_ids))
        self._wrong(f"{partitions[i]}/{offsets[i]}: row {event_ids[i]},{amounts[i]} for record {seqs[i]}"
                    for i in np.flatnonzero(wrong))

    def dead_letters(self, rows: Iterable[tuple[int, int, str]]) -> None:
        """The dead letters (partition, offset, error): a bad record's, with its reason."""
        rows = list(rows)
        self.dead_letter_rows += len(rows)
        if not rows:
            return
        seqs = self._place(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]))
        self._wrong(f"{p}/{o}: dead letter {error!r} for record {seq}"
                    for (p, o, error), seq in zip(rows, seqs, strict=True)
                    if seq >= 0 and self.reason(int(seq)) != error)

    def figures(self) -> dict[str, Any]:
        """records_produced, output_rows, dead_letters, lost, duplicated, unexpected, wrong_content; and examples of
        each problem (`examples`)."""
        lost, duplicated, examples = 0, 0, {"lost": [], "duplicated": [], "unexpected": self.unexpected_examples,
                                             "wrong": self.wrong_examples}
        for partition, seqs in self.landed.items():
            seen = self.seen[partition]
            for name, which in (("lost", (seqs >= 0) & (seen == 0)), ("duplicated", seen > 1)):
                offsets = np.flatnonzero(which)
                if name == "lost":
                    lost += len(offsets)
                else:
                    duplicated += len(offsets)
                room = EXAMPLES - len(examples[name])
                examples[name] += [(partition, int(o)) for o in offsets[:room]]
        return {"records_produced": int(sum(int((seqs >= 0).sum()) for seqs in self.landed.values())),
                "output_rows": self.output_rows, "dead_letters": self.dead_letter_rows, "lost": lost,
                "duplicated": duplicated, "unexpected": self.unexpected, "wrong_content": self.wrong,
                "examples": examples}
