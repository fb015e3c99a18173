-- Run once by the postgres image on an empty data volume (docker-entrypoint-initdb.d), as the superuser.
-- The same roles and databases as the local stack (scripts/stack.sh create_databases). The passwords come
-- from the container's environment, which docker-compose.yaml requires, read with psql's \getenv.
\getenv ledger_password KAFKA_LEDGER_DB_PASSWORD
\getenv airflow_password KAFKA_LEDGER_AIRFLOW_DB_PASSWORD
CREATE ROLE kafka_ledger LOGIN PASSWORD :'ledger_password';
CREATE DATABASE kafka_ledger OWNER kafka_ledger;
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;

-- The ledger's exclusion constraint needs btree_gist (a contrib extension shipped in the image). Its
-- migration creates it too; creating it here as the superuser also covers servers where it is not trusted.
\connect kafka_ledger
CREATE EXTENSION IF NOT EXISTS btree_gist;
