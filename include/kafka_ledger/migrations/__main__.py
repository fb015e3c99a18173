"""Upgrade the ledger database to the newest schema: `python -m kafka_ledger.migrations`."""

from kafka_ledger.migrations import upgrade

if __name__ == "__main__":
    upgrade()
