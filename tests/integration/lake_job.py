"""A spark-submit job of the lake test: appends offsets [from, until) of partition 2 to an Iceberg table, stamped."""

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

table, first, until, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
spark = SparkSession.builder.appName("kafka-ledger-lake-test").getOrCreate()
rows = spark.range(first, until).select(F.lit("t").alias("kafka_topic"), F.lit(2).alias("kafka_partition"),
                                        F.col("id").alias("kafka_offset"))
rows.writeTo(table).option("snapshot-property.kl.batch-id", batch).append()
spark.stop()
