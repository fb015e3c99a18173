"""kafka-ledger: exactly-once Kafka ingestion in bounded batches with an offset ledger in Postgres."""
