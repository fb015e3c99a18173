"""The test records of the integration tests and of the fault campaign: the columns of their pipelines, and
bad records with the reason the dead-letter table must give for each (tests/integration/integration_support.py
hands them to the tests; tools/fault_campaign/producer.py writes them)."""

# The columns of every test pipeline (and of the fault campaign's).
COLUMNS = [
    {"name": "event_id", "type": "string", "required": True},
    {"name": "amount", "type": "long"},
    {"name": "price", "type": "double"},
    {"name": "ok", "type": "boolean"},
    {"name": "event_time", "type": "timestamp"},
]

# Bad records and the reason the dead-letter table must give for each.
BAD_VALUES: list[tuple[bytes | None, str]] = [
    (b'{"event_id": "x", "amount": 1', "malformed JSON (not a JSON object)"),
    (b'{"amount": 3}', "required field 'event_id' is missing or null"),
    (b'{"event_id": "y", "amount": "many"}', "field 'amount' is not a valid long"),
    (b"\xff\xfe{}", "value is not valid UTF-8"),
    (None, "null value (tombstone)"),
]
