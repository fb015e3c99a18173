"""Upgrade the ledger database to the newest schema: `python -m kafka_ledger.ledger.migrations`."""

from kafka_ledger.ledger.migrations import upgrade

if __name__ == "__main__":
    upgrade()
