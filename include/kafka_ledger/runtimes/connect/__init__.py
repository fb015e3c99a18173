"""The `connect` runtime: batches read on a warm Spark Connect server, committed by the task that reads them."""

# The runtime's name, as `spark_runtime` declares it.
CONNECT = "connect"
# The tasks of a carrier's DAG (runtimes/connect/carrier.py): the carrying one, and the one failing for its members.
CARRY_TASK = "carry_batches"
CHECK_MEMBERS_TASK = "check_members"
