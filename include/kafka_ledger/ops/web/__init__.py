"""The Kafka Ledger page in Airflow: a FastAPI app (app.py) with server-drawn charts and Jinja templates."""
