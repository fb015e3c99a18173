"""Attempt fencing: only a batch's newest attempt, while the batch is open, may stage or publish it."""

from datetime import UTC, datetime

import pytest

from kafka_ledger.ledger.db import AttemptFenced, Batch, LedgerError, check_newest_attempt

NOW = datetime(2026, 11, 27, tzinfo=UTC)


def batch(status: str, attempts: int) -> Batch:
    return Batch(12, "clicks", status, attempts, None, None, None, NOW)


def test_the_newest_attempt_of_an_open_batch_goes_on():
    open_batch = batch("planned", 2)
    assert check_newest_attempt(open_batch, 2, "publish") is open_batch


def test_an_older_attempt_is_fenced_saying_a_newer_one_carries_the_batch():
    with pytest.raises(AttemptFenced) as fenced:
        check_newest_attempt(batch("planned", 3), 2, "be marked written")
    message = str(fenced.value)
    assert message.startswith("batch 12 attempt 2 is fenced and may not be marked written: attempt 3 of the same "
                              "batch began after it (a second driver or task for this batch")
    assert "Nothing of this attempt was published" in message
    assert isinstance(fenced.value, LedgerError) and (fenced.value.batch_id, fenced.value.attempt) == (12, 2)


def test_the_newest_attempt_of_a_closed_batch_is_fenced_by_the_batchs_status():
    with pytest.raises(AttemptFenced, match="batch 12 attempt 2 is fenced and may not publish: the batch is abandoned"):
        check_newest_attempt(batch("abandoned", 2), 2, "publish")
