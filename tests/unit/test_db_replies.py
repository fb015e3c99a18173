"""The ledger connection's bounded waits: the keepalives it adds, and only where the connection string is silent."""

from kafka_ledger.ledger import replies as db_replies


def test_keepalives_are_added_unless_the_connection_string_sets_them():
    assert db_replies.keepalives("postgresql://u@h:5432/db") == db_replies.KEEPALIVES
    own = db_replies.keepalives("postgresql://u@h:5432/db?keepalives_idle=5&keepalives=0")
    assert own == {"keepalives_interval": "10", "keepalives_count": "3"}
    assert db_replies.keepalives("host=h dbname=db keepalives_count=9")["keepalives_idle"] == "30"
    assert "keepalives_count" not in db_replies.keepalives("host=h dbname=db keepalives_count=9")
