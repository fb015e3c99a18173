"""The `connect` runtime: batches read on a warm Spark Connect server, committed by the task that reads them."""

# The runtime's name, as `spark_runtime` declares it.
CONNECT = "connect"
# The one task of a carrier's DAG (runtimes/connect/carrier.py).
CARRY_TASK = "carry_batches"
