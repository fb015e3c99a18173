# The production shape's clients, for `--secure` of scripts/demo.sh and scripts/fault_campaign.sh: source it after
# env.sh. Every Kafka client goes over the broker's SASL_SSL listener (SCRAM-SHA-512, the stack's CA), once the
# ledger's URL is checked to verify Postgres's certificate (sslmode=verify-full, the local stack's default).
python - <<'PY' || return 1
import os, sys
from kafka_ledger.config.services import libpq_settings
if libpq_settings(os.environ["KAFKA_LEDGER_DB_URL"]).get("sslmode") != "verify-full":
    sys.exit("--secure: KAFKA_LEDGER_DB_URL does not say sslmode=verify-full")
PY
export KAFKA_LEDGER_BOOTSTRAP_SERVERS=127.0.0.1:$KL_KAFKA_SASL_PORT
KAFKA_LEDGER_KAFKA_CONFIG=$(python -c 'import json, os; print(json.dumps({
    "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": os.environ["KL_KAFKA_SASL_USER"],
    "sasl.password": os.environ["KL_KAFKA_SASL_PASSWORD"], "ssl.ca.location": os.environ["KL_TLS_DIR"] + "/ca.pem"}))')
export KAFKA_LEDGER_KAFKA_CONFIG
