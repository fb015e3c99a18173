"""airflow."""
