"""Spark's Python daemon with the libraries of kafka-ledger's Python tasks loaded before it forks their workers.

Spark starts a Python worker for a task by forking its daemon, and stops a worker idle for a minute (hard-coded in
Spark 4.0): each batch after a pause began by importing pyarrow and pandas again in every new worker, about 0.25 s
apiece (a wide read's two tasks: half its time to the first rows at 1,000 partitions). Forked from this daemon, a
worker has them already. The stack's Spark processes use it (`spark.python.daemon.module`); nothing else needs it.
"""

import confluent_kafka  # noqa: F401 - imported for the workers forked from here
import pandas  # noqa: F401
import pyarrow  # noqa: F401
from pyspark import daemon

if __name__ == "__main__":
    daemon.manager()
