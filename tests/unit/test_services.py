"""Services as values: the ledger database and Kafka in each client's form, secrets never shown, events observed."""

from __future__ import annotations

import logging

import pytest

from kafka_ledger.config.services import KafkaClient, LedgerDatabase, Services, SettingsError
from kafka_ledger.observe import events
from kafka_ledger.observe.observer import LogObserver, Observers, Recorder

SCRAM = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ingest",
         "sasl.password": "pa55"}


@pytest.mark.parametrize("url", ["postgresql://ledger:s3cr%2Ft@db:5432/ledger?sslmode=verify-full",
                                 "host=db dbname=ledger user=ledger password=s3cr/t sslmode=verify-full"])
def test_the_ledger_database_in_every_form_and_its_password_never_shown(url):
    db = LedgerDatabase(url)
    assert db.libpq() == url and db.password() == "s3cr/t"
    assert db.sqlalchemy().startswith("postgresql+psycopg2://") and "sslmode=verify-full" in db.sqlalchemy()
    jdbc = db.jdbc()
    assert jdbc.url.startswith("jdbc:postgresql://db:5432/ledger?sslmode=verify-full") and jdbc.password == "s3cr/t"
    assert "s3cr" not in str(db) and "s3cr" not in repr(db) and "***" in str(db) and "db" in str(db)
    assert "s3cr" not in repr(Services(db, KafkaClient("k:1")))


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:p@h/d?password=q&sslmode=require", "postgresql://u:***@h/d?password=***&sslmode=require"),
    ("postgresql://u@h/d", "postgresql://u@h/d"),
    ("host=h password='a b\\' c' user=u", "host=h password=*** user=u"),
    ("host=h user=u", "host=h user=u"),
])
def test_a_password_is_masked_wherever_the_connection_string_holds_it(url, shown):
    assert str(LedgerDatabase(url)) == shown


def test_an_unreadable_connection_string_is_a_clear_error():
    with pytest.raises(SettingsError, match="not a valid Postgres connection string"):
        LedgerDatabase("host='unterminated").jdbc()


def test_kafka_in_the_python_and_the_spark_client_forms_and_its_passwords_as_secrets():
    kafka = KafkaClient("k1:9094,k2:9094", SCRAM)
    assert kafka.confluent(**{"group.id": "g"}) == {"bootstrap.servers": "k1:9094,k2:9094", "log_level": 4, **SCRAM,
                                                    "group.id": "g"}
    spark = kafka.spark_options()
    assert spark["kafka.bootstrap.servers"] == "k1:9094,k2:9094" and spark["kafka.security.protocol"] == "SASL_SSL"
    assert 'password="pa55"' in spark["kafka.sasl.jaas.config"]
    assert "sasl.jaas.config=" in kafka.java_properties()
    assert kafka.secrets() == ["pa55"] and "pa55" not in str(kafka) and "pa55" not in repr(kafka)
    services = Services(LedgerDatabase("postgresql://u:pw@h/d"), kafka)
    assert services.secrets() == ["postgresql://u:pw@h/d", "pw", "pa55"]
    assert services.describe() == {"ledger": "postgresql://u:***@h/d", "kafka": "k1:9094,k2:9094"}


def test_events_reach_every_observer_and_one_that_fails_stops_none(caplog):
    class Broken:
        def notify(self, event: events.Event) -> None:
            raise RuntimeError("metrics endpoint down")

    recorder = Recorder()
    event = events.BatchFailed("p", 7, "boom")
    with caplog.at_level(logging.WARNING):
        Observers([Broken(), recorder]).notify(event)
    assert recorder.events == [event]
    assert "observer Broken failed on BatchFailed: metrics endpoint down" in caplog.text


def test_the_log_observer_says_what_happened_in_todays_words(caplog):
    observer = LogObserver()
    with caplog.at_level(logging.INFO, logger="kafka_ledger.events"):
        observer.notify(events.BatchPlanned("p", 3, "catch_up", False, 2, 150, 0, ("t-0 [0, 100)", "t-1 [0, 50)"),
                                            "exactly_once, cap 100 per partition"))
        observer.notify(events.AttemptStarted("p", 3, 1, 2, 150))
        observer.notify(events.BatchRead("p", 3, 1, 148, 2, 2, 0.5))
        observer.notify(events.BatchCommitted("p", 3, "catch_up", "public.t", 146, 2, 0, 2, 0.25, attempt=1,
                                              stages={"begin": 0.01, "commit": 0.2}, attempt_seconds=0.9))
        observer.notify(events.BatchCommitted("p", 4, "replay", "public.t", 10, 0, 10, None, 0.1))
        observer.notify(events.VerifyFinished("p", True, "incremental", 2, 150, 0, 1.5))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("planned batch 3 of p (exactly_once, cap 100 per partition): 2 partition(s), 150 offsets, 0 "
                        "offsets left for later batches:\n  t-0 [0, 100)\n  t-1 [0, 50)")
    assert lines[1] == "batch 3 of p, attempt 1: reading 2 range(s), 150 offsets"
    assert lines[2].startswith("batch 3 read: 148 records in 0.5s (296 records/s), 2 to dead letters, 2 offset gap")
    assert lines[3] == ("committed catch_up batch 3 of p: 146 rows into public.t (0 rows of earlier runs replaced), 2 "
                        "dead letters, 2 partition position(s) advanced in 0.25s")
    assert lines[4] == "batch 3 attempt 1 took 0.90 s: begin 0.01 s, commit 0.20 s"
    assert lines[5].endswith("positions unchanged in 0.10s")
    assert lines[6] == "verify p incremental: OK, 2 partition(s), 150 records compared, 0 problem(s), in 1.5 s"
