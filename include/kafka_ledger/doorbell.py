"""The doorbell trigger's former home, kept for one release: Airflow stores a trigger's class path in its trigger
table, and the triggers of a deployment that ran an earlier release name `kafka_ledger.doorbell.DoorbellTrigger`."""

from kafka_ledger.airflow.doorbell import DoorbellTrigger

__all__ = ["DoorbellTrigger"]
